"""`inwire stream` against a real `inwire serve` on loopback names why a round failed: the counter that
moved and what to do about it."""

import re
import signal
import socket
import subprocess
import sys
import threading

import numpy as np
import pytest

from inwire.cli import main
from inwire.datagram import endpoint_drops, payloads_of, socket_drops, stats_request
from inwire.diagnosis import diagnose
from inwire.packets import build_frames
from inwire.protocol import COUNTERS, DROP_COUNTERS, Opcode
from inwire.stream import clique_group
from schedules import write_schedule


@pytest.fixture
def serve():
    """Start `inwire serve` on a free loopback port with extra options; returns its udp:// target."""
    started = []

    def start(*options):
        process = subprocess.Popen([sys.executable, "-m", "inwire", "serve", "--listen", "127.0.0.1:0", *options],
                                   stderr=subprocess.PIPE, text=True)
        started.append(process)
        line = process.stderr.readline()
        port = re.search(r"udp://127\.0\.0\.1:(\d+)", line)
        assert port, line
        return f"udp://127.0.0.1:{port.group(1)}"
    start.processes = started
    yield start
    for process in started:
        process.send_signal(signal.SIGINT)
        process.communicate(timeout=10)


@pytest.fixture
def schedule(tmp_path):
    return write_schedule(tmp_path / "schedule.json")


def stream(capsys, target, schedule, *options):
    code = main(["stream", "--target", target, "--schedule", str(schedule), "--rounds", "1", "--elements", "600",
                 "--timeout-ms", "50", "--retries", "2", *options])
    return code, capsys.readouterr().err


def test_chunk_above_the_servers_maximum_is_named(serve, schedule, capsys):
    code, err = stream(capsys, serve("--unicast"), schedule, "--chunk", "300")
    assert code == 1
    assert "drop_count: --chunk 300 is above its maximum elements per frame" in err
    assert "--max-elements 300" in err


def test_a_server_without_unicast_on_one_machine_is_named(serve, schedule, capsys):
    # Unregistered: a registered job's results go to its members whatever --unicast says.
    code, err = stream(capsys, serve("--unregistered"), schedule, "--unregistered")
    assert code == 1
    assert "none reached the islands" in err and "start inwire serve with --unicast" in err


def test_too_few_slots_are_named(serve, schedule, capsys):
    # Unregistered: a registered job's quota is refused at its registration (tests/test_stream.py).
    code, err = stream(capsys, serve("--unicast", "--slots", "8", "--unregistered"), schedule, "--elements", "2048",
                       "--unregistered")
    assert code == 1
    assert "drop_slot" in err and "--slots 32" in err


def test_a_collision_with_another_job_names_the_slot(serve, schedule, capsys):
    target = serve("--unicast", "--unregistered")
    host, port = target[len("udp://"):].split(":")
    # Another job's first of two contributions to slot 0, whose second never comes: the slot stays claimed.
    stray = build_frames(np.zeros((1, 256), dtype=np.int32), opcode=Opcode.CONTRIBUTION, sender=0, fanin=2,
                         job=77, round=0, clique=0, slot=0, group=clique_group(0, 0))
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.sendto(payloads_of(stray)[0], (host, int(port)))
    # Unregistered: a registered job's slots are a range no other job's frames touch.
    code, err = stream(capsys, target, schedule, "--job", "5", "--chunk", "256", "--unregistered")
    assert code == 1
    assert "collision with another job on slot 0" in err and "drop_collision" in err


def test_kernel_drops_at_the_servers_socket_are_named(serve, schedule, capsys):
    # A receive buffer of one datagram, and the service stopped while the islands send their first windows
    # of 32 chunks: the kernel must drop most of them (a reader that keeps up would hide the buffer).
    target = serve("--unicast", "--receive-buffer", "1")
    service = serve.processes[-1]
    service.send_signal(signal.SIGSTOP)
    resume = threading.Timer(0.5, service.send_signal, (signal.SIGCONT,))
    resume.start()
    try:
        code, err = stream(capsys, target, schedule, "--elements", "8192", "--window", "32", "--retries", "25")
    finally:
        resume.join()
        service.send_signal(signal.SIGCONT)
    assert "the kernel dropped" in err and "at the aggregator's socket" in err and "--receive-buffer" in err
    assert code in (0, 1)


def test_socket_drops_count_what_the_kernel_dropped():
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as receiver, \
            socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sender:
        receiver.bind(("127.0.0.1", 0))
        receiver.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1)
        for _ in range(50):
            sender.sendto(bytes(1000), receiver.getsockname())
        dropped = socket_drops(receiver)
        if dropped is None:
            pytest.skip("this OS does not report UDP socket drops (/proc/net/udp)")
        assert dropped >= 40
        assert endpoint_drops(receiver.getsockname()) == dropped


def test_serve_counts_the_datagrams_the_kernel_dropped_before_it(tmp_path):
    process = subprocess.Popen([sys.executable, "-m", "inwire", "serve", "--listen", "127.0.0.1:0",
                                "--receive-buffer", "100000"], stderr=subprocess.PIPE, text=True)
    port = int(re.search(r"udp://127\.0\.0\.1:(\d+)", process.stderr.readline()).group(1))
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for _ in range(1000):
            sock.sendto(bytes(1100), ("127.0.0.1", port))
    # A stats request behind the burst: once it is answered, every datagram before it was read or dropped.
    requests = 0
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as asker:
        asker.settimeout(0.5)
        for _ in range(20):
            asker.sendto(stats_request(), ("127.0.0.1", port))
            requests += 1
            try:
                asker.recv(2048)
                break
            except TimeoutError:
                continue
    process.send_signal(signal.SIGINT)
    final = process.communicate(timeout=10)[1].strip().splitlines()[-1]
    counters = dict(re.findall(r"(\w+)=(\d+)", final))
    if "kernel_drops" not in counters:
        pytest.skip("this OS does not report UDP socket drops (/proc/net/udp)")
    assert int(counters["kernel_drops"]) > 0
    # Every datagram sent, the burst and the stats requests, was either counted by the aggregator or dropped
    # by the kernel.
    assert int(counters["frames_in"]) + int(counters["kernel_drops"]) == 1000 + requests


