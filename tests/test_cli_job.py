"""`inwire job` (new, register, leave, teardown) and `inwire serve`'s control options, over loopback."""

import json
import os
import re
import signal
import socket
import stat
import subprocess
import sys

import numpy as np
import pytest

from inwire import control
from inwire.cli import main
from inwire.cli.job import read_job_file
from inwire.datagram import ip_int, payload_of
from inwire.packets import build_frames
from inwire.protocol import Opcode
from inwire.serve import SoftwareAggregator, parse_counters_line, serving_in_thread

KEY = bytes(range(32))


def one_line(capsys, argv):
    status = main(argv)
    captured = capsys.readouterr()
    assert len(captured.err.splitlines()) <= 1, captured.err
    return status, captured.out, captured.err


@pytest.fixture
def key_file(tmp_path):
    path = tmp_path / "operator.key"
    path.write_bytes(KEY)
    return path


@pytest.fixture
def job_file(tmp_path):
    path = tmp_path / "job.json"
    path.write_text(json.dumps(control.entry_to_json(control.new_job(["127.0.0.1:5000"], slots=4))))
    return path


@pytest.fixture
def aggregator():
    server = SoftwareAggregator(("127.0.0.1", 0), engine="golden", slots=8, registered=True, key=KEY,
                                log=lambda line: None)
    with serving_in_thread(server):
        yield server


def test_new_writes_a_private_job_file(tmp_path):
    path = tmp_path / "job.json"
    with open(path, "w") as output:
        subprocess.run([sys.executable, "-m", "inwire", "job", "new", "--members", "127.0.0.1:5000,localhost:5001",
                        "--slots", "4", "--group", "239.1.2.3"], stdout=output, check=True)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    entry = read_job_file(path)
    assert entry.members == {(ip_int("127.0.0.1"), 5000), (ip_int("127.0.0.1"), 5001)}
    assert entry.slots == 4 and entry.group == ip_int("239.1.2.3") and entry.job and entry.token


def test_new_jobs_differ(capsys):
    jobs = [json.loads(one_line(capsys, ["job", "new", "--members", "127.0.0.1:1", "--slots", "1"])[1])
            for _ in range(2)]
    assert jobs[0]["job"] != jobs[1]["job"] and jobs[0]["token"] != jobs[1]["token"]


@pytest.mark.parametrize("argv, message", [
    (["--members", "127.0.0.1:0", "--slots", "1"], "--members '127.0.0.1:0': not a unicast address and port"),
    (["--members", "239.0.0.1:5", "--slots", "1"], "--members '239.0.0.1:5': not a unicast"),
    (["--members", "127.0.0.1", "--slots", "1"], "--members '127.0.0.1' is not HOST:PORT"),
    (["--members", "127.0.0.1:1", "--slots", "65537"], r"--slots must lie in \[1, 65,536\], got 65,537"),
    (["--members", "127.0.0.1:1", "--slots", "1", "--group", "10.0.0.1"], "--group 10.0.0.1: not in 239.0.0.0/8"),
    (["--members", "127.0.0.1:1", "--slots", "1", "--group", "239.1"], "--group '239.1' is not an IPv4 address"),
    (["--members", ",".join(f"127.0.0.1:{port}" for port in range(1000, 1257)), "--slots", "1"],
     "--members: 257 members, more than the 256 an aggregator holds per job"),
])
def test_new_refuses_bad_values_in_one_line(capsys, argv, message):
    status, out, err = one_line(capsys, ["job", "new", *argv])
    assert status == 2 and out == "" and err.startswith("inwire job: ")
    assert re.search(message, err), err


