"""Input files the CLI reads (schedules, topologies, build reports, aggregator maps, captures) and the files it
writes: a folder, a FIFO or a device where a file is read, a schedule's "topology" that points anywhere, a
sparse capture of zeros and a count option of 0 each end in one line naming the file or option and the cause,
exit status 2, at once; `inwire verilog --out` says what it wrote."""

import json
import os
import shutil
from importlib import resources

import pytest

from inwire.cli import main
from inwire.pcap import write_frames
from inwire.plan.schedule_file import load_schedule_file
from inwire.stream import load_plan
from schedules import write_schedule

UDP = ["--target", "udp://127.0.0.1:9"]


def make_inputs(tmp):
    """The files the table names, in `tmp`."""
    (tmp / "folder").mkdir()
    (tmp / "folder.json").mkdir()
    os.mkfifo(tmp / "fifo")
    write_schedule(tmp / "schedule.json")
    # A capture header, then 4 GiB of zeros: sparse, so it costs no disk.
    write_frames(tmp / "sparse.pcap", [])
    os.truncate(tmp / "sparse.pcap", 4 * 2**30)
    write_schedule(tmp / "environ.json", topology="/proc/self/environ")
    write_schedule(tmp / "climbs.json", topology="../" * 40 + "proc/self/x.json")
    (tmp / "environ-link.json").symlink_to("/proc/self/environ")
    write_schedule(tmp / "linked.json", topology="environ-link.json")


def run_cli(capsys, tmp, argv):
    """(exit status, the lines on stderr) of `inwire argv`, {tmp} in argv naming the test's folder."""
    code = main([part.format(tmp=tmp) for part in argv])
    return code, capsys.readouterr().err.splitlines()


CASES = [
    # A folder where a file is read: "3: Is a directory" (the descriptor's number) or a hang before.
    (["demo", "--schedule", "{tmp}/folder"],
     "inwire demo: {tmp}/folder: a folder, not a regular file (the schedule is read from a JSON file)"),
    (["stream", *UDP, "--schedule", "{tmp}/folder"],
     "inwire stream: {tmp}/folder: a folder, not a regular file (the schedule is read from a JSON file)"),
    (["schedule", "--topology", "{tmp}/folder", "--out", "{tmp}/out.json"],
     "inwire schedule: {tmp}/folder: a folder, not a regular file (the topology is read from a JSON file)"),
    (["schedule", "--aggregator", "{tmp}/folder.json", "--out", "{tmp}/out.json"],
     "inwire schedule: {tmp}/folder.json: a folder, not a regular file (the build report is read from a JSON file)"),
    (["stream", "--target", "udp:{tmp}/folder.json", "--schedule", "{tmp}/schedule.json"],
     "inwire stream: {tmp}/folder.json: a folder, not a regular file (the aggregator map is read from a JSON file)"),
    (["decode", "{tmp}/folder"],
     "inwire decode: {tmp}/folder: a folder, not a regular file (the capture is read from a pcap or pcapng file)"),
    (["decode", "{tmp}/fifo"],
     "inwire decode: {tmp}/fifo: a FIFO, not a regular file (the capture is read from a pcap or pcapng file)"),
    (["decode", "/dev/zero"],
     "inwire decode: /dev/zero: a character device, not a regular file (the capture is read from a pcap or pcapng "
     "file)"),
    (["replay", "{tmp}/folder", "{tmp}/out.pcap"],
     "inwire replay: {tmp}/folder: a folder, not a regular file (the capture is read from a pcap or pcapng file)"),
    # A sparse capture: before, hundreds of millions of empty records were read (minutes, gigabytes of memory).
    (["decode", "{tmp}/sparse.pcap"],
     "inwire decode: {tmp}/sparse.pcap: record 0 (at offset 24) is 16 zero bytes, no record header (no time, no "
     "frame): zeros past the end of the capture, as in a preallocated or sparse file"),
    (["replay", "{tmp}/sparse.pcap", "{tmp}/out.pcap"],
     "inwire replay: {tmp}/sparse.pcap: record 0 (at offset 24) is 16 zero bytes, no record header (no time, no "
     "frame): zeros past the end of the capture, as in a preallocated or sparse file"),
    # A schedule's "topology": a built-in name or a .json file from the schedule's folder, never /proc.
    (["stream", *UDP, "--schedule", "{tmp}/environ.json"],
     "inwire stream: {tmp}/environ.json: 'topology' '/proc/self/environ' is neither a built-in topology "
     "(doublezero9, doublezero-public) nor a topology file ending in .json"),
    (["stream", *UDP, "--schedule", "{tmp}/climbs.json"],
     "inwire stream: {tmp}/climbs.json: 'topology' '" + "../" * 40 + "proc/self/x.json' leads to "
     "/proc/{pid}/x.json, not a topology file (a .json file outside /proc, /sys, /dev)"),
    (["stream", *UDP, "--schedule", "{tmp}/linked.json"],
     "inwire stream: {tmp}/linked.json: 'topology' 'environ-link.json' leads to /proc/{pid}/environ, not a "
     "topology file (a .json file outside /proc, /sys, /dev)"),
    # Count options: ThreadPoolExecutor's "max_workers must be greater than 0" before, after build/formal was
    # emptied.
    (["formal", "--jobs", "0"], "inwire formal: --jobs must lie in [1, 256] (solver runs at the same time), got 0"),
    (["formal", "--jobs", "-3"], "inwire formal: --jobs must lie in [1, 256] (solver runs at the same time), got -3"),
    (["formal", "--timeout", "0"],
     "inwire formal: --timeout must lie in [1, 604,800] s (a week per solver run), got 0.0"),
]


