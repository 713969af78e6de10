"""Members of registered jobs (issue 36) over loopback against a real `SoftwareAggregator` holding job tables:
two `inwire stream` runs with their default (random) jobs on one aggregator at once, a forged result sent
straight to a member's socket, and another job's flood while a run goes on."""

import socket
import threading
import time

import numpy as np
import pytest

from inwire import client
from inwire.cli import main
from inwire.client import CliqueKey, UdpMember, job_slots
from inwire.control import JobLease, new_job
from inwire.datagram import payload_of
from inwire.packets import build_frames
from inwire.protocol import JOB_VERSION, VERSION, Opcode
from inwire.serve import SoftwareAggregator, serving_in_thread
from inwire.stream import StreamConfig, registration_patience
from inwire.transport import UdpTransport
from schedules import write_schedule

CHUNK, WINDOW = 4, 2


@pytest.fixture(autouse=True)
def operator_key(tmp_path, monkeypatch):
    """The service and the islands share an operator key of the test's own."""
    monkeypatch.setenv("INWIRE_KEY_FILE", str(tmp_path / "operator.key"))


def registered_service():
    """A service that takes registered jobs (and, as by default, unregistered frames beside them)."""
    return SoftwareAggregator(("127.0.0.1", 0), engine="golden", registered=True, log=lambda line: None)


def stream(schedule, target, *options):
    return main(["stream", "--target", target, "--schedule", str(schedule), "--rounds", "3", "--elements", "300",
                 "--chunk", "64", "--timeout-ms", "50", "--retries", "100", *options])


def test_two_default_jobs_on_one_aggregator_both_finish_bit_exact(tmp_path):
    """The issue's two trainings that corrupted each other: each run registers a random job of its own (never
    a fixed default), so both run at once on one aggregator and both are bit-exact."""
    schedule = write_schedule(tmp_path / "schedule.json")
    codes = []
    with serving_in_thread(registered_service()) as server:
        target = "udp://{}:{}".format(*server.address)
        runs = [threading.Thread(target=lambda: codes.append(stream(schedule, target))) for _ in range(2)]
        for run in runs:
            run.start()
        for run in runs:
            run.join(120)
        counters = server.counters()
    assert codes == [0, 0]
    assert counters["jobs_registered"] == 2 and counters["jobs_left"] == 2 and counters["jobs_torn_down"] == 0
    assert counters["accumulated"] > 0 and counters["drop_collision"] == 0


