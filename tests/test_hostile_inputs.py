"""Hostile input reported in issue 22: every case ends in one line naming what is wrong and exit status 2,
before any long work, without a traceback, without touching a file and within a deadline (the rows that
hung ran for hours or for ever). Files a row needs are made by the builders of INPUTS, named in its argv."""

import contextlib
import json
import signal
from importlib import resources

import pytest

from inwire.cli import main
from inwire.pcap import read_frames, write_frames
from inwire.plan.topology import generate_topology
from inwire.protocol import FRAME_OFFSETS
from schedules import write_schedule

HUGE = int("9" * 400)
"""An integer that no float holds."""
WILD_SLOT = 64260
"""A slot number the schedules here never use; a frame carrying it needs a core far beyond the largest."""
DEADLINE_S = 60


def doublezero9(**changes):
    topology = json.loads(resources.files("inwire").joinpath("data", "doublezero9.json").read_text())
    topology["links"][0].update(changes)
    return topology


def write_json(document):
    return lambda path: path.write_text(json.dumps(document))


def with_city_ports(path):
    topology = doublezero9()
    topology["cities"][0]["aggregator"] = {"ports": HUGE, "port_gbps": 1.0}
    path.write_text(json.dumps(topology))


def capture_with_a_wild_slot(path):
    schedule = write_schedule(path.with_suffix(".json"))
    assert main(["stream", "--target", f"pcap:{path}", "--schedule", str(schedule), "--rounds", "1"]) == 0
    frames = [bytearray(frame) for frame in read_frames(path)]
    frames[5][FRAME_OFFSETS["slot"]:FRAME_OFFSETS["slot"] + 2] = WILD_SLOT.to_bytes(2, "big")
    write_frames(path, frames)


INPUTS = {
    "schedule.json": write_schedule,
    "member-list.json": lambda path: write_schedule(
        path, rounds=[[{"members": [["SIN"], "TYO"], "aggregator": "TYO"}]]),
    "idle.json": lambda path: write_schedule(path, rounds=[[], []]),
    "link-to-a-list.json": write_json(doublezero9(a=["A"])),
    "huge-latency.json": write_json(doublezero9(latency_ms=HUGE)),
    "huge-ports.json": with_city_ports,
    "report.json": write_json({"board": "versa_ecp5", "data_width": 8, "core_clock_mhz": HUGE}),
    "list.json": write_json([1]),
    "null.json": write_json(None),
    "wild-slot.pcap": capture_with_a_wild_slot,
    "cities300.json": lambda path: path.write_text(json.dumps(generate_topology(300).to_dict())),
}
"""File name -> builder: an argv part "{name}" becomes the path of that file, made first."""

STREAM = ["stream", "--target", "udp://127.0.0.1:9", "--schedule", "{schedule.json}"]
SCHEDULE = ["schedule", "--out", "{tmp}/out.json"]
TRAIN = ["train", "--out-dir", "{tmp}/train"]
BUILD = ["build", "--out", "{tmp}/board"]


class Hung(BaseException):
    """Raised into a command that outlives the deadline; no command's handler catches a BaseException."""


@contextlib.contextmanager
def deadline(seconds):
    def expire(_signum, _frame):
        raise Hung(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def materialize(part, tmp_path):
    for name, build in INPUTS.items():
        if "{" + name + "}" in part:
            path = tmp_path / name
            if not path.exists():
                build(path)
            part = part.replace("{" + name + "}", str(path))
    return part.replace("{tmp}", str(tmp_path))


def snapshot(folder):
    return {path: path.read_bytes() for path in sorted(folder.rglob("*")) if path.is_file()}


@pytest.mark.parametrize("argv, message", [
    # Tracebacks
    (["stream", "--target", "udp://127.0.0.1:9", "--schedule", "{member-list.json}"],
     "rounds[0].cliques[0]: 'members' must list island names, got ['SIN']"),
    ([*SCHEDULE, "--topology", "{link-to-a-list.json}"], "links[0]: a must name a city, got ['A']"),
    ([*SCHEDULE, "--topology", "{huge-latency.json}"], "latency_ms must be a finite number, got an integer of 400"),
    ([*SCHEDULE, "--topology", "{huge-ports.json}"], "needs a positive 'ports', got an integer of 400 digits"),
    ([*SCHEDULE, "--aggregator", "{report.json}"], "needs a positive 'core_clock_mhz', got an integer of 400"),
    ([*SCHEDULE, "--model-mb", "1e308"], "--model-mb must lie in (0, 1,000,000,000] MB (a petabyte), got 1e+308"),
    ([*TRAIN, "--model-mb", "1e308"], "--model-mb must list sizes in [0, 1,000,000,000] MB (a petabyte), got 1e308"),
    ([*TRAIN, "--seeds", "18446744073709551616"], "--seeds must lie in [1, 1,000] (each is a training run"),
    ([*BUILD, "--core-mhz", "1e-308"], "--core-mhz must be 500 MHz divided by an integer from 4 to 128"),
    (["serve", "--receive-buffer", "2147483648"], "--receive-buffer must lie in [1, 2,147,483,647]"),
    (["bench", "--only", "", "--out", "{list.json}"], "holds no JSON object of results to merge with"),
    (["bench", "--only", "", "--out", "{null.json}"], "holds no JSON object of results to merge with"),
    # Hangs
    (["stream", "--target", "pcap:{tmp}/x.pcap", "--schedule", "{schedule.json}", "--rounds", "2147483648"],
     "more than the 1,048,576 a pcap: target runs"),
    ([*STREAM, "--timeout-ms", "inf"], "--timeout-ms must lie in (0, 60,000] (a result a minute late is lost), got"),
    ([*STREAM, "--timeout-ms", "1e300"], "--timeout-ms must lie in (0, 60,000] (a result a minute late is lost)"),
    (["demo", "--schedule", "{schedule.json}", "--scale", "inf"], "--scale must lie in (0, 100] (x100 makes a link"),
    ([*TRAIN, "--steps", "2147483648"], "--steps must lie in [1, 10,000] (2,000 passes over an island's share"),
    ([*TRAIN, "--seeds", "2147483648"], "--seeds must lie in [1, 1,000] (each is a training run"),
    ([*BUILD, "--seed", "-1"], "--seed must be a non-negative integer, got -1"),
    ([*SCHEDULE, "--topology", "{cities300.json}"], "300 islands, more than the 256 a schedule is planned for"),
    # Silent
    (["serve", "--stats-interval", "nan"], "--stats-interval must be a positive number of seconds, got nan"),
    # Unclear
    (["stream", "--target", "pcap:{tmp}/x.pcap", "--schedule", "{idle.json}"],
     "every round of the schedule is idle"),
    ([*STREAM, "--seed", "-1"], "--seed must be a non-negative integer, got -1"),
    (["serve", "--multicast-iface", "1.2.3.4"], "--multicast-iface 1.2.3.4 is not the address of an interface"),
    (["replay", "{wild-slot.pcap}", "{tmp}/out.pcap"], f"frame 5 uses slot {WILD_SLOT} (numbered as by inwire decode"),
    ([*BUILD, "--width", "3"], "--width must be one of 8, 16, 32, 64 bytes, got 3"),
])
def test_hostile_input_gets_one_line_before_any_work(tmp_path, capsys, argv, message):
    argv = [materialize(part, tmp_path) for part in argv]
    before = snapshot(tmp_path)
    capsys.readouterr()
    with deadline(DEADLINE_S):
        status = main(argv)
    err = capsys.readouterr().err
    assert status == 2 and err.count("\n") == 1 and message in err and "Traceback" not in err, err
    assert snapshot(tmp_path) == before
