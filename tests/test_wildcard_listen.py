"""A service listening on the wildcard address (`inwire serve --listen 0.0.0.0:P --upstream PREFIX`) relays:
each datagram is decided by the aggregator at the address it arrived on, so a partial of the level below the
root goes up, and nothing goes to any address of the service's own machine at its port.

A wildcard leaf cannot share its port with a root on the same machine (the root's address would be the leaf's
own), so the two run in network namespaces of their own, joined by a veth pair: the root at ROOT_IP, the leaf
at 0.0.0.0 in a namespace where its members reach it on 127.0.0.1 and on LEAF_IP."""

import contextlib
import os
import socket
import subprocess
import time

import numpy as np
import pytest

from inwire.cli import main
from inwire.datagram import parse_result, payload_of
from inwire.netns import inside, unavailable_reason
from inwire.packets import build_frames
from inwire.protocol import Opcode
from inwire.serve import SoftwareAggregator, serving_in_thread

REASON = unavailable_reason()
needs_namespaces = pytest.mark.skipif(REASON is not None, reason=f"network namespaces unavailable: {REASON}")
ROOT_IP, LEAF_IP = "10.78.0.1", "10.78.0.2"
PORT = 18775
GROUP = 0xEF490001
ENGINES = [dict(engine="fast"), dict(engine="golden")]
ENGINE_IDS = ["c", "golden"]


def _ip(*args):
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=10)


@pytest.fixture
def namespaces():
    """(root namespace, leaf namespace), joined by a veth pair; removed afterwards."""
    tag = f"iwwl{os.getpid() % 100000}"
    root, leaf = f"{tag}r", f"{tag}l"
    made = []
    try:
        for namespace in (root, leaf):
            _ip("netns", "add", namespace)
            made.append(namespace)
            _ip("-n", namespace, "link", "set", "lo", "up")
        _ip("-n", root, "link", "add", "eth0", "type", "veth", "peer", "name", "eth0", "netns", leaf)
        for namespace, address in ((root, ROOT_IP), (leaf, LEAF_IP)):
            _ip("-n", namespace, "addr", "add", f"{address}/24", "dev", "eth0")
            _ip("-n", namespace, "link", "set", "eth0", "up")
        yield root, leaf
    finally:
        for namespace in made:
            subprocess.run(["ip", "netns", "del", namespace], capture_output=True, timeout=10)


@contextlib.contextmanager
def served_in(namespace, listen, **options):
    """A service bound and serving inside `namespace` (its local addresses are that namespace's)."""
    with inside(namespace):
        server = SoftwareAggregator(listen, log=lambda line: None, **options)

    def serve():
        with inside(namespace):
            server.serve()
    with serving_in_thread(server, serve):
        yield server


def member_socket(namespace):
    with inside(namespace):
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.bind(("0.0.0.0", 0))
    sock.settimeout(2.0)
    return sock


def contribution(sender, values, fanin=2, expect=0b11, hop1=ROOT_IP, slot=0):
    frame = build_frames(np.asarray(values, dtype=np.int64), opcode=Opcode.CONTRIBUTION, sender=sender,
                         fanin=fanin, job=7, round=1, clique=0, slot=slot, chunk=0, group=GROUP, expect=expect,
                         hop1=int.from_bytes(socket.inet_aton(hop1), "big"), hop1_expect=expect)
    return payload_of(frame[0])


def settled(server, frames):
    """The service's counters once it has counted `frames` datagrams (or after a second)."""
    deadline = time.monotonic() + 1
    while server.counters()["frames_in"] < frames and time.monotonic() < deadline:
        time.sleep(0.01)
    return server.counters()


@needs_namespaces
@pytest.mark.parametrize("options", ENGINES, ids=ENGINE_IDS)
def test_a_wildcard_leaf_relays_its_partial_to_the_root_and_the_result_back(namespaces, options):
    """Two members reach the 0.0.0.0 leaf on two of its addresses (127.0.0.1 and LEAF_IP); the leaf's level
    completes, its partial goes to the root, and the root's result comes back through the leaf to both."""
    root_ns, leaf_ns = namespaces
    with (served_in(root_ns, (ROOT_IP, PORT), unicast=True, **options) as root,
          served_in(leaf_ns, ("0.0.0.0", PORT), unicast=True, upstream=f"{ROOT_IP}/32", **options) as leaf):
        members = [member_socket(leaf_ns) for _ in range(2)]
        try:
            members[0].sendto(contribution(0, [1, 2, 3]), ("127.0.0.1", PORT))
            members[1].sendto(contribution(1, [10, 20, 30]), (LEAF_IP, PORT))
            results = [parse_result(member.recv(65535)) for member in members]
        except TimeoutError:
            pytest.fail(f"no result reached the members; leaf {leaf.counters()}")
        finally:
            for member in members:
                member.close()
        for result in results:
            assert result is not None and result.elements.tolist() == [11, 22, 33]
        counters = settled(leaf, 2)
        assert (counters["drop_route"], counters["partials_emitted"], counters["results_relayed"]) == (0, 1, 2)
        assert settled(root, 1)["results_emitted"] == 1


@needs_namespaces
@pytest.mark.parametrize("options", ENGINES, ids=ENGINE_IDS)
def test_a_wildcard_service_never_sends_a_partial_to_its_own_machine(namespaces, options):
    """With every address allowed upstream, a route naming the address a datagram arrived on is refused by
    the aggregator's route rule (drop_route), and one naming another address of the machine at the service's
    port is refused by the service (sends_refused): nothing reaches the service from itself."""
    _, leaf_ns = namespaces
    with served_in(leaf_ns, ("0.0.0.0", PORT), upstream="0.0.0.0/0", **options) as leaf:
        member = member_socket(leaf_ns)
        try:
            member.sendto(contribution(0, [1], fanin=1, expect=1, hop1="127.0.0.1", slot=0), ("127.0.0.1", PORT))
            member.sendto(contribution(0, [1], fanin=1, expect=1, hop1=LEAF_IP, slot=1), ("127.0.0.1", PORT))
            settled(leaf, 2)
        finally:
            member.close()
        time.sleep(0.1)  # a partial sent to itself would have arrived by now
        counters = leaf.counters()
        assert (counters["frames_in"], counters["drop_route"], counters["accumulated"],
                counters["sends_refused"]) == (2, 1, 1, 1)


def test_a_cosimulation_on_the_wildcard_address_is_refused_in_one_line(capsys):
    """The gateware is built for one address, so it cannot be the aggregator at each arrival address."""
    assert main(["serve", "--sim", "verilator", "--listen", "0.0.0.0:0"]) == 2
    error = capsys.readouterr().err
    assert error == "inwire serve: a co-simulation's gateware is built for one address: listen on it, not 0.0.0.0:0\n"