def test_register_and_teardown_round_trip(capsys, aggregator, job_file, key_file):
    host, port = aggregator.address
    entry = read_job_file(job_file)
    common = [str(job_file), "--aggregator", f"{host}:{port}", "--key-file", str(key_file)]
    status, out, _ = one_line(capsys, ["job", "register", *common, "--ttl", "100"])
    assert status == 0 and f"job {entry.job} registered at {host}:{port}: its slots are 0 to 3" in out
    assert aggregator.model.jobs.entries[entry.job] == entry
    assert aggregator.control.expires[entry.job] > 0
    status, out, _ = one_line(capsys, ["job", "teardown", *common])
    assert status == 0 and f"job {entry.job} torn down at" in out and not aggregator.model.jobs.entries
    status, out, _ = one_line(capsys, ["job", "teardown", *common])
    assert status == 0 and f"job {entry.job} was not registered at" in out


def test_each_island_leaves_with_its_own_job_file(capsys, aggregator, job_file, key_file, tmp_path):
    """Two islands registered the same job with their own sockets: one leaves, the job stays for the other;
    the other's leave removes it."""
    host, port = aggregator.address
    entry = read_job_file(job_file)
    other_file = tmp_path / "other.json"
    other_file.write_text(json.dumps({**control.entry_to_json(entry), "members": ["127.0.0.1:5001"]}))
    options = ["--aggregator", f"{host}:{port}", "--key-file", str(key_file)]
    for path in (job_file, other_file):
        assert one_line(capsys, ["job", "register", str(path), *options])[0] == 0
    status, out, _ = one_line(capsys, ["job", "leave", str(job_file), *options])
    assert status == 0 and out == f"inwire job: job {entry.job} at {host}:{port}: 1 member left; 1 remains\n"
    assert aggregator.model.jobs.entries[entry.job].members == {(ip_int("127.0.0.1"), 5001)}
    status, out, _ = one_line(capsys, ["job", "leave", str(job_file), *options])
    assert status == 0 and "none of the job file's members was a member there" in out
    status, out, _ = one_line(capsys, ["job", "leave", str(other_file), *options])
    assert status == 0 and "1 member left, the last: the job is removed (its slots are free)" in out
    assert not aggregator.model.jobs.entries


def test_leave_refuses_a_job_file_without_members_before_sending(capsys, key_file, tmp_path):
    path = tmp_path / "job.json"
    path.write_text(json.dumps({"job": 1, "token": "0000000000000001", "slots": 1, "members": []}))
    status, out, err = one_line(capsys, ["job", "leave", str(path), "--aggregator", "127.0.0.1:9",
                                         "--key-file", str(key_file)])
    assert status == 2 and out == ""
    assert err == f"inwire job: job file {path}: field members is empty: no member to leave\n"


def test_register_reports_a_clash_in_one_line(capsys, aggregator, job_file, key_file, tmp_path):
    host, port = aggregator.address
    assert main(["job", "register", str(job_file), "--aggregator", f"{host}:{port}", "--key-file", str(key_file)]) == 0
    clash = json.loads(job_file.read_text()) | {"token": "00000000000000ff"}
    other = tmp_path / "clash.json"
    other.write_text(json.dumps(clash))
    capsys.readouterr()
    status, _, err = one_line(capsys, ["job", "register", str(other), "--aggregator", f"{host}:{port}",
                                       "--key-file", str(key_file)])
    assert status == 2 and f"refused the registration of job {clash['job']}: " in err and "a clash" in err


def test_register_with_another_key_gets_no_answer(capsys, aggregator, job_file, tmp_path):
    host, port = aggregator.address
    other = tmp_path / "other.key"
    other.write_bytes(bytes(32))
    status, _, err = one_line(capsys, ["job", "register", str(job_file), "--aggregator", f"{host}:{port}",
                                       "--key-file", str(other), "--timeout", "0.05"])
    assert status == 2 and f"no answer from {host}:{port} to the registration of job" in err
    assert "same operator key" in err and not aggregator.model.jobs.entries


