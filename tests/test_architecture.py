"""The shape of the code: no import cycles, commands that load only what they use, one base class of
errors, a typed public API, an installed package that works without the checkout, and no sys.path edits.

The import graph is read with `ast` from sw/inwire and hdl/inwire_hdl. Module-level imports are the edges
that run at import time (statements at the top of a module, also inside a module-level `if`, `try` or
class body; an `if __name__ == "__main__":` block is left out): a cycle of those fails or half-initializes
a module. An import inside a function runs on call, so it can hide a cycle without removing it: the
second graph counts those too. Importing `a.b.c` also runs the packages `a` and `a.b`, so a module depends
on its parent packages too.
"""

import ast
import importlib.util
import inspect
import json
import os
import subprocess
import sys
import typing
import venv
from pathlib import Path

import numpy as np
import pytest

from inwire.errors import InwireError
from inwire.model import Aggregator, AggregatorConfig
from inwire.packets import build_frames
from inwire.pcap import write_frames

ROOT = Path(__file__).resolve().parents[1]
PACKAGE_ROOTS = (ROOT / "sw", ROOT / "hdl")
HEAVY = ("amaranth", "torch", "matplotlib", "networkx")
"""What `inwire --help` and `inwire decode` must not import."""


def package_modules(roots=PACKAGE_ROOTS):
    """{dotted module name: path} for every module of the packages under `roots`."""
    modules = {}
    for root in roots:
        for path in sorted(root.rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    return modules


def _is_main_guard(node):
    test = node.test if isinstance(node, ast.If) else None
    return (isinstance(test, ast.Compare) and isinstance(test.left, ast.Name) and test.left.id == "__name__"
            and any(isinstance(c, ast.Constant) and c.value == "__main__" for c in test.comparators))


def module_level_imports(tree):
    """Import statements that run when the module is imported (not inside functions or a __main__ guard)."""
    pending = list(tree.body)
    while pending:
        node = pending.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or _is_main_guard(node):
            continue
        elif isinstance(node, (ast.If, ast.Try, ast.With, ast.ClassDef, ast.For, ast.While)):
            for field in ("body", "orelse", "finalbody", "handlers"):
                pending.extend(getattr(node, field, []))
        elif isinstance(node, ast.ExceptHandler):
            pending.extend(node.body)


def every_import(tree):
    """Every import statement of the module, those inside functions included."""
    return (node for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom)))


def import_graph(modules, imports=module_level_imports):
    """{module: set of modules of `modules` it imports (the statements `imports` yields)}, parent packages
    included."""
    graph = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges = set()
        for node in imports(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                    base = ".".join(anchor + ([base] if base else []))
                targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                           for alias in node.names]
            for target in targets:
                parts = target.split(".")
                edges |= {".".join(parts[:i]) for i in range(1, len(parts) + 1)} & modules.keys()
        graph[name] = edges - {name}
    return graph


def find_cycles(graph):
    """Strongly connected components with more than one module (Tarjan), each as a sorted list."""
    index, low, stack, on_stack, cycles = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for successor in graph.get(node, ()):
            if successor not in index:
                visit(successor)
                low[node] = min(low[node], low[successor])
            elif successor in on_stack:
                low[node] = min(low[node], index[successor])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return cycles


def test_cycle_finder_finds_a_cycle_and_nothing_else():
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert find_cycles({"a": {"b"}, "b": set(), "c": {"a", "b"}}) == []


