"""`inwire stream` through a path that drops, duplicates, reorders and delays datagrams both ways (10 % each):
every run is bit-exact. Delayed copies of a chunk arrive after the chunk that shares its slot completed; they
are stale and must never evict that newer result (docs/protocol.md, `drop_stale`)."""

import heapq
import json
import random
import select
import socket
import threading
import time

import pytest

from inwire.cli import main
from inwire.diagnosis import diagnose
from inwire.serve import SoftwareAggregator, serving_in_thread
from schedules import write_schedule

RUNS = 10
MAX_ISLAND_SOCKETS = 64


class ImpairedPath:
    """A UDP relay on loopback between islands and one aggregator (which sees the relay's addresses, not the
    islands': the runs are unregistered). Each datagram, either way, is dropped,
    duplicated (the copy delayed), held back until the next datagram of its direction has gone (reordered)
    or delayed, each with probability `p`, drawn from a seeded generator; delays are uniform in `delay_s`.
    Every island address gets its own socket towards the aggregator, so that results find their way back.
    Bounded: at most two sends per datagram, at most MAX_ISLAND_SOCKETS islands, and it stops on `stop()`."""

    def __init__(self, aggregator, seed, p=0.1, delay_s=(0.02, 0.3)):
        self.aggregator = tuple(aggregator)
        self.rnd = random.Random(seed)
        self.p, self.delay_s = p, delay_s
        self.front = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.front.bind(("127.0.0.5", 0))
        self.address = self.front.getsockname()
        self.towards = {}
        """island address -> its socket towards the aggregator."""
        self.island_of = {}
        self.timers = []
        self.held = {}
        self.counts = dict.fromkeys(("passed", "dropped", "duplicated", "reordered", "delayed"), 0)
        self._stop = threading.Event()
        self._sequence = 0

    def _later(self, at, sock, payload, destination):
        self._sequence += 1
        heapq.heappush(self.timers, (at, self._sequence, sock, payload, destination))

    def _forward(self, direction, sock, payload, destination):
        now = time.monotonic()
        pick = self.rnd.random()
        if pick < self.p:
            self.counts["dropped"] += 1
            return
        if pick < 2 * self.p:
            self.counts["duplicated"] += 1
            self._later(now + self.rnd.uniform(*self.delay_s), sock, payload, destination)
        elif pick < 3 * self.p and direction not in self.held:
            self.counts["reordered"] += 1
            self.held[direction] = (sock, payload, destination)
            return
        elif pick < 4 * self.p:
            self.counts["delayed"] += 1
            self._later(now + self.rnd.uniform(*self.delay_s), sock, payload, destination)
            return
        self.counts["passed"] += 1
        sock.sendto(payload, destination)
        if direction in self.held:
            held_sock, held_payload, held_destination = self.held.pop(direction)
            held_sock.sendto(held_payload, held_destination)

    def serve(self):
        while not self._stop.is_set():
            wait = 0.05
            if self.timers:
                wait = max(0.0, min(wait, self.timers[0][0] - time.monotonic()))
            readable = select.select([self.front, *self.towards.values()], [], [], wait)[0]
            for sock in readable:
                payload, source = sock.recvfrom(65535)
                if sock is self.front:
                    back = self.towards.get(source)
                    if back is None:
                        if len(self.towards) >= MAX_ISLAND_SOCKETS:
                            continue
                        back = self.towards[source] = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                        back.bind(("127.0.0.5", 0))
                        self.island_of[back] = source
                    self._forward("up", back, payload, self.aggregator)
                else:
                    self._forward("down", self.front, payload, self.island_of[sock])
            while self.timers and self.timers[0][0] <= time.monotonic():
                _, _, sock, payload, destination = heapq.heappop(self.timers)
                sock.sendto(payload, destination)

    def stop(self):
        self._stop.set()

    def close(self):
        for sock in (self.front, *self.towards.values()):
            sock.close()


@pytest.mark.parametrize("engine", ["fast", "golden"])
def test_every_run_through_a_bad_path_is_bit_exact(tmp_path, capsys, engine):
    schedule = write_schedule(tmp_path / "schedule.json")
    outcomes = []
    for seed in range(RUNS if engine == "fast" else 3):
        server = SoftwareAggregator(("127.0.0.2", 0), unicast=True, engine=engine, log=lambda line: None)
        path = ImpairedPath(server.address, seed)
        thread = threading.Thread(target=path.serve, daemon=True)
        thread.start()
        try:
            with serving_in_thread(server):
                # 16 chunks per island and a window of 4: chunk j and j + 8 share a slot.
                code = main(["stream", "--target", f"udp://{path.address[0]}:{path.address[1]}", "--schedule",
                             str(schedule), "--rounds", "3", "--elements", "4096", "--chunk", "256", "--window",
                             "4", "--timeout-ms", "100", "--seed", str(seed), "--json", "--unregistered"])
                report = json.loads(capsys.readouterr().out)
                counters = server.counters()
        finally:
            path.stop()
            thread.join(timeout=5)
            path.close()
        outcomes.append((seed, code, report["bit_exact"], report["retransmits"], counters["drop_stale"],
                         dict(path.counts)))
    for seed, _code, exact, retransmits, stale, counts in outcomes:
        print(f"{engine} seed {seed}: bit_exact {exact}, {retransmits} retransmits, {stale} stale, path {counts}")
    assert all(code == 0 and exact for _, code, exact, *_ in outcomes), outcomes
    # The path did what it is for: stale copies reached the aggregator and were refused.
    assert sum(stale for *_, stale, _ in outcomes) > 0


def test_the_diagnosis_names_stale_duplicates():
    report = {"finished": False, "retransmits": 40, "dropped": 0, "chunk": 256, "slots_needed": 48,
              "results_checked": 10, "aggregator": {"drop_stale": 7, "results_emitted": 12}}
    lines = diagnose(report, "udp", 3)
    assert any("dropped 7 frames as drop_stale: delayed or duplicated copies" in line for line in lines), lines
    assert not any("another job" in line for line in lines)
