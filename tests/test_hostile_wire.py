"""Frames are untrusted: no datagram can make an aggregator loop, reflect, evict a newer result or grow its
tables without bound. Each service is driven by its decision (`handle`) inside a simulated network that
delivers every datagram it sends to the service at that address, so a loop shows as a count that never
stops growing (the network gives up at DELIVERY_CAP); one test reproduces the self-loop on real sockets.
Every case runs on the fast path and on the golden model (`--golden`)."""

import random
import socket
import time

import numpy as np
import pytest

from inwire.datagram import ip_int, payload_of, stats_request
from inwire.model import Aggregator, AggregatorConfig
from inwire.packets import build_frames
from inwire.protocol import Opcode
from inwire.serve import SoftwareAggregator, serving_in_thread

ENGINES = ["fast", "golden"]
DELIVERY_CAP = 10_000
VICTIM = ("127.0.0.9", 4000)
"""The address a forger puts in its datagrams' source (on the wire, a spoofed IPv4 source)."""
GROUP = 0xEF490001


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Network:
    """Services on loopback addresses that share one port, as the aggregators of a tree do; every datagram
    a service sends is delivered to the service at its destination, or kept in `outside`."""

    def __init__(self, engine, hosts, **options):
        self.port = free_port()
        self.services = {}
        for host in hosts:
            service = SoftwareAggregator((host, self.port), engine=engine, log=lambda line: None, **options)
            self.services[service.address] = service
        self.outside = []
        self.deliveries = 0
        self.to_itself = 0

    def address(self, host):
        return (host, self.port)

    def send(self, payload, source, destination):
        """Deliver `payload` and everything it causes; returns the number of deliveries to services."""
        queue, delivered = [(bytes(payload), tuple(source), tuple(destination))], 0
        while queue and delivered < DELIVERY_CAP:
            body, source, destination = queue.pop(0)
            service = self.services.get(destination)
            if service is None:
                self.outside.append((body, destination))
                continue
            delivered += 1
            sends = service.handle(body, source, 0)
            self.to_itself += sum(tuple(to) == service.address for _, to in sends)
            queue += [(bytes(out), service.address, to) for out, to in sends]
        self.deliveries += delivered
        return delivered

    def counters(self, host):
        return self.services[self.address(host)].counters()

    def close(self):
        for service in self.services.values():
            service.close()


@pytest.fixture
def network():
    made = []

    def make(engine, hosts=("127.0.0.2", "127.0.0.3", "127.0.0.4"), **options):
        made.append(Network(engine, hosts, **options))
        return made[-1]
    yield make
    for instance in made:
        instance.close()


def forged(hop1=0, hop2=0, fanin=1, sender=0, opcode=Opcode.CONTRIBUTION, slot=0, chunk=0, round=1, job=66,
           expect=0, hop1_expect=0, values=(1, 2, 3), status=None):
    hops = {name: ip_int(value) if isinstance(value, str) else value for name, value in (("hop1", hop1),
                                                                                          ("hop2", hop2))}
    frame = build_frames(np.asarray(values, dtype=np.int64).reshape(1, -1), opcode=opcode, sender=sender, fanin=fanin,
                         job=job, round=round, clique=0, slot=slot, chunk=chunk, group=GROUP, expect=expect,
                         hop1_expect=hop1_expect, status=status, **hops)
    payload = payload_of(frame[0])
    return payload[:86] if opcode == Opcode.RESULT_REQUEST else payload


@pytest.mark.parametrize("unicast", [True, False], ids=["unicast", "multicast"])
@pytest.mark.parametrize("engine", ENGINES)
def test_a_partial_to_itself_ends_at_the_one_refused_frame(network, engine, unicast):
    """A fan-in-1 contribution whose hop1 is the service itself: refused (drop_route), nothing sent, not
    even to the forged source."""
    net = network(engine, unicast=unicast)
    me = net.address("127.0.0.2")
    assert net.send(forged(hop1="127.0.0.2"), VICTIM, me) == 1
    counters = net.counters("127.0.0.2")
    assert (counters["frames_in"], counters["drop_route"], counters["accumulated"]) == (1, 1, 0)
    assert net.outside == []