@pytest.mark.parametrize("content, message", [
    (b"{", "not JSON"),
    (b"[]", "not a JSON object"),
    (b'{"job": 1, "token": "0000000000000001", "slots": 1, "members": [], "extra": 1}', "field extra is not one"),
    (b'{"job": 1, "token": "1", "slots": 1, "members": []}', 'field token: "1" is not 16 lowercase hex digits'),
    (b'{"job": 1, "token": "0000000000000001", "members": []}', "field slots is missing"),
    (b"\xff", "not JSON"),
])
def test_register_refuses_a_bad_job_file_before_sending(capsys, tmp_path, key_file, content, message):
    path = tmp_path / "job.json"
    path.write_bytes(content)
    status, _, err = one_line(capsys, ["job", "register", str(path), "--aggregator", "127.0.0.1:9",
                                       "--key-file", str(key_file)])
    assert status == 2 and err.startswith(f"inwire job: job file {path}: ") and message in err, err


def test_register_refuses_a_missing_or_special_job_file(capsys, tmp_path, key_file):
    status, _, err = one_line(capsys, ["job", "register", str(tmp_path / "none.json"), "--aggregator", "127.0.0.1:9"])
    assert status == 2 and "cannot read job file" in err
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    status, _, err = one_line(capsys, ["job", "register", str(fifo), "--aggregator", "127.0.0.1:9"])
    assert status == 2 and "a FIFO, not a regular file" in err


@pytest.mark.parametrize("argv, message", [
    (["--aggregator", "127.0.0.1"], "--aggregator '127.0.0.1' is not HOST:PORT"),
    (["--aggregator", "127.0.0.1:0"], "--aggregator '127.0.0.1:0': port 0"),
    (["--aggregator", "127.0.0.1:9", "--ttl", "3601"], r"--ttl must lie in \[1, 3,600\], got 3,601"),
    (["--aggregator", "127.0.0.1:9", "--timeout", "0"], "--timeout"),
])
def test_register_refuses_bad_options_in_one_line(capsys, job_file, key_file, argv, message):
    status, _, err = one_line(capsys, ["job", "register", str(job_file), "--key-file", str(key_file), *argv])
    assert status == 2 and re.search(message, err), err


def test_key_file_errors_are_one_line(capsys, job_file, tmp_path):
    short = tmp_path / "short.key"
    short.write_bytes(b"abc")
    for argv in (["job", "register", str(job_file), "--aggregator", "127.0.0.1:9", "--key-file", str(short)],
                 ["serve", "--listen", "127.0.0.1:0", "--key-file", str(short)]):
        status, _, err = one_line(capsys, argv)
        assert status == 2 and f"operator key {short}: 3 bytes, not the 32 of a key" in err, err
    status, _, err = one_line(capsys, ["serve", "--listen", "127.0.0.1:0", "--key-file", str(tmp_path)])
    assert status == 2 and f"{tmp_path}: a folder, not a regular file (the operator key is read from" in err


def test_serve_registered_only(tmp_path, key_file):
    """`inwire serve --no-unregistered` takes the registration of a job and drops a version 2 frame; its counters
    line shows both."""
    process = subprocess.Popen([sys.executable, "-m", "inwire", "serve", "--golden", "--listen", "127.0.0.1:0",
                                "--no-unregistered", "--key-file", str(key_file)], stderr=subprocess.PIPE, text=True)
    try:
        line = process.stderr.readline()
        assert "registered jobs only" in line, line
        port = int(line.split("udp://127.0.0.1:")[1].split(",")[0])
        control.register(("127.0.0.1", port), control.new_job(["127.0.0.1:5000"], slots=2), key=KEY)
        frame = build_frames(np.asarray([1], dtype=np.int32), opcode=Opcode.CONTRIBUTION, sender=0, fanin=2, job=3,
                             round=1, clique=0, slot=5, chunk=0, group=0xEF490001)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as client:
            client.sendto(payload_of(frame[0]), ("127.0.0.1", port))
            # queued after the frame: once it is answered, the frame was decided
            control.teardown(("127.0.0.1", port), 1, key=KEY)
    finally:
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=30)
    final = next(line for line in err.splitlines() if "final counters" in line)
    counters = parse_counters_line(final)
    assert counters["drop_version"] == 1 and counters["jobs_registered"] == 1 and counters["frames_in"] == 1