def test_retransmissions_that_loss_on_purpose_explains_need_no_diagnosis(serve, schedule, capsys):
    code, err = stream(capsys, serve("--unicast"), schedule, "--loss", "0.05", "--retries", "25", "--timeout-ms",
                       "300", "--rounds", "2")
    assert code == 0
    assert [line for line in err.splitlines() if "rounds done" not in line] == []


def test_drops_of_retransmissions_are_counted_apart_from_faults(serve, schedule, capsys):
    """Under loss on purpose the islands retransmit, and the aggregator drops copies of members it summed
    already: a healthy run. Serve's final line says `drops=0` and counts those apart
    (`retransmission_drops=`), and so does the stream's summary ("aggregator drops 0")."""
    target = serve("--unicast")
    code = main(["stream", "--target", target, "--schedule", str(schedule), "--rounds", "2", "--elements", "600",
                 "--timeout-ms", "300", "--retries", "25", "--loss", "0.2", "--seed", "3"])
    out = capsys.readouterr().out
    assert code == 0
    summary = re.search(r"aggregator drops (\d+) \(not counting (\d+) retransmission drops\)", out)
    assert summary and summary.group(1) == "0" and int(summary.group(2)) > 0, out
    process, = serve.processes
    process.send_signal(signal.SIGINT)
    final = process.communicate(timeout=10)[1].strip().splitlines()[-1]
    counters = {name: int(value) for name, value in re.findall(r"(\w+)=(\d+)", final)}
    assert counters["drops"] == 0 and counters["drop_duplicate"] > 0, final
    assert counters["retransmission_drops"] == counters["drop_duplicate"] + counters.get("drop_no_result", 0)


def failed_report(**moved):
    """A stream report of a round given up after --loss dropped 2 datagrams, the aggregator's counters having
    moved by `moved`."""
    counters = dict.fromkeys(COUNTERS, 0) | moved
    return {"finished": False, "retransmits": 9, "dropped": 2, "chunk": 256, "slots_needed": 48,
            "results_checked": 1, "aggregator": counters}


def test_drops_that_retransmissions_cause_are_no_cause_of_a_failure():
    """A member summed already and a result asked for before it exists are what retransmissions cause by
    themselves: a failed round with only those drops is put down to its retransmissions running out."""
    lines = diagnose(failed_report(drop_duplicate=5, drop_no_result=3), "udp", 3)
    assert lines == ["--loss dropped 2 datagrams on purpose and a chunk ran out of retransmissions; raise --retries"]


def test_every_other_drop_is_named_with_its_remedy_or_its_meaning():
    """Each drop counter but those two gets a line of its own, naming how many frames and the counter, and
    its remedy from the disposition table (with the run's --chunk, slots and failed slot filled in) or its
    meaning."""
    for name in sorted(set(DROP_COUNTERS) - {"drop_duplicate", "drop_no_result"}):
        lines = diagnose(failed_report(**{name: 7}), "udp", 3, failed_slot=5)
        assert len(lines) == 1 and f"dropped 7 frames as {name}" in lines[0], (name, lines)
        assert "{" not in lines[0], lines
    assert "--chunk 256" in diagnose(failed_report(drop_count=1), "udp", 3)[0]
    assert "--slots 48" in diagnose(failed_report(drop_slot=1), "udp", 3)[0]
    assert "on slot 5," in diagnose(failed_report(drop_collision=1), "udp", 3, failed_slot=5)[0]


def test_a_round_given_up_under_loss_names_retries(serve, schedule, capsys):
    code, err = stream(capsys, serve("--unicast"), schedule, "--loss", "0.6", "--retries", "1")
    assert code == 1
    assert "--loss dropped" in err and "raise --retries" in err


def test_a_registered_run_whose_results_were_refused_names_the_refusals_not_unicast():
    """A registered job's results reach its members whatever --unicast says; what keeps them off is the
    islands' refusal, each kind named as what it is (datagrams from another address than the aggregator's,
    results without the job's token), never with --unregistered, which would drop the job's protection."""
    report = {**failed_report(results_emitted=12), "results_checked": 0, "registered": True, "results_refused": 12,
              "results_from_elsewhere": 9}
    elsewhere, token = diagnose(report, "udp", 3)
    assert elsewhere.startswith("the islands refused 9 datagrams from another address than the aggregator's they "
                                "sent to: a registered job's results count only from there")
    assert token.startswith("the islands refused 3 results without their job's version and token")
    assert diagnose({**report, "results_from_elsewhere": 12}, "udp", 3) == [elsewhere.replace("9", "12", 1)]
    assert not any("--unregistered" in line for line in diagnose(report, "udp", 3))
    unregistered = {**failed_report(results_emitted=12), "results_checked": 0}
    assert any("--unicast" in line for line in diagnose(unregistered, "udp", 3))
