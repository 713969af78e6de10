"""The simulated gateware is built once per configuration and toolchain, in a cache every working directory
shares (`inwire_hdl.sim.build`): `inwire run`, then the README's tour in its own folder, then `inwire run`
again build each gateware once. Icarus builds in seconds; Verilator's build goes through the same code."""

import os
import shutil

import numpy as np
import pytest

from inwire.model import Aggregator, AggregatorConfig
from inwire.packets import build_frames

pytestmark = pytest.mark.sim

SMALL = AggregatorConfig(slots=2, max_elements=4)
WIDTH = 8


@pytest.fixture
def builds(tmp_path, monkeypatch):
    """A private cache; every compile the simulator's runner is asked for, counted by its build folder."""
    if shutil.which("iverilog") is None:
        pytest.skip("needs Icarus Verilog (make setup)")
    from cocotb_tools.runner import Icarus

    monkeypatch.setenv("INWIRE_SIM_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("INWIRE_SIM_CACHE_BUILDS", raising=False)
    compiled = []
    original = Icarus.build

    def counted(runner, *args, **kwargs):
        compiled.append(kwargs["build_dir"])
        return original(runner, *args, **kwargs)

    monkeypatch.setattr(Icarus, "build", counted)
    return compiled


def cache_entries(tmp_path):
    return sorted(path.name for path in (tmp_path / "cache").iterdir())


def test_the_same_gateware_from_another_folder_reuses_the_build_and_runs(builds, tmp_path, monkeypatch):
    from inwire_hdl import sim

    for folder in ("checkout", "tour"):
        (tmp_path / folder).mkdir()
        monkeypatch.chdir(tmp_path / folder)
        runner, run_dir = sim.build("icarus", WIDTH, SMALL)
        assert run_dir == tmp_path / folder / "build" / "sim" / run_dir.name
    assert len(builds) == 1
    (entry,) = cache_entries(tmp_path)
    assert runner.build_dir == tmp_path / "cache" / entry
    # The reused build runs: a clique of two through it gives the golden model's result.
    frames = build_frames(np.array([[1, -2], [3, 4]]), ip_dst=SMALL.ip, fanin=2, sender=[0, 1], group=0xEF000001)
    outputs, counters = sim.replay([bytes(frame) for frame in frames], "icarus", WIDTH, SMALL)
    model = Aggregator(SMALL)
    assert outputs == [out for frame in frames for out in model.process(bytes(frame))]
    assert counters["results_emitted"] == 1
    assert len(builds) == 1 and (tmp_path / "tour" / "build" / "sim" / run_dir.name / "replay.log").exists()


def test_a_changed_configuration_builds_afresh(builds, tmp_path, monkeypatch):
    from inwire_hdl import sim

    monkeypatch.chdir(tmp_path)
    sim.build("icarus", WIDTH, SMALL)
    sim.build("icarus", WIDTH, AggregatorConfig(slots=3, max_elements=4))
    sim.build("icarus", WIDTH, SMALL)
    assert len(builds) == 2 and len(cache_entries(tmp_path)) == 2


def test_a_build_another_run_finished_first_is_kept_whole(builds, tmp_path, monkeypatch):
    """Two runs building one gateware at once: each builds in a folder of its own; the first to finish puts
    its build in place, the other's is discarded, and both run the one in place."""
    from cocotb_tools.runner import Icarus

    from inwire_hdl import sim

    monkeypatch.chdir(tmp_path)
    counted = Icarus.build
    results, started = [], []

    def racing(runner, *args, **kwargs):
        if not started:
            started.append(runner)
            results.append(sim.build("icarus", WIDTH, SMALL))  # the other run, finishing while this one builds
        return counted(runner, *args, **kwargs)

    monkeypatch.setattr(Icarus, "build", racing)
    runner, _ = sim.build("icarus", WIDTH, SMALL)
    assert len(builds) == 2
    (entry,) = cache_entries(tmp_path)
    assert runner.build_dir == results[0][0].build_dir == tmp_path / "cache" / entry
    assert (runner.build_dir / "sim.vvp").exists() and (runner.build_dir / "key.json").exists()


def test_a_failed_build_leaves_nothing_in_the_cache_and_keeps_its_log(builds, tmp_path, monkeypatch):
    from cocotb_tools.runner import Icarus

    from inwire_hdl import sim

    monkeypatch.chdir(tmp_path)

    def failing(runner, *args, **kwargs):
        (kwargs["build_dir"] / "build.log").write_text("syntax error\n")
        raise SystemExit(1)

    monkeypatch.setattr(Icarus, "build", failing)
    with pytest.raises(sim.SimulationError, match=r"icarus build failed, see .*build/sim/icarus_w8_\w+/build.log"):
        sim.build("icarus", WIDTH, SMALL)
    assert cache_entries(tmp_path) == []
    (log,) = (tmp_path / "build" / "sim").glob("*/build.log")
    assert log.read_text() == "syntax error\n"


def test_the_cache_keeps_the_most_recently_used_builds_and_drops_older_ones(builds, tmp_path, monkeypatch):
    """Bounded: with room for two, a third configuration drops the least recently used build (A, used before
    B was used again), which is then built afresh when asked for."""
    from inwire_hdl import sim

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("INWIRE_SIM_CACHE_BUILDS", "2")
    configs = {name: AggregatorConfig(slots=slots, max_elements=4) for name, slots in (("A", 2), ("B", 3), ("C", 4))}
    runners = {name: sim.build("icarus", WIDTH, configs[name])[0] for name in ("A", "B")}
    # Reuse marks the time of use; make B's the later one whatever the file system's time resolution.
    os.utime(runners["A"].build_dir / "key.json", (1, 1))
    sim.build("icarus", WIDTH, configs["B"])
    sim.build("icarus", WIDTH, configs["C"])
    assert len(builds) == 3 and len(cache_entries(tmp_path)) == 2
    assert not runners["A"].build_dir.exists() and runners["B"].build_dir.exists()
    sim.build("icarus", WIDTH, configs["A"])
    assert len(builds) == 4 and len(cache_entries(tmp_path)) == 2


@pytest.mark.parametrize("value", ["0", "-1", "1_0", "many"])
def test_a_bad_cache_size_is_refused_in_one_line(builds, tmp_path, monkeypatch, value):
    from inwire_hdl import sim

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("INWIRE_SIM_CACHE_BUILDS", value)
    message = f"INWIRE_SIM_CACHE_BUILDS must be a whole number from 1, got '{value}'"
    with pytest.raises(sim.SimulationError, match=message):
        sim.build("icarus", WIDTH, SMALL)
    assert builds == []