@pytest.mark.parametrize("argv, line", CASES, ids=[" ".join(argv) for argv, _ in CASES])
def test_a_bad_input_file_or_count_is_one_line_and_exit_2(tmp_path, capsys, deadline, monkeypatch, argv, line):
    make_inputs(tmp_path)
    monkeypatch.chdir(tmp_path)
    code, lines = run_cli(capsys, tmp_path, argv)
    assert (code, lines) == (2, [line.format(tmp=tmp_path, pid=os.getpid())])
    assert not (tmp_path / "out.json").exists() and not (tmp_path / "out.pcap").exists()


def test_formal_refuses_a_bad_count_before_emptying_its_build_folder(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    kept = tmp_path / "build" / "formal" / "kept.txt"
    kept.parent.mkdir(parents=True)
    kept.write_text("an earlier run's trace")
    assert run_cli(capsys, tmp_path, ["formal", "--jobs", "0"])[0] == 2
    assert kept.read_text() == "an earlier run's trace"


def test_a_schedules_topology_file_is_found_from_the_schedules_folder(tmp_path, capsys, monkeypatch):
    """`inwire schedule --topology topo.json --out plans/s.json` records the file relative to plans/, and the
    schedule loads from any working directory; a topology next to a schedule written by hand loads too."""
    topology = json.loads(resources.files("inwire").joinpath("data", "doublezero9.json").read_text())
    (tmp_path / "topo.json").write_text(json.dumps({**topology, "name": "mine"}))
    (tmp_path / "plans").mkdir()
    monkeypatch.chdir(tmp_path)
    assert main(["schedule", "--topology", "topo.json", "--islands", "SIN,TYO,LAX", "--out", "plans/s.json"]) == 0
    assert load_schedule_file(tmp_path / "plans" / "s.json").topology == "../topo.json"
    monkeypatch.chdir(tmp_path / "plans")
    assert load_plan("s.json").topology.name == "mine"
    monkeypatch.chdir("/")
    assert load_plan(tmp_path / "plans" / "s.json").topology.name == "mine"
    (tmp_path / "plans" / "near.json").write_text(json.dumps({**topology, "name": "near"}))
    assert load_plan(write_schedule(tmp_path / "plans" / "by-hand.json", topology="near.json")).topology.name == "near"
    capsys.readouterr()


def test_verilog_says_what_it_wrote(tmp_path, capsys):
    out = tmp_path / "core.v"
    code, lines = run_cli(capsys, tmp_path, ["verilog", "--slots", "2", "--elements", "16", "--out", str(out)])
    assert code == 0
    assert lines == [f"inwire verilog: wrote {out}: {out.stat().st_size:,} bytes, top module inwire_aggregator "
                     f"(8-byte data path, 2 slots of 16 elements)"]
    assert "module inwire_aggregator(" in out.read_text()


def test_without_root_demo_says_to_run_it_as_root(capsys, monkeypatch):
    """Not "use sudo": where sudo is absent, or resets PATH, the way is to be root."""
    if shutil.which("ip") is None:
        pytest.skip("without iproute2 the demo names that first")
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    code, lines = run_cli(capsys, "", ["demo"])
    assert (code, lines) == (2, ["inwire demo: network namespaces unavailable: they need root; run the command as "
                                 "root"])