@pytest.mark.parametrize("engine", ENGINES)
def test_two_services_naming_each_other_end_after_one_refused_frame(network, engine):
    """A names B as hop1 and B again as hop2's target of A: the frame to A that would bounce between them
    (hop2 = A) is refused at A; a partial that B would send back to A, its own source, is refused at B."""
    net = network(engine, unicast=True)
    a, b = net.address("127.0.0.2"), net.address("127.0.0.3")
    assert net.send(forged(hop1="127.0.0.3", hop2="127.0.0.2"), VICTIM, a) == 1
    assert net.counters("127.0.0.2")["drop_route"] == 1
    assert net.send(forged(hop1="127.0.0.2", slot=1, fanin=1), a, b) == 1
    assert net.counters("127.0.0.3")["drop_route"] == 1
    assert net.outside == []


@pytest.mark.parametrize("engine", ENGINES)
def test_a_result_goes_around_a_forged_cycle_of_parents_at_most_once(network, engine):
    """Three forged frames make A's parent B, B's parent C and C's parent A for one slot (each is a legal
    two-level route on its own): the result that C's root answer starts is relayed once by each service and
    then refused, since a relay earns no new partial."""
    net = network(engine, unicast=True)
    hosts = ("127.0.0.2", "127.0.0.3", "127.0.0.4")
    for here, up in zip(hosts, hosts[1:] + hosts[:1], strict=True):
        net.send(forged(hop1=up, fanin=1, expect=1), VICTIM, net.address(here))
    assert net.deliveries < 30
    relayed = sum(net.counters(host)["results_relayed"] for host in hosts)
    assert relayed <= 2 * len(hosts)
    assert len([to for _, to in net.outside if to == VICTIM]) <= 2 * len(hosts)


@pytest.mark.parametrize("engine", ENGINES)
def test_random_forged_routes_never_loop(network, engine):
    """Datagrams with routes, sources and opcodes picked at random among three services, a victim and
    nonsense: every one ends within a few deliveries, and no service ever sends to itself, even where a
    datagram's forged source is that service (its result copy to that member is refused and counted)."""
    net = network(engine, unicast=True)
    rnd = random.Random(5)
    hosts = ["127.0.0.2", "127.0.0.3", "127.0.0.4"]
    places = hosts + ["127.0.0.9", "10.99.0.1", 0]
    for _ in range(300):
        here = rnd.choice(hosts)
        frame = forged(hop1=rnd.choice(places), hop2=rnd.choice(places), fanin=rnd.choice((1, 2)),
                       sender=0, opcode=rnd.choice((Opcode.CONTRIBUTION, Opcode.PARTIAL, Opcode.RESULT_REQUEST)),
                       slot=rnd.randrange(3), round=rnd.randrange(1, 4), expect=rnd.choice((0, 1)),
                       status=0)
        source = rnd.choice([net.address(host) for host in hosts] + [VICTIM])
        assert net.send(frame, source, net.address(here)) <= 8
    assert net.to_itself == 0
    assert all(net.counters(host)["drop_route"] > 0 for host in hosts)
    assert sum(net.counters(host)["sends_refused"] for host in hosts) > 0


def test_the_self_loop_on_real_sockets_ends_at_one_frame():
    """The reproduction: `inwire serve --unicast` on 127.0.0.2, one forged datagram naming it as hop1. For a
    second nothing more arrives anywhere, and the service counts one frame."""
    for engine in ENGINES:
        server = SoftwareAggregator(("127.0.0.2", 0), unicast=True, engine=engine, log=lambda line: None)
        with serving_in_thread(server), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as forger:
            forger.bind(("127.0.0.9", 0))
            forger.settimeout(1.0)
            forger.sendto(forged(hop1="127.0.0.2"), server.address)
            with pytest.raises(TimeoutError):
                forger.recv(65535)
            deadline = time.monotonic() + 1
            while server.counters()["frames_in"] < 1 and time.monotonic() < deadline:
                time.sleep(0.01)
            counters = server.counters()
            assert (counters["frames_in"], counters["drop_route"]) == (1, 1), (engine, counters)


@pytest.mark.parametrize("upstream, refused", [(None, True), ("10.99.0.0/16", False)])
@pytest.mark.parametrize("engine", ENGINES)
def test_partials_go_only_within_the_upstream_prefix(network, engine, upstream, refused):
    """By default a service on 127.0.0.2 sends partials within 127.0.0.0/24 only: a frame naming 10.99.0.1
    (any address a forger likes) is refused, unless the operator named that prefix."""
    net = network(engine, hosts=("127.0.0.2",), upstream=upstream)
    net.send(forged(hop1="10.99.0.1"), VICTIM, net.address("127.0.0.2"))
    counters = net.counters("127.0.0.2")
    assert counters["drop_route"] == int(refused)
    assert [to for _, to in net.outside] == ([] if refused else [("10.99.0.1", net.port)])


