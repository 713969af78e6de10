"""The README's tour runs as written, line by line and in order, in a scratch folder: the simulator lines
on Icarus instead of Verilator and the training at a small size, so that it takes a minute or two."""

import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from inwire.netns import unavailable_reason
from inwire.pcap import read_frames

ROOT = Path(__file__).resolve().parents[1]
HANG_S = 600
SMALLER = {
    ("--sim", "verilator"): ["--sim", "icarus"],
    ("--target", "sim:verilator"): ["--target", "sim:icarus"],
    ("--seeds", "5"): ["--seeds", "1", "--steps", "20", "--local-steps", "5", "--strategies", "none,schedule"],
}
"""Pairs of words of a tour line -> what this test runs instead, to keep it short."""


def tour_lines():
    """The commands of the README's tour block, comments removed."""
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"## A tour\n.*?```sh\n(.*?)```", readme, re.S).group(1)
    return [line for line in block.splitlines() if shlex.split(line, comments=True)]


def smaller(words):
    out, i = [], 0
    while i < len(words):
        pair = tuple(words[i:i + 2])
        if pair in SMALLER:
            out += SMALLER[pair]
            i += 2
        else:
            out.append(words[i])
            i += 1
    return out


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return str(probe.getsockname()[1])


def test_the_readme_tour_runs_as_written(tmp_path):
    inwire = shutil.which("inwire")
    assert inwire, "inwire is not on PATH: make setup installs it into .venv/bin"
    port = free_port()
    cwd, background, outputs = tmp_path, None, {}
    # A cache of the tour's own: its first simulator line builds, whatever earlier runs left in the user's.
    environment = {**os.environ, "INWIRE_SIM_CACHE": str(tmp_path / "cache")}
    for line in tour_lines():
        words = shlex.split(line.replace("18775", port), comments=True)
        if words[:1] == ["."]:
            # Activation puts .venv/bin first on PATH: the inwire found above is that one under make setup.
            assert (ROOT / words[1]).exists() or Path(inwire).parent == Path(sys.executable).parent
            continue
        if words[:2] == ["mkdir", "-p"]:
            cwd = tmp_path / words[2]
            cwd.mkdir(parents=True, exist_ok=True)
            assert words[3:] == ["&&", "cd", words[2]]
            continue
        if words[:2] == ["kill", "%1"]:
            background.send_signal(signal.SIGTERM)
            _, err = background.communicate(timeout=HANG_S)
            assert background.returncode == 0 and "stopped; final counters" in err
            continue
        if "# as root" in line and (os.geteuid() != 0 or unavailable_reason()):
            continue
        assert words[0] in ("inwire", "$(command -v inwire)"), line
        argv = [inwire, *smaller(words[1:])]
        if argv[-1] == "&":
            background = subprocess.Popen(argv[:-1], cwd=cwd, stderr=subprocess.PIPE, text=True, env=environment)
            assert "listening on" in background.stderr.readline()
            continue
        done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=HANG_S, env=environment)
        assert done.returncode == 0, f"{line}\n{done.stderr}"
        outputs[" ".join(words[:2])] = outputs.get(" ".join(words[:2]), []) + [done]
    assert background is None or background.returncode is not None, "the tour leaves the service running"

    for run in outputs["inwire stream"] + outputs.get("inwire demo", []):
        assert "bit_exact: true" in run.stdout
    capture = read_frames(cwd / "round.pcap")
    decoded = [json.loads(line) for line in outputs["inwire decode"][0].stdout.splitlines()]
    assert len(decoded) == len(capture)
    # replay: the capture needs the slots the README says, the line asks for the gateware the flat sim: line
    # (and inwire run) use, which it builds and that line reuses; no frame dropped.
    replay = outputs["inwire replay"][0]
    slots = max(frame["slot"] for frame in decoded if frame["kind"] == "contribution") + 1
    (line,) = [line for line in tour_lines() if line.startswith("inwire replay")]
    asked = int(shlex.split(line)[shlex.split(line).index("--slots") + 1])
    assert slots <= asked and f"gateware with {asked} slots" in replay.stderr
    assert "building the gateware in icarus (width 64, 48 slots of 256 elements)" in replay.stderr
    assert re.search(rf"here {slots} slots: the\s+capture's islands use slots up to {slots - 1}",
                     (ROOT / "README.md").read_text())
    flat = outputs["inwire stream"][2]
    assert "reusing the gateware in icarus (width 64, 48 slots of 256 elements)" in flat.stderr, flat.stderr
    counters = json.loads(replay.stdout)
    assert all(value == 0 for name, value in counters.items() if name.startswith("drop_"))
    chunks = {(f["round"], f["clique"], f["chunk"]) for f in decoded if f["kind"] == "contribution"}
    assert counters["results_emitted"] == len(chunks)
    assert (cwd / "out.pcap").exists() and (cwd / "inwire_aggregator.v").exists()
    assert (cwd / "schedule.json").exists() and (cwd / "versa.json").exists()
    assert "wrote the whole study to train/study.json" in outputs["inwire train"][0].stdout
    assert "| strategy |" not in outputs["inwire train"][0].stdout  # the tables are in train/study.md

    # make run after the tour, from the checkout: the same gateware, not built again.
    again = subprocess.run([inwire, "run", "--sim", "icarus", "--out-dir", "run"], cwd=tmp_path, capture_output=True,
                           text=True, timeout=HANG_S, env=environment)
    assert again.returncode == 0 and "bit_exact: true" in again.stdout, again.stderr
    assert "reusing the gateware in icarus (width 64, 48 slots of 256 elements)" in again.stderr


@pytest.fixture(autouse=True)
def _needs_icarus():
    if shutil.which("iverilog") is None:
        pytest.skip("needs Icarus Verilog (make setup)")
