"""SIGINT ends a command with exit status 130 and one line saying where it was, and leaves no partial output
file. Each run waits for a progress line, so the command is busy when the signal comes; the timeouts only
keep a broken build from hanging the suite."""

import os
import shutil
import signal
import subprocess
import sys

import pytest

from inwire.netns import unavailable_reason
from schedules import write_schedule

HANG_S = 120


def start(argv, cwd, new_session=False):
    # SIGINT at its default in the child, as from a terminal, whatever this test process inherited.
    return subprocess.Popen([sys.executable, "-m", "inwire", *argv], cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=new_session,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def wait_for_line(process, words):
    """The stderr lines up to the first holding `words` (the process must still run then)."""
    lines = []
    while True:
        line = process.stderr.readline()
        assert line, f"ended before printing {words!r}: {''.join(lines)}"
        lines.append(line)
        if words in line:
            return lines


def interrupted(process, group=False):
    """Send SIGINT (to the process group with `group`); returns (exit status, stderr after it)."""
    if group:
        os.killpg(process.pid, signal.SIGINT)
    else:
        process.send_signal(signal.SIGINT)
    try:
        _, err = process.communicate(timeout=HANG_S)
    except subprocess.TimeoutExpired:
        process.kill()
        raise
    return process.returncode, err


def test_stream_to_a_capture_leaves_no_partial_file(tmp_path):
    schedule = write_schedule(tmp_path / "schedule.json")
    process = start(["stream", "--target", "pcap:round.pcap", "--schedule", str(schedule), "--rounds", "10000",
                     "--elements", "2048"], tmp_path)
    wait_for_line(process, "rounds done")
    code, err = interrupted(process)
    assert code == 130
    assert err.strip().splitlines()[-1].startswith("inwire stream: interrupted during round ")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["schedule.json"]


def test_an_existing_capture_is_kept_when_the_new_one_is_interrupted(tmp_path):
    schedule = write_schedule(tmp_path / "schedule.json")
    (tmp_path / "round.pcap").write_bytes(b"the earlier capture")
    process = start(["stream", "--target", "pcap:round.pcap", "--schedule", str(schedule), "--rounds", "10000",
                     "--elements", "2048"], tmp_path)
    wait_for_line(process, "rounds done")
    assert interrupted(process)[0] == 130
    assert (tmp_path / "round.pcap").read_bytes() == b"the earlier capture"


@pytest.mark.skipif(shutil.which("iverilog") is None, reason="needs Icarus Verilog (make setup)")
def test_replay_interrupted_in_the_simulator_writes_no_output(tmp_path):
    schedule = write_schedule(tmp_path / "schedule.json")
    subprocess.run([sys.executable, "-m", "inwire", "stream", "--target", "pcap:in.pcap", "--schedule",
                    str(schedule), "--rounds", "60", "--elements", "2048"], cwd=tmp_path, check=True,
                   capture_output=True, timeout=HANG_S)
    process = start(["replay", "--sim", "icarus", "in.pcap", "out.pcap"], tmp_path)
    wait_for_line(process, "simulating")
    code, err = interrupted(process)
    assert code == 130
    assert err.strip().splitlines()[-1].startswith("inwire replay: interrupted during simulating")
    assert not [path.name for path in tmp_path.iterdir() if path.name.startswith(("out", ".out"))]


@pytest.mark.skipif(bool(unavailable_reason()), reason=f"network namespaces: {unavailable_reason()}")
def test_demo_stops_on_ctrl_c_of_its_process_group(tmp_path):
    schedule = write_schedule(tmp_path / "schedule.json")
    process = start(["demo", "--schedule", str(schedule), "--rounds", "2000", "--elements", "256", "--scale", "1"],
                    tmp_path, new_session=True)
    wait_for_line(process, "rounds done")
    code, err = interrupted(process, group=True)
    assert code == 130, err
    assert err.strip().splitlines()[-1].startswith("inwire demo: interrupted during round ")
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert f"iw{process.pid % 100000}" not in namespaces