@pytest.mark.parametrize("engine", ENGINES)
def test_stats_are_answered_only_on_this_machine_and_the_upstream_prefix(engine):
    """A stats reply is longer than its request: a request with a forged source outside this machine and the
    upstream prefix would make the service an amplifier, so it is refused and counted."""
    server = SoftwareAggregator(("127.0.0.2", 0), engine=engine, log=lambda line: None, stats_from="192.0.2.0/24")
    try:
        request = stats_request(job=1)
        assert server.handle(request, ("198.51.100.7", 9)) == []
        assert server.counters()["stats_refused"] == 1 and server.counters()["frames_in"] == 0
        (reply, to), = server.handle(request, ("192.0.2.8", 9))
        assert to == ("192.0.2.8", 9) and reply[3] == Opcode.STATS_REPLY
        (reply, to), = server.handle(request, ("127.0.0.5", 9))
        assert to == ("127.0.0.5", 9)
    finally:
        server.close()


@pytest.mark.parametrize("engine", ENGINES)
def test_what_a_service_learns_is_bounded_by_its_slots(engine):
    """100,000 one-member contributions, each of another job and group (a flood of owners), leave at most
    one learned owner per slot."""
    slots = 16
    server = SoftwareAggregator(("127.0.0.2", 0), unicast=True, engine=engine, slots=slots, log=lambda line: None)
    try:
        rnd = random.Random(3)
        count = 100_000 if engine == "fast" else 10_000
        for job in range(count):
            frame = build_frames(np.array([[1]]), sender=0, fanin=1, job=job, round=1, clique=0,
                                 slot=rnd.randrange(slots), chunk=0, group=0xEF000000 | job & 0xFFFFFF)
            server.handle(payload_of(frame[0]), (f"127.1.{job >> 8 & 255}.{job & 255}", 5000))
        assert len(server.learned) <= slots and len(server.parents) <= slots
        assert all(len(members) <= 64 and len(children) <= 64 for _, members, children in server.learned.values())
    finally:
        server.close()


def stale_sequence():
    """Window W = 4: chunks 0 and 2W share slot 0. Both members complete chunk 0, then chunk 8; member 0
    misses chunk 8's result; a delayed copy of member 1's chunk 0 arrives; member 0 retransmits chunk 8."""
    def contribution(sender, chunk, values):
        frame = build_frames(np.asarray([values], dtype=np.int64), sender=sender, fanin=2, job=5, round=3, clique=0,
                             slot=0, chunk=chunk, group=GROUP)
        return payload_of(frame[0])
    chunk0 = [contribution(0, 0, [1, 2]), contribution(1, 0, [3, 4])]
    chunk8 = [contribution(0, 8, [10, 20]), contribution(1, 8, [30, 40])]
    return [*chunk0, *chunk8, chunk0[1], chunk8[0]]


@pytest.mark.parametrize("engine", ["model", *ENGINES])
def test_a_stale_duplicate_never_evicts_a_stored_result(engine):
    members = [("127.0.0.1", 5000), ("127.0.0.1", 5001)]
    stream = stale_sequence()
    senders = [0, 1, 0, 1, 1, 0]
    if engine == "model":
        from inwire.datagram import wrap
        aggregator = Aggregator(AggregatorConfig())
        address = ("10.73.87.1", aggregator.config.port)
        answers = [aggregator.process(wrap(payload, members[s], address, bytes(6)))
                   for payload, s in zip(stream, senders, strict=True)]
        last = [payload_of(frame) for frame in answers[-1]]
        counters = aggregator.stats()
    else:
        server = SoftwareAggregator(("127.0.0.2", 0), engine=engine, unicast=True, log=lambda line: None)
        try:
            answers = [server.handle(payload, members[s], 0) for payload, s in zip(stream, senders, strict=True)]
            last = [bytes(body) for body, _ in answers[-1]]
            counters = server.counters()
        finally:
            server.close()
    assert counters["drop_stale"] == 1 and counters["drop_collision"] == 0
    assert counters["answered"] == 1
    (result,), = [last]
    assert result[3] == Opcode.RESULT
    assert np.frombuffer(result, ">i4", 2, 86).tolist() == [40, 60]

