"""`inwire stream` asks the aggregator for its counters before it starts: a service stalled for a moment then
(descheduled, paging; here SIGSTOP) answers a later request, within the time a round waits for a chunk, and a
service that never answers is named with what the stream saw, not blamed for a cause it cannot know."""

import os
import re
import signal
import socket
import subprocess
import sys
import threading

from inwire.cli import main
from inwire.netns import await_listening, package_environment
from schedules import write_schedule

STALL_S = 1.5
"""Longer than the three 0.3 s waits a stream gave the first stats request before."""


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_a_service_stalled_when_the_stream_starts_is_waited_for(tmp_path, capsys):
    schedule = write_schedule(tmp_path / "schedule.json")
    port = free_port()
    service = subprocess.Popen([sys.executable, "-m", "inwire", "serve", "--listen", f"127.0.0.1:{port}",
                                "--unicast", "--golden"], stderr=subprocess.PIPE, text=True, env=package_environment())
    resume = threading.Timer(STALL_S, os.kill, (service.pid, signal.SIGCONT))
    try:
        await_listening(service, "inwire serve")
        os.kill(service.pid, signal.SIGSTOP)
        resume.start()
        status = main(["stream", "--target", f"udp://127.0.0.1:{port}", "--schedule", str(schedule),
                       "--rounds", "2", "--elements", "300"])
        out, err = capsys.readouterr()
        assert status == 0, err
        assert "bit_exact: true" in out
    finally:
        resume.cancel()
        os.kill(service.pid, signal.SIGCONT)
        service.terminate()
        service.communicate(timeout=10)


def test_a_service_that_never_answers_is_named_with_what_was_seen(tmp_path, capsys):
    """A socket that reads and never replies: the stream asks for as long as a round waits for a chunk's
    result (here the 0.9 s floor: 50 ms x 4 retries is less) and says how many requests went unanswered."""
    schedule = write_schedule(tmp_path / "schedule.json")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as silent:
        silent.bind(("127.0.0.1", 0))
        status = main(["stream", "--target", f"udp://127.0.0.1:{silent.getsockname()[1]}", "--schedule",
                       str(schedule), "--timeout-ms", "50", "--retries", "4", "--unregistered"])
    err = capsys.readouterr().err
    assert status == 2
    assert err.count("\n") == 1
    assert re.fullmatch(r"inwire stream: no answer from the target: no reply to [2-9] stats requests in \d+\.\d s "
                        r"\(inwire serve answers them only from its own machine and its --stats-from prefix, and a "
                        r"stopped or stalled one answers none\)\n", err), err


def test_a_service_that_never_answers_a_registration_is_named(tmp_path, capsys):
    """A registered run asks to register its job as long as it would ask for the counters, then names the
    aggregator that never answered."""
    schedule = write_schedule(tmp_path / "schedule.json")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as silent:
        silent.bind(("127.0.0.1", 0))
        port = silent.getsockname()[1]
        status = main(["stream", "--target", f"udp://127.0.0.1:{port}", "--schedule", str(schedule), "--timeout-ms",
                       "50", "--retries", "4", "--job", "9"])
    err = capsys.readouterr().err
    assert status == 2
    assert err == (f"inwire stream: no answer from 127.0.0.1:{port} to the registration of job 9 (is inwire serve "
                   f"running there, with the same operator key?)\n")
