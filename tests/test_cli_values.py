"""Issue 34, "nothing lost, nothing silent": every number on the command line is read strictly (plain ASCII
digits) and bounded before any work or write, and no output may name an input of the same command. Each
case ends in exit status 2 and one line on stderr, leaving every file as it was."""

import json
import os

import pytest

from inwire.cli import main
from inwire.plan.topology import generate_topology
from schedules import write_schedule


def small_topology(path):
    """Three cities: planned in a moment, so that a command that still plans (before the fix) ends soon."""
    path.write_text(json.dumps(generate_topology(3).to_dict()))
    return path


def snapshot(folder):
    return {path: path.read_bytes() for path in sorted(folder.rglob("*")) if path.is_file()}


def one_line(capsys, argv):
    """(exit status, stderr) of `inwire argv`, run in this process."""
    capsys.readouterr()
    status = main(argv)
    return status, capsys.readouterr().err


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """A folder with an earlier run's schedule (run/schedule.json), a schedule and a small topology."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "run").mkdir()
    write_schedule(tmp_path / "run" / "schedule.json")
    write_schedule(tmp_path / "schedule.json")
    small_topology(tmp_path / "cities3.json")
    return tmp_path


SCHEDULE = ["schedule", "--topology", "cities3.json", "--out", "out.json"]
STREAM = ["stream", "--target", "pcap:out.pcap", "--schedule", "schedule.json"]
LAB = ["lab", "--strategies", "schedule"]


@pytest.mark.parametrize("argv, message", [
    # run refused these only after planning and after writing run/schedule.json over the earlier one.
    (["run", "--rounds", "0"], "inwire run: --rounds must be positive, got 0"),
    (["run", "--rounds", "-1"], "inwire run: --rounds must be positive, got -1"),
    (["run", "--rounds", str(2**64)], "inwire run: --rounds must fit the 32-bit round field, got 18446744073709551616"),
    (["run", "--elements", "0"], "inwire run: --elements must be positive, got 0"),
    # Read as 10 and 3 by int() and float().
    (["run", "--rounds", "1_0"], "inwire run: --rounds must be a whole number in the digits 0-9, got '1_0'"),
    (["run", "--rounds", "\u0663"], "inwire run: --rounds must be a whole number in the digits 0-9, got '\u0663'"),
    (["run", "--rounds", "+3"], "inwire run: --rounds must be a whole number in the digits 0-9, got '+3'"),
    ([*STREAM, "--rounds", "1_0"], "inwire stream: --rounds must be a whole number in the digits 0-9, got '1_0'"),
    ([*STREAM, "--loss", "0.\u0661"],
     "inwire stream: --loss must be a number in the digits 0-9 (a point and an exponent allowed), got '0.\u0661'"),
    ([*SCHEDULE, "--model-mb", "1_0"],
     "inwire schedule: --model-mb must be a number in the digits 0-9 (a point and an exponent allowed), got '1_0'"),
    (["serve", "--slots", "1_6"], "inwire serve: --slots must be a whole number in the digits 0-9, got '1_6'"),
    (["verilog", "--out", "v.v", "--lease", "\u0663"],
     "inwire verilog: --lease must be a whole number in the digits 0-9, got '\u0663'"),
    # A traceback (OverflowError), a schedule holding Infinity with exit 0, a value no bound held.
    ([*LAB, "--rate-scale", "1e-320"], "inwire lab: --rate-scale must lie in [0.0001, 0.05] (a 1 Gb/s link at "
                                       "100 kb/s, a 10 Gb/s one at 500 Mb/s), got 1e-320"),
    ([*LAB, "--delay-scale", "1e-320"],
     "inwire lab: --delay-scale must lie in [0.01, 20] (a 100 ms link delayed 1 ms to 2 s), got 1e-320"),
    ([*LAB, "--mb", "1e-320"], "inwire lab: --mb must lie in [1e-06, 64] MB (one byte to minutes per repetition), "
                               "got 1e-320"),
    ([*SCHEDULE, "--host-nic-gbps", "1e-320"], "inwire schedule: --host-nic-gbps must lie in [0.001, 100,000] Gb/s "
                                               "(1 Mb/s to 100 Tb/s, beyond any NIC either way), got 1e-320"),
    ([*SCHEDULE, "--local-steps", str(2**64)], "inwire schedule: --local-steps must lie in [0, 1,000,000] (far beyond "
                                               "any period between syncs), got 18,446,744,073,709,551,616"),
    ([*STREAM, "--retries", str(2**64)], "inwire stream: --retries must lie in [1, 1,000] (17 hours at a minute's "
                                         "timeout), got 18,446,744,073,709,551,616"),
    (["train", "--local-steps", str(2**64)], "inwire train: --local-steps must lie in [1, 10,000] (as many as --steps "
                                             "may be), got 18,446,744,073,709,551,616"),
    (["formal", "--timeout", "1e300"], "inwire formal: --timeout must lie in [1, 604,800] s (a week per solver run), "
                                       "got 1e+300"),
    (["decode", "x.pcap", "--frames", "3"], "inwire decode: unrecognized arguments: --frames 3"),
])
def test_a_bad_value_is_one_line_before_any_work_or_write(workdir, capsys, argv, message):
    before = snapshot(workdir)
    status, err = one_line(capsys, argv)
    assert (status, err) == (2, message + "\n")
    assert snapshot(workdir) == before


def test_run_keeps_the_earlier_schedule_when_it_refuses_a_value(workdir, capsys):
    earlier = (workdir / "run" / "schedule.json").read_bytes()
    status, err = one_line(capsys, ["run", "--rounds", "0"])
    assert status == 2 and err.count("\n") == 1, err
    assert (workdir / "run" / "schedule.json").read_bytes() == earlier


def test_stream_refuses_a_capture_over_its_schedule(workdir, capsys):
    schedule = workdir / "schedule.json"
    earlier = schedule.read_bytes()
    status, err = one_line(capsys, ["stream", "--schedule", str(schedule), "--target", f"pcap:{schedule}"])
    assert (status, err) == (2, f"inwire stream: --target pcap:{schedule}: the same file as --schedule {schedule}, "
                                f"which the command reads; name another output\n")
    assert schedule.read_bytes() == earlier


def test_stream_refuses_a_capture_over_the_topology_its_schedule_names(workdir, capsys):
    topology = workdir / "cities3.json"
    cities = list(json.loads(topology.read_text())["cities"])
    names = [city["name"] for city in cities]
    write_schedule(workdir / "three.json", rounds=[[{"members": names, "aggregator": names[0]}]], islands=names,
                   topology=str(topology))
    earlier = topology.read_bytes()
    status, err = one_line(capsys, ["stream", "--schedule", "three.json", "--target", f"pcap:{topology}"])
    assert status == 2 and "the same file as its topology" in err and err.count("\n") == 1, err
    assert topology.read_bytes() == earlier


def test_replay_refuses_to_write_over_its_input(workdir, capsys):
    assert main(["stream", "--schedule", "schedule.json", "--target", "pcap:round.pcap", "--rounds", "1"]) == 0
    capture = workdir / "round.pcap"
    earlier = capture.read_bytes()
    # Spelled differently: the same file all the same.
    status, err = one_line(capsys, ["replay", "round.pcap", "./round.pcap"])
    assert (status, err) == (2, "inwire replay: OUT.pcap ./round.pcap: the same file as IN.pcap round.pcap, which the "
                                "command reads; name another output\n")
    assert capture.read_bytes() == earlier


@pytest.mark.parametrize("out", ["cities3.json", "link.json"])
def test_schedule_refuses_to_write_over_its_topology(workdir, capsys, out):
    topology = workdir / "cities3.json"
    os.symlink(topology, workdir / "link.json")  # written through, the link would replace its target
    earlier = topology.read_bytes()
    status, err = one_line(capsys, ["schedule", "--topology", "cities3.json", "--out", out])
    assert (status, err) == (2, f"inwire schedule: --out {out}: the same file as --topology cities3.json, which the "
                                f"command reads; name another output\n")
    assert topology.read_bytes() == earlier


def test_schedule_refuses_one_file_as_both_outputs(workdir, capsys):
    status, err = one_line(capsys, [*SCHEDULE[:3], "--out", "plan.png", "--map", "plan.png"])
    assert (status, err) == (2, "inwire schedule: --map plan.png: the same file as --out plan.png, another output of "
                                "the command; name another output\n")
    assert not (workdir / "plan.png").exists()


def test_values_within_their_bounds_are_read_as_before(workdir, capsys):
    status, err = one_line(capsys, [*SCHEDULE, "--host-nic-gbps", "0.001", "--local-steps", "4", "--step-ms", "1e2",
                                    "--model-mb", ".5"])
    assert status == 0, err
    plan = json.loads((workdir / "out.json").read_text())
    assert plan["model_bytes"] == 500_000