def forged_result(entry, key, chunk, token, count=CHUNK):
    """A whole, well-formed result of `chunk` for `key`'s sum, of elements no member contributed."""
    frame = build_frames(np.full((1, count), 7, dtype=np.int32), version=JOB_VERSION, opcode=Opcode.RESULT,
                         fanin=key.fanin, exponent=key.exponent, contributors=key.fanin,
                         bitmap=(1 << key.fanin) - 1, job=entry.job, round=key.round, clique=key.clique,
                         slot=client.slot(key.round, key.clique, chunk // CHUNK, WINDOW, 1), chunk=chunk,
                         token=token, status=0)
    return payload_of(frame[0])


@pytest.fixture(params=["compiled", "python"])
def socket_path(request, monkeypatch):
    if request.param == "compiled" and client.compiled is None:
        pytest.fail("the compiled kernel (inwire._kernel) is not built")
    if request.param == "python":
        monkeypatch.setattr(client, "compiled", None)
    return request.param


@pytest.mark.parametrize("forgery", ["another source", "another token"])
def test_a_forged_result_is_refused_counted_and_changes_no_sum(socket_path, forgery):
    """While member 0's first window waits for member 1, results of those chunks with the job's id, round and
    clique reach its socket: from another address with the job's token, or from the aggregator's own address
    with another token. The member refuses and counts each one, and its sums are the clique's."""
    elements = 4 * CHUNK
    vectors = [np.arange(elements, dtype=np.int32), 1000 + np.arange(elements, dtype=np.int32)]
    with serving_in_thread(registered_service()) as server:
        members = [UdpMember(server.address, chunk=CHUNK, window=WINDOW, timeout_s=0.05, deadline_s=20)
                   for _ in vectors]
        entry = new_job([member.address for member in members], job_slots(1, WINDOW, 2))
        for member in members:
            member.join(entry)
        key = CliqueKey(entry.job, round=3, clique=0, group=0, fanin=2, exponent=0)
        sums = {}
        try:
            with JobLease(server.address, entry):
                first = threading.Thread(target=lambda: sums.setdefault(0, members[0].sum(key, 0, vectors[0])))
                first.start()
                while server.counters()["accumulated"] < WINDOW:
                    time.sleep(0.01)
                token = entry.token if forgery == "another source" else entry.token ^ 1
                forged = [forged_result(entry, key, CHUNK * index, token) for index in range(WINDOW)]
                with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as stranger:
                    sender = stranger if forgery == "another source" else server.sock
                    for payload in forged * 3:
                        sender.sendto(payload, members[0].address)
                time.sleep(0.1)  # the forgeries are read before the clique completes
                sums[1] = members[1].sum(key, 1, vectors[1])
                first.join(30)
        finally:
            for member in members:
                member.close()
    expected = vectors[0] + vectors[1]
    assert np.array_equal(sums[0][0], expected) and np.array_equal(sums[1][0], expected)
    assert members[0].results_refused >= len(forged) * 3
    assert members[1].results_refused == 0


def test_without_a_job_entry_a_member_sends_version_2_and_takes_results_from_anywhere():
    """Unregistered use (the lab, trees through hop fields): version 2 frames, no token, no source check."""
    key = CliqueKey(job=5, round=0, clique=0, group=0xEF000001, fanin=1, exponent=0)
    payload = client.Contributions(np.arange(4, dtype=np.int32), 0, key, CHUNK, WINDOW)[0]
    assert payload[2] == VERSION and payload[-4 * 4 - 8:-4 * 4] == bytes(8)
    registered = CliqueKey(job=5, round=0, clique=0, group=0, fanin=1, exponent=0, token=0x1234)
    payload = client.Contributions(np.arange(4, dtype=np.int32), 0, registered, CHUNK, WINDOW)[0]
    assert payload[2] == JOB_VERSION and payload[-4 * 4 - 8:-4 * 4] == (0x1234).to_bytes(8, "big")


class Flood:
    """Another job's traffic at `rate` datagrams a second until stopped: version 2 contributions that claim
    every slot of the aggregator for the run's job id with ever newer rounds (the issue's reclaiming
    attacker), and version 3 frames of that job id with a guessed token."""

    def __init__(self, aggregator, job, slots, rate=300):
        self.aggregator, self.job, self.slots, self.rate = aggregator, job, slots, rate
        self.sent = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def datagrams(self, round_):
        common = dict(opcode=Opcode.CONTRIBUTION, fanin=2, job=self.job, round=round_, clique=0, chunk=0)
        slots = np.arange(self.slots)
        elements = np.full((self.slots, 64), 99, dtype=np.int32)
        unregistered = map(payload_of, build_frames(elements, slot=slots, group=0xEF000001, **common))
        guessed = map(payload_of, build_frames(elements, slot=slots, version=JOB_VERSION, token=0x5EED, **common))
        # Interleaved, so that however short the run, both kinds arrive while it lasts.
        return [bytes(payload) for pair in zip(unregistered, guessed) for payload in pair]

    def run(self):
        round_ = 1 << 20
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            while not self.stop.is_set():
                round_ += 1
                for payload in self.datagrams(round_):
                    if self.stop.wait(1 / self.rate):
                        return
                    sock.sendto(payload, self.aggregator)
                    self.sent += 1

    def __enter__(self):
        """Flooding, a whole round of it sent already."""
        self.thread.start()
        while self.sent < 4 * self.slots and self.thread.is_alive():
            time.sleep(0.05)
        return self

    def __exit__(self, *_):
        self.stop.set()
        self.thread.join(5)


def test_another_job_s_flood_leaves_a_run_bit_exact(tmp_path):
    """300 datagrams a second of another job's frames at every slot the run uses, with the run's job id and
    newer rounds, from before the run until after it: refused (their version 2 slots are the job's, their
    token is not), and the run is bit-exact. What the flood left in the job's range before it was registered
    is gone: registering a job empties its range."""
    schedule = write_schedule(tmp_path / "schedule.json")
    with serving_in_thread(registered_service()) as server:
        with Flood(server.address, job=77, slots=64):
            code = stream(schedule, "udp://{}:{}".format(*server.address), "--job", "77", "--rounds", "6",
                          "--retries", "400")
            counters = server.counters()
    assert code == 0
    assert counters["drop_slot"] > 0 and counters["drop_token"] > 0


def test_a_registration_waits_as_long_as_the_run_asks_for_counters_within_what_control_takes():
    """As long as a round waits for a chunk's result (timeout x retries, at least 0.9 s), in tries of the
    timeout (at least 0.3 s); no more retries than `control.register` takes, however many --retries."""
    assert registration_patience(StreamConfig(timeout_ms=50, retries=4)) == (0.3, 2)
    assert registration_patience(StreamConfig()) == (0.3, 16)
    assert registration_patience(StreamConfig(timeout_ms=60_000, retries=1000)) == (60.0, 100)


@pytest.mark.parametrize("batch_io", [True, False], ids=["batched", "python"])
def test_a_stream_island_takes_datagrams_only_from_its_target(batch_io):
    """`UdpTransport.bind_islands` (a registered run): each island's socket is bound towards its target, and
    what comes from anywhere else is refused and counted, on either I/O path."""
    import asyncio

    if batch_io and client.compiled is None:
        pytest.fail("the compiled kernel (inwire._kernel) is not built")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as target, \
            socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as stranger:
        target.bind(("127.0.0.1", 0))
        transport = UdpTransport({"A": target.getsockname()}, batch_io=batch_io)
        (member,) = transport.bind_islands().values()
        got = []

        async def exchange():
            await transport.start(lambda island, payload: got.append(bytes(payload)),
                                  lambda island, buffer, sizes, slot: got.extend(
                                      bytes(buffer[i * slot:i * slot + size]) for i, size in enumerate(sizes) if size))
            for _ in range(3):
                stranger.sendto(b"forged", member)
            target.sendto(b"from the target", member)
            for _ in range(50):
                await asyncio.sleep(0.01)
                if got and transport.results_refused == 3:
                    break
            transport.close()

        asyncio.run(exchange())
    assert member[0] == "127.0.0.1"
    assert got == [b"from the target"] and transport.results_refused == 3


def test_an_unregistered_island_at_a_registered_only_aggregator_is_told_why():
    """Unregistered frames at an aggregator that counts registered jobs only (inwire serve's default) are all
    dropped, roll calls too: the island's failure names that cause and the way out, in one line."""
    service = SoftwareAggregator(("127.0.0.1", 0), engine="golden", registered=True, unregistered=False,
                                 log=lambda line: None)
    with serving_in_thread(service) as server:
        member = UdpMember(server.address, job=5, timeout_s=0.05, deadline_s=1.0)
        try:
            with pytest.raises(client.ClientError) as failed:
                member.sum(CliqueKey(job=5, round=0, clique=0, group=0xEF000001, fanin=2, exponent=0), 0, [1, 2, 3])
        finally:
            member.close()
        counters = server.counters()
    message = str(failed.value)
    assert "\n" not in message and "registered jobs only" in message and "--unregistered" in message
    assert counters["drop_version"] > 0
