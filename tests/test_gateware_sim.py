"""cocotb simulations of the aggregator on Icarus Verilog and Verilator, at data widths 8 and 64 bytes.

Each (simulator, width) is built once; all cocotb tests in tb/aggregator run against that build. The
pytest case fails when any cocotb test fails or when the simulation produces no results.
"""

import ast
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from inwire.model import AggregatorConfig
from traffic import GATEWARE_CONFIG

pytestmark = pytest.mark.sim

TOOLS = {"icarus": "iverilog", "verilator": "verilator"}
SUITE_CONFIG = GATEWARE_CONFIG
"""The cocotb suite's gateware holds job tables and takes unregistered frames too: one build runs both, and
the traffic table's."""


def cocotb_test_names(module_path):
    """The functions a cocotb test module marks with `@cocotb.test()`, read from its source."""
    tree = ast.parse(module_path.read_text())
    return {node.name for node in tree.body if isinstance(node, ast.AsyncFunctionDef)
            and any(ast.unparse(decorator).startswith("cocotb.test") for decorator in node.decorator_list)}


@pytest.mark.parametrize("width", [8, 64])
@pytest.mark.parametrize("simulator", ["icarus", "verilator"])
def test_cocotb_suite(simulator, width):
    if shutil.which(TOOLS[simulator]) is None:
        pytest.fail(f"{TOOLS[simulator]} is not on PATH (run `make setup`)")
    from inwire_hdl import sim

    runner, build_dir = sim.build(simulator, width, SUITE_CONFIG)
    outcome = sim.run(runner, build_dir, SUITE_CONFIG)
    failed = sorted(name for name, passed in outcome.items() if not passed)
    expected = cocotb_test_names(Path(__file__).resolve().parents[1] / "tb" / "aggregator" / "test_aggregator.py")
    assert set(outcome) == expected, (
        f"cocotb tests that did not run: {sorted(expected - set(outcome))}; unknown: {sorted(set(outcome) - expected)}")
    assert not failed, f"cocotb tests failed on {simulator} at width {width}: {failed} (see {build_dir})"


