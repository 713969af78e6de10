"""Slot leases in `inwire serve`: each way one job wedged the service (issue 14), then the next job's round.

Without a lease (`lease=0`, what the service did before) the next round fails on slots the wedge left
unfinished; with a short lease it completes bit-exact, without a restart, and the service counts the
slots it freed in `leases_expired`. Both engines run it: the fast path and the golden model.
"""

import socket
import threading

import numpy as np
import pytest

from inwire.datagram import payload_of, stats_request
from inwire.packets import build_frames
from inwire.protocol import Opcode
from inwire.serve import SoftwareAggregator
from inwire.stream import StreamConfig, load_plan, run_stream
from inwire.transport import UdpTransport
from schedules import write_schedule

LEASE_MS = 100
NEXT_ROUND = StreamConfig(rounds=2, elements=300, chunk=128, timeout_ms=30, job=2, seed=9)
"""The correct round after the wedge: 25 retransmissions 30 ms apart outlast the lease several times."""


@pytest.fixture
def serving():
    started = []

    def start(**options):
        server = SoftwareAggregator(("127.0.0.1", 0), unicast=True, log=lambda line: None, **options)
        thread = threading.Thread(target=server.serve, daemon=True)
        thread.start()
        started.append((server, thread))
        return server
    yield start
    for server, thread in started:
        server.stop()
        thread.join(5)
        server.close()


def stream(server, plan, config):
    return run_stream(plan, config, UdpTransport({island: server.address for island in plan.islands}))


def send_contributions(server, jobs, slots):
    """One contribution of a clique of two per job, to slot job mod `slots`: each leaves a slot half full."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for job in jobs:
            frame = build_frames(np.arange(4, dtype=np.int32), opcode=Opcode.CONTRIBUTION, sender=0, fanin=2,
                                 job=job, round=0, clique=0, slot=job % slots, chunk=0, group=0xEF490009)
            sock.sendto(payload_of(frame[0]), server.address)
        # The service answers a stats request after every datagram before it: it has taken them all.
        sock.settimeout(5)
        sock.sendto(stats_request(), server.address)
        assert sock.recv(65536)


def abandoned_lossy_round(server, plan):
    report = stream(server, plan, StreamConfig(rounds=1, elements=300, chunk=128, loss=0.6, retries=1,
                                               timeout_ms=30, job=1, seed=3))
    assert not report["finished"]


def stray_contribution(server, plan):
    send_contributions(server, [server.config.slots], server.config.slots)


def flood_of_job_ids(server, plan):
    send_contributions(server, range(1000, 2000), server.config.slots)


WEDGES = {"abandoned_lossy_round": abandoned_lossy_round, "stray_contribution": stray_contribution,
          "flood_of_job_ids": flood_of_job_ids}


@pytest.mark.parametrize("engine", ["fast", "golden"])
@pytest.mark.parametrize("wedge", list(WEDGES))
def test_the_next_round_is_bit_exact_after_a_wedge(serving, tmp_path, wedge, engine):
    server = serving(engine=engine, lease=LEASE_MS)
    plan = load_plan(write_schedule(tmp_path / "schedule.json"))
    WEDGES[wedge](server, plan)
    report = stream(server, plan, NEXT_ROUND)
    assert report["bit_exact"], report["rounds"]
    assert report["aggregator"]["leases_expired"] > 0


@pytest.mark.parametrize("wedge", list(WEDGES))
def test_without_a_lease_the_wedge_stays(serving, tmp_path, wedge):
    """The wedge as it was: the same next round fails, on collisions with the slots left unfinished."""
    server = serving(lease=0)
    plan = load_plan(write_schedule(tmp_path / "schedule.json"))
    WEDGES[wedge](server, plan)
    report = stream(server, plan, NEXT_ROUND)
    assert not report["finished"]
    assert report["aggregator"]["drop_collision"] > 0 and report["aggregator"]["leases_expired"] == 0