def test_graph_reads_relative_imports_and_leaves_function_imports_out(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from . import b\n\ndef later():\n    from . import c\n")
    (package / "b.py").write_text("from .a import later\n")
    (package / "c.py").write_text("if __name__ == '__main__':\n    import pkg.a\n")
    graph = import_graph(package_modules([tmp_path]))
    assert graph == {"pkg": set(), "pkg.a": {"pkg", "pkg.b"}, "pkg.b": {"pkg", "pkg.a"}, "pkg.c": set()}
    assert find_cycles(graph) == [["pkg.a", "pkg.b"]]
    assert import_graph(package_modules([tmp_path]), every_import)["pkg.a"] == {"pkg", "pkg.b", "pkg.c"}


def test_no_import_cycles_in_the_packages():
    modules = package_modules()
    assert {"inwire.cli", "inwire.datagram", "inwire_hdl.sim", "inwire_hdl.cocotb.replay"} <= modules.keys()
    assert find_cycles(import_graph(modules)) == []


def test_no_import_cycle_hides_behind_an_import_inside_a_function():
    assert find_cycles(import_graph(package_modules(), every_import)) == []


def error_classes(modules):
    """(module, class name) of every public class of `modules` named ...Error or built on one."""
    found = []
    for name, path in modules.items():
        for node in ast.parse(path.read_text(), str(path)).body:
            bases = [base.attr if isinstance(base, ast.Attribute) else getattr(base, "id", "") for base in node.bases] \
                if isinstance(node, ast.ClassDef) else []
            if bases and not node.name.startswith("_") and (
                    node.name.endswith("Error") or any(base.endswith(("Error", "Exception")) for base in bases)):
                found.append((name, node.name))
    return found


def test_every_public_error_class_derives_from_inwire_error():
    classes = error_classes(package_modules())
    assert {"ScheduleError", "TopologyError", "AveragingError", "DistributedRunError", "SimulationError"} <= {
        name for _, name in classes}
    outside = [f"{module}.{name}" for module, name in classes
               if not issubclass(getattr(importlib.import_module(module), name), InwireError)]
    assert outside == []


def _public_callables():
    """The functions and methods of the public API whose every parameter and return must be annotated."""
    from inwire import client, model, serve
    from inwire.plan import schedule_file

    owners = [model.AggregatorConfig, model.Aggregator, serve.SoftwareAggregator, client.MemberSum,
              client.UdpMember, client.CliqueKey]
    functions = [client.contributions, client.slot, schedule_file.load_schedule_file]
    if importlib.util.find_spec("torch") is not None:
        from inwire.train import averaging

        owners += [averaging.CliqueAverager, averaging.InwireExchange]
    for owner in owners:
        for attribute, value in vars(owner).items():
            if isinstance(value, property):
                value = value.fget
            if inspect.isfunction(value) and (attribute == "__init__" or not attribute.startswith("_")):
                functions.append(value)
    return functions


def test_the_public_api_is_annotated():
    unannotated = []
    for function in _public_callables():
        signature = inspect.signature(function)
        missing = [name for name, parameter in signature.parameters.items() if name != "self"
                   and parameter.annotation is inspect.Parameter.empty]
        if signature.return_annotation is inspect.Signature.empty:
            missing.append("return")
        if missing:
            unannotated.append(f"{function.__qualname__}: {', '.join(missing)}")
        typing.get_type_hints(function)  # every hint names something that exists
    assert unannotated == []


def test_serve_depends_on_model_and_datagram_not_on_the_cli_or_the_gateware():
    graph = import_graph(package_modules())
    host = {name for name in graph["inwire.serve"] if name != "inwire"}
    assert host == {"inwire.control", "inwire.datagram", "inwire.errors", "inwire.fastpath", "inwire.jobs",
                    "inwire.model", "inwire.packets", "inwire.protocol"}


def _importers(target, graph):
    """Modules of `graph` with an edge to `target` (importing a module below it counts: its package runs)."""
    return {name for name, edges in graph.items() if target in edges}


def test_the_core_imports_nothing_from_train():
    """train/ builds on the core (the member client, the clique averaging's codec), never the other way: only
    the command that runs the study reaches into it."""
    graph = import_graph(package_modules(), every_import)
    outside = {name for name in _importers("inwire.train", graph) if not name.startswith("inwire.train.")}
    assert outside == {"inwire.cli.train"}


def test_host_modules_load_no_gateware_when_imported():
    """The simulators' names are parsed in the host package (`inwire.simulators`): only a gateware command
    imports `inwire_hdl` when it loads; a host module that simulates (a sim: target) does so when it runs."""
    graph = import_graph(package_modules())
    host = {name for name in _importers("inwire_hdl", graph) if name.partition(".")[0] == "inwire"}
    # cli.options is every command's, `inwire decode`'s too
    assert sorted(name for name in host if not name.startswith("inwire.cli.") or name == "inwire.cli.options") == []
    assert graph["inwire.simulators"] == set()


def test_only_what_runs_a_service_imports_serve():
    """Constants the members share with the service (`DEFAULT_SLOTS`) live in the protocol layer: the client
    and the trainers do not import the aggregator's service to read them."""
    graph = import_graph(package_modules(), every_import)
    assert _importers("inwire.serve", graph) == {"inwire.cli.serve", "inwire.cli.run", "inwire.cli.demo",
                                                 "inwire.cli.options", "inwire.train.bench"}


def test_no_command_imports_another_command():
    """What two commands share (e.g. `make_transport`, which `run` and `stream` both use) lives in a shared
    module, not in one of them."""
    from inwire.cli import COMMANDS

    graph = import_graph(package_modules(), every_import)
    commands = {module for module, _ in COMMANDS.values()}
    assert {name: sorted(graph[name] & commands) for name in commands if graph[name] & commands} == {}


def _capture(path):
    config = AggregatorConfig()
    frames = [bytes(row) for row in build_frames(np.array([[1, 2], [3, 4]]), ip_dst=config.ip, fanin=2,
                                                 sender=[0, 1], group=0xEF000001)]
    model = Aggregator(config)
    write_frames(path, frames + [out for frame in frames for out in model.process(frame)])
    return path


LOADED = """
import json, sys
from inwire.cli import main
try:
    status = main(sys.argv[2:])
except SystemExit as exit:
    status = exit.code
with open(sys.argv[1], "w") as out:
    json.dump({"status": status, "modules": sorted(sys.modules)}, out)
"""


@pytest.mark.parametrize("argv", [["--help"], ["decode", "CAPTURE"], ["decode", "--help"]])
def test_light_commands_import_no_gateware_planner_plots_or_torch(tmp_path, argv):
    capture = _capture(tmp_path / "round.pcap")
    argv = [str(capture) if word == "CAPTURE" else word for word in argv]
    report = tmp_path / "modules.json"
    run = subprocess.run([sys.executable, "-c", LOADED, str(report), *argv], capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr
    loaded = json.loads(report.read_text())
    assert loaded["status"] == 0
    heavy = sorted({name.partition(".")[0] for name in loaded["modules"]} & set(HEAVY))
    assert heavy == [], f"inwire {' '.join(argv)} imported {heavy}"


def test_no_sys_path_edits():
    pattern = "sys.path" + ".insert"  # spelled apart, so that this file does not match itself
    found = subprocess.run(["git", "grep", "-n", pattern, "--", "sw", "hdl", "tb", "tests"],
                           cwd=ROOT, capture_output=True, text=True)
    assert found.returncode == 1 and found.stdout == ""


def test_no_checkout_paths_in_the_packages():
    for path in package_modules().values():
        assert "parents[2]" not in path.read_text(), path


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """A fresh virtual environment with inwire installed from a wheel (not editable). Its dependencies
    come from this environment's site-packages, named in a .pth file, so nothing is downloaded; the
    editable install of this environment is not on that path (.pth files are not read from there)."""
    scratch = tmp_path_factory.mktemp("installed")
    wheels = scratch / "wheels"
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                            "--wheel-dir", str(wheels), str(ROOT)], capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stderr
    wheel = next(wheels.glob("inwire-*.whl"))
    fresh = scratch / "fresh"
    venv.create(fresh, with_pip=False)
    site = next(fresh.glob("lib/python*/site-packages"))
    ours = next(p for p in map(Path, sys.path) if p.name == "site-packages" and (p / "numpy").is_dir())
    (site / "dependencies.pth").write_text(f"{ours}\n")
    python = fresh / "bin" / "python"
    install = subprocess.run([python, "-m", "pip", "install", "--quiet", "--no-index", str(wheel)],
                             capture_output=True, text=True, timeout=600)
    assert install.returncode == 0, install.stderr
    return fresh


def _inwire(fresh, *argv, cwd):
    environment = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    environment["PATH"] = os.pathsep.join([str(fresh / "bin"), str(Path(sys.executable).parent),
                                           environment.get("PATH", "")])
    return subprocess.run([fresh / "bin" / "inwire", *argv], cwd=cwd, capture_output=True, text=True,
                          env=environment, timeout=600)


def test_installed_package_is_the_wheel_not_the_checkout(installed, tmp_path):
    where = subprocess.run([installed / "bin" / "python", "-c",
                            "import inwire, inwire_hdl, inwire_hdl.cocotb.replay as r, importlib.resources as ir;"
                            "print(inwire.__file__); print(inwire_hdl.__file__); print(r.__file__);"
                            "print(ir.files('inwire_hdl').joinpath('constraints', 'versa_ecp5.lpf').is_file());"
                            "print(ir.files('inwire').joinpath('py.typed').is_file())"],
                           cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert where.returncode == 0, where.stderr
    *files, constraints, typed = where.stdout.split()
    for file in files:
        assert Path(file).is_relative_to(installed) and not Path(file).is_relative_to(ROOT / "sw"), file
    assert constraints == "True"
    assert typed == "True", "the wheel carries no py.typed: type checkers ignore inwire's hints"


def test_installed_commands_work_outside_the_checkout(installed, tmp_path):
    capture = _capture(tmp_path / "in.pcap")
    decoded = _inwire(installed, "decode", str(capture), cwd=tmp_path)
    assert decoded.returncode == 0, decoded.stderr
    assert [json.loads(line)["kind"] for line in decoded.stdout.splitlines()] == ["contribution"] * 2 + ["result"]
    verilog = _inwire(installed, "verilog", "-o", "out/aggregator.v", cwd=tmp_path)
    assert verilog.returncode == 0, verilog.stderr
    assert "module inwire_aggregator" in (tmp_path / "out" / "aggregator.v").read_text()
    usage = _inwire(installed, "build", "--help", cwd=tmp_path)
    assert usage.returncode == 0 and "--board" in usage.stdout and "default" in usage.stdout
    replay = _inwire(installed, "replay", "--sim", "icarus", "in.pcap", "out.pcap", cwd=tmp_path)
    assert replay.returncode == 0, replay.stderr
    from inwire.pcap import read_frames

    model = Aggregator(AggregatorConfig())
    assert read_frames(tmp_path / "out.pcap") == [out for frame in read_frames(capture)
                                                  for out in model.process(frame)]
    assert json.loads(replay.stdout) == model.stats()
    assert (tmp_path / "build" / "sim").is_dir()


def test_no_tracked_file_holds_merge_conflict_markers():
    """A merge's conflict left in a file (docs/host.md's failure table once held both sides of one) is caught
    here, not by a reader."""
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=False)
    if listed.returncode != 0:
        pytest.skip("not a git checkout")
    markers = ("<<<<<<< ", ">>>>>>> ")
    found = []
    for name in listed.stdout.decode().split("\0"):
        path = ROOT / name
        if not name or not path.is_file() or path.suffix not in {".py", ".md", ".c", ".h", ".toml", ".txt", ""}:
            continue
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if line.startswith(markers):
                found.append(f"{name}:{number}")
    assert not found, found