@pytest.mark.parametrize("width", [8, 64])
def test_verilog_command_output_lints(tmp_path, width):
    """`inwire verilog` writes inwire_aggregator; `verilator --lint-only` accepts it (warnings not fatal)."""
    if shutil.which("verilator") is None:
        pytest.fail("verilator is not on PATH (run `make setup`)")
    target = tmp_path / "agg.v"
    result = subprocess.run([sys.executable, "-m", "inwire.cli", "verilog", "--width", str(width),
                             "--slots", "8", "--elements", "64", "--max-fanin", "16", "-o", str(target)],
                            capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    assert "module inwire_aggregator(" in target.read_text()
    lint = subprocess.run(["verilator", "--lint-only", "-Wno-fatal", "--top-module", "inwire_aggregator",
                           str(target)], capture_output=True, text=True, check=False)
    assert lint.returncode == 0, lint.stderr[-2000:]


@pytest.mark.parametrize(("option", "message"), [
    (["--max-fanin", "65"], "--max-fanin must lie in [1, 64], got 65"),
    (["--upstream", "10.73.87.1/24"], "--upstream '10.73.87.1/24': 10.73.87.1/24 has host bits set"),
])
def test_verilog_command_rejects_bad_parameters(tmp_path, option, message):
    result = subprocess.run([sys.executable, "-m", "inwire.cli", "verilog", *option,
                             "-o", str(tmp_path / "agg.v")], capture_output=True, text=True, check=False)
    assert result.returncode == 2
    assert message in result.stderr and "Traceback" not in result.stderr


def test_verilog_command_takes_the_upstream_prefix(tmp_path):
    """--upstream reaches the gateware: the route check compares hop1 with another network."""
    texts = []
    for option in ([], ["--upstream", "10.0.1.0/24"]):
        target = tmp_path / f"agg{len(texts)}.v"
        result = subprocess.run([sys.executable, "-m", "inwire.cli", "verilog", "--slots", "2", "--elements", "4",
                                 *option, "-o", str(target)], capture_output=True, text=True, check=False)
        assert result.returncode == 0, result.stderr
        texts.append(target.read_text())
    assert texts[0] != texts[1]


def test_replay_command_round_trip(tmp_path):
    """`inwire replay` through the argparse subcommand: pcap in, pcap out, counters as JSON."""
    if shutil.which("iverilog") is None:
        pytest.fail("iverilog is not on PATH (run `make setup`)")
    from inwire.model import Aggregator as Model
    from inwire.pcap import read_frames, write_frames
    from inwire_hdl.cocotb.traffic import Traffic

    traffic = Traffic(AggregatorConfig(), seed=21)
    frames = traffic.clique(10, fanin=2, slot=1) + traffic.foreign()[:3] + [bytes(40)]
    source = tmp_path / "in.pcap"
    write_frames(source, frames)
    result = subprocess.run([sys.executable, "-m", "inwire.cli", "replay", "--width", "64", str(source),
                             str(tmp_path / "out.pcap")], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    model = Model(AggregatorConfig())
    expected = [out for frame in frames for out in model.process(frame)]
    assert read_frames(tmp_path / "out.pcap") == expected
    assert json.loads(result.stdout) == model.stats()
    assert f"out.pcap equals the golden model's output ({len(expected)} frames)" in result.stderr


def test_replay_rejects_unreadable_pcap(tmp_path):
    bad = tmp_path / "bad.pcap"
    bad.write_bytes(b"not a capture")
    result = subprocess.run([sys.executable, "-m", "inwire.cli", "replay", str(bad),
                             str(tmp_path / "out.pcap")], capture_output=True, text=True, check=False)
    assert result.returncode == 2
    assert result.stderr.startswith("inwire replay: ") and "Traceback" not in result.stderr


def timed_wedge(config):
    """A clique abandoned after two of three members, other jobs' claims before and after its lease ran out,
    then both cliques to completion: (frames, arrival times in lease ticks)."""
    from inwire_hdl.cocotb.traffic import Traffic

    traffic = Traffic(config, seed=22)
    abandoned = traffic.clique(6, fanin=3, slot=2, job=40, round=1)
    stranger = traffic.clique(6, fanin=2, slot=2, job=41, round=1)
    lease = config.lease
    timed = [(abandoned[0], 0), (abandoned[1], 3), (stranger[0], 3 + lease - 1), (stranger[0], 3 + lease),
             (abandoned[2], 3 + lease), (stranger[1], 4 + lease), *((frame, 4 + lease) for frame in abandoned)]
    return [frame for frame, _ in timed], [now for _, now in timed]


def test_replay_and_cosimulation_take_arrival_times():
    """The replay and co-simulation drivers drive the lease ticks between frames: the gateware then frees
    the abandoned slot exactly when the model, given the same times, does."""
    if shutil.which("iverilog") is None:
        pytest.fail("iverilog is not on PATH (run `make setup`)")
    from inwire.model import Aggregator as Model
    from inwire_hdl import sim
    from inwire_hdl.cosim import CoSimulation

    config = AggregatorConfig(slots=4, max_elements=16, lease=6)
    frames, times = timed_wedge(config)
    model = Model(config)
    expected = [model.process(frame, now) for frame, now in zip(frames, times, strict=True)]
    assert model.stats()["leases_expired"] == 1 and model.stats()["drop_collision"] == 2
    outputs, counters = sim.replay(frames, "icarus", 8, config, times=times)
    assert outputs == [out for answer in expected for out in answer] and counters == model.stats()
    gateware = CoSimulation("icarus", 8, config)
    try:
        assert [gateware.process(frame, now) for frame, now in zip(frames, times, strict=True)] == expected
        assert gateware.stats() == model.stats()
    finally:
        gateware.close()


def test_cosimulation_takes_the_upstream_prefix():
    """The co-simulation builds the gateware with the configuration's upstream prefix: with 10.0.1.0/24 a
    partial goes to an address there and not to one in the /24 of the aggregator's own address."""
    if shutil.which("iverilog") is None:
        pytest.fail("iverilog is not on PATH (run `make setup`)")
    from inwire.model import Aggregator as Model
    from inwire_hdl.cocotb.traffic import ABOVE_IP, OUTSIDE_IP, Traffic
    from inwire_hdl.cosim import CoSimulation

    config = AggregatorConfig(slots=2, max_elements=4, upstream=(OUTSIDE_IP & ~0xFF, 24))
    traffic = Traffic(config, seed=23)
    frames = [traffic.contribution(traffic.elements(3), slot=slot, hop1=hop1)
              for slot, hop1 in ((0, OUTSIDE_IP), (1, ABOVE_IP))]
    model = Model(config)
    expected = [model.process(frame) for frame in frames]
    assert [len(answer) for answer in expected] == [1, 0] and model.stats()["drop_route"] == 1
    gateware = CoSimulation("icarus", 8, config)
    try:
        assert [gateware.process(frame) for frame in frames] == expected
        assert gateware.stats() == model.stats()
    finally:
        gateware.close()
