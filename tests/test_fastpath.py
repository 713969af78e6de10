"""The fast software aggregator against the golden model: the same datagrams into both, the same answers,
destinations and counters out, datagram for datagram.

Two streams: the fuzzer's mutated frames (tb/fuzz/mutate.py: damaged headers, lengths, limits, random
bytes) as UDP payloads, and a stream of interleaved cliques built here (saturation at both int32 limits,
duplicates, retransmissions to completed slots, reclaims by newer rounds, collisions, shape mismatches,
result and stats requests, truncated, extended and bit-flipped datagrams), also timed: arrival times with
gaps around the slot lease and around a whole turn of the 16-bit lease timer, from just below 2**16 on, and
datagrams left out, so that abandoned slots expire. The fast path is the compiled kernel's decider: without
it these tests skip, and under CI=true they fail.
Reduction-tree traffic (protocol v2: partials, member bitmaps, levels, routes of up to three levels,
version 1 frames mixed in) is compared with the model aggregator by aggregator, payload and destination,
and through a chain of three with a lost partial; datagrams at the edge of every check are compared one by
one. Deciders made with one number wrong (a counter index, a flag, an opcode, a limit, a field offset, the
lease, the timer's width) show that the comparison catches those, and a partial routed to the wrong hop
that it catches that.
Registered jobs (protocol v3) are compared on the same job tables installed in both (a unicast job, a
multicast one and a tree with a parent and children), with members, strangers, wrong tokens, partials from
children, results from the parent, floods of another job, versions 1 and 2 aimed at the jobs' slots, and
jobs removed and installed again in between: every disposition, output payload, destination and counter.
`INWIRE_FUZZ_FRAMES` scales the streams as it does for the fuzz tests.
"""

import dataclasses
import os
import random

import numpy as np
import pytest

from inwire import fastpath
from inwire.datagram import PAYLOAD_OFFSET, header_struct, ip_int, ip_str, payload_of, wrap
from inwire.jobs import JobTableError
from inwire.packets import build_frames, frame_field
from inwire.protocol import (
    FRAME_OFFSETS,
    INT32_MAX,
    INT32_MIN,
    JOB_VERSION,
    MAX_RESULT_ELEMENTS,
    Disposition,
    Opcode,
    clique_mask,
)
from inwire.serve import SoftwareAggregator

PEERS = [("127.0.0.1", 40000 + i) for i in range(5)] + [("127.0.0.2", 40000)]
DATAGRAMS = int(os.environ.get("INWIRE_FUZZ_FRAMES", 4000))


def require_kernel():
    if fastpath.compiled is None:
        if os.environ.get("CI") == "true":
            pytest.fail("the compiled fast path inwire._kernel is not built (make setup builds it)")
        pytest.skip("the compiled fast path inwire._kernel is not built")


@pytest.fixture
def pair():
    made = []

    def make(**options):
        require_kernel()
        golden = SoftwareAggregator(("127.0.0.1", 0), engine="golden", log=lambda line: None, **options)
        fast = SoftwareAggregator(("127.0.0.1", 0), engine="fast", log=lambda line: None, **options)
        # Both must believe they are the same service: results and stats name its address and port.
        fast.address, fast.config = golden.address, golden.config
        fast.fast.config = golden.config
        made.extend((golden, fast))
        return golden, fast
    yield make
    for server in made:
        server.close()


def first_difference(golden, fast, stream):
    """Index and description of the first datagram whose answers or counters differ, or None. A stream
    holds (payload, peer) or (payload, peer, arrival time in lease ticks); an untimed one is all at tick 0,
    since each service's own clock would let a lease run out at another datagram than the other's."""
    for index, (payload, peer, *now) in enumerate(stream):
        now = now[0] if now else 0
        difference = differs(golden, fast, golden.handle(payload, peer, now), fast.handle(payload, peer, now))
        if difference:
            return index, difference
    return None


def differs(golden, fast, want, got):
    """How the golden service's sends `want` and the fast one's `got`, or their counters, differ; None if not."""
    want, got = ([(bytes(body), tuple(to)) for body, to in sends] for sends in (want, got))
    if want != got:
        return f"answers differ: golden {want!r:.300} fast {got!r:.300}"
    if golden.counters() != fast.counters():
        return f"counters differ: golden {golden.counters()} fast {fast.counters()}"
    return None


def mutated_stream(config, seed, count):
    from mutate import Mutator

    rnd = random.Random(seed)
    return [(payload_of(frame), rnd.choice(PEERS)) for _, frame in Mutator(config, seed=seed).frames(count)]


class CliqueStream:
    """Interleaved cliques on few slots, with every kind of trouble a service sees."""

    peers = PEERS

    def __init__(self, seed, slots, max_elements):
        self.rnd = random.Random(seed)
        self.rng = np.random.default_rng(seed)
        self.slots, self.max_elements = slots, max_elements
        self.rounds = [1] * slots
        self.pending = []
        self.sent = []

    def payload(self, values, **fields):
        frame = build_frames(np.asarray(values, dtype=np.int64).reshape(1, -1), **fields)
        return payload_of(frame[0])

    def elements(self, count):
        pick = self.rnd.random()
        if pick < 0.25:
            # At the limits: sums saturate, some come back from the limit (MAX + MAX - MAX gives 0).
            return self.rng.choice([INT32_MAX, INT32_MIN, INT32_MAX - 1, INT32_MIN + 1, 1, -1, 0], count)
        if pick < 0.4:
            return self.rng.integers(2**30, 2**31, count) * self.rng.choice([1, -1])
        return self.rng.integers(-1000, 1000, count)

    def clique(self):
        rnd = self.rnd
        fanin = rnd.randint(1, 5)
        count = rnd.choice((1, 2, rnd.randint(1, self.max_elements), self.max_elements))
        slot = rnd.randrange(self.slots + 1)  # one past the last slot now and then
        self.rounds[slot % self.slots] += 1
        round_ = self.rounds[slot % self.slots]
        job = 7
        if rnd.random() < 0.15:
            job, round_ = rnd.choice(((8, round_), (7, round_ - 2), (7, (round_ + 2**31) & 0xFFFFFFFF)))
        # Now and then a version 1 clique: summed alike, answered in version 1.
        fields = dict(opcode=Opcode.CONTRIBUTION, fanin=fanin, job=job, round=round_, clique=rnd.randrange(3),
                      slot=slot, chunk=rnd.randrange(4) * count, exponent=rnd.randint(-3, 3),
                      group=0xEF000000 | rnd.randrange(1, 4), version=rnd.choice((1, 2, 2, 2)))
        members = [self.payload(self.elements(count), sender=s, **fields) for s in range(fanin)]
        extra = [rnd.choice(members) for _ in range(rnd.randrange(3))]
        if rnd.random() < 0.3:
            extra.append(self.payload(self.elements(count), sender=rnd.randrange(fanin),
                                      **{**fields, "exponent": fields["exponent"] + 1}))
        if rnd.random() < 0.4:
            request = dict(fields, opcode=Opcode.RESULT_REQUEST, sender=rnd.randrange(fanin))
            # A request is the bare header; its count names the slot's vector.
            extra.append(self.payload(np.zeros(count), **request)[:86])
        return members + extra

    def damaged(self):
        rnd = self.rnd
        payload = bytearray(rnd.choice(self.sent) if self.sent else bytes(86))
        kind = rnd.randrange(6)
        if kind == 0:
            del payload[rnd.randrange(len(payload)):]
        elif kind == 1:
            payload += bytes(rnd.randrange(1, 9))
        elif kind == 2:
            at = rnd.randrange(min(len(payload), 40)) if payload else 0
            if payload:
                payload[at] ^= 1 << rnd.randrange(8)
        elif kind == 3 and len(payload) > 3:
            payload[3] = rnd.randrange(8)
        elif kind == 4 and len(payload) > 25:
            payload[24:26] = rnd.randrange(65536).to_bytes(2, "big")
        else:
            payload = bytearray(rnd.randrange(256) for _ in range(rnd.randrange(120)))
        return bytes(payload)

    def next(self):
        rnd = self.rnd
        pick = rnd.random()
        if pick < 0.03:
            payload = self.payload(np.zeros(0), opcode=Opcode.STATS_REQUEST, sender=rnd.randrange(256),
                                   job=rnd.randrange(2**32), version=rnd.choice((1, 2)))
        elif pick < 0.15:
            payload = self.damaged()
        else:
            # A few cliques in flight at once, their datagrams interleaved.
            while len(self.pending) < 3:
                self.pending.append(self.clique())
            members = rnd.choice(self.pending)
            payload = members.pop(rnd.randrange(len(members)))
            self.pending = [m for m in self.pending if m]
            self.sent = (self.sent + [payload])[-50:]
        return payload, rnd.choice(self.peers)

    def stream(self, count):
        return [self.next() for _ in range(count)]

    def timed_stream(self, count, lease):
        """Datagrams with arrival times: mostly a tick or two apart, now and then a pause of about the
        lease (one tick either side of it included) or of a whole turn of the 16-bit lease timer (two ticks
        either side: a slot idle that long looks idle for the remainder); one in ten left out, so that slots
        stay unfinished. Times start just below 2**16 and are absolute, so they cross the wrap again and
        again."""
        rnd, now, timed = self.rnd, 2**16 - 3 * lease, []
        while len(timed) < count:
            payload, peer = self.next()
            if rnd.random() < 0.1:
                continue
            pick = rnd.random()
            if pick < 0.05:
                now += rnd.choice((lease - 1, lease, lease + 1, 2 * lease, 2**16 + rnd.randrange(-2, 3)))
            else:
                now += rnd.randrange(3)
            timed.append((payload, peer, now))
        return timed


@pytest.mark.parametrize("unicast", [True, False], ids=["unicast", "multicast"])
def test_fast_path_equals_the_model_on_mutated_datagrams(pair, unicast):
    golden, fast = pair(unicast=unicast, slots=4, max_elements=32)
    stream = mutated_stream(golden.config, seed=11 + unicast, count=DATAGRAMS)
    assert first_difference(golden, fast, stream) is None
    counters = fast.counters()
    assert counters["frames_in"] == DATAGRAMS and counters["accumulated"] > 0
    assert sum(value for name, value in counters.items() if name.startswith("drop_")) > DATAGRAMS // 10


@pytest.mark.parametrize("slots, max_elements", [(4, 32), (6, 2048)])
@pytest.mark.parametrize("unicast", [True, False], ids=["unicast", "multicast"])
def test_fast_path_equals_the_model_on_interleaved_cliques(pair, unicast, slots, max_elements):
    golden, fast = pair(unicast=unicast, slots=slots, max_elements=max_elements)
    count = DATAGRAMS if max_elements <= 256 else DATAGRAMS // 4
    stream = CliqueStream(seed=slots + unicast, slots=slots, max_elements=max_elements).stream(count)
    assert first_difference(golden, fast, stream) is None
    counters = fast.counters()
    # The stream reaches what it is meant to: saturation, reclaims, stored answers, every drop it aims at.
    for name in ("saturations", "slots_reclaimed", "answered", "drop_duplicate", "drop_mismatch", "drop_collision",
                 "drop_no_result", "drop_slot", "drop_length", "results_emitted"):
        assert counters[name] > 0, name


@pytest.mark.parametrize("unicast", [True, False], ids=["unicast", "multicast"])
def test_fast_path_equals_the_model_on_timed_cliques_with_leases(pair, unicast):
    lease = 20
    golden, fast = pair(unicast=unicast, slots=4, max_elements=32, lease=lease)
    stream = CliqueStream(seed=30 + unicast, slots=4, max_elements=32).timed_stream(DATAGRAMS, lease)
    assert first_difference(golden, fast, stream) is None
    counters = fast.counters()
    for name in ("leases_expired", "slots_reclaimed", "drop_collision", "results_emitted"):
        assert counters[name] > 0, name


def test_fast_path_equals_the_model_when_members_send_from_the_service_s_own_address(pair):
    """Unicast copies never go to the service itself: members whose datagrams come from its own address (a
    forged source) get none, and each copy left out is counted, on either path, as the golden service does."""
    golden, fast = pair(unicast=True, slots=4, max_elements=32)
    stream = [(payload, golden.address if index % 5 == 0 else peer)
              for index, (payload, peer) in enumerate(CliqueStream(seed=8, slots=4, max_elements=32).stream(DATAGRAMS))]
    assert first_difference(golden, fast, stream) is None
    counters = fast.counters()
    assert counters["sends_refused"] > 0 and counters["unicast_copies"] > 0


def first_batched_difference(golden, fast, stream, size=7):
    """`first_difference` with the fast service taking the stream a recvmmsg batch of `size` at a time, as
    `inwire serve` reads it (`handle_batch`, every datagram of a batch at its first one's arrival time), and
    the golden one datagram by datagram at the same times: the first batch whose answers (in order) or
    counters differ, or None."""
    slot = max(len(payload) for payload, *_ in stream) + 1
    for first in range(0, len(stream), size):
        part = stream[first:first + size]
        now = part[0][2] if len(part[0]) > 2 else 0
        buffer = bytearray(slot * len(part))
        for index, (payload, *_) in enumerate(part):
            buffer[index * slot:index * slot + len(payload)] = payload
        want = [send for payload, peer, *_ in part for send in golden.handle(payload, peer, now)]
        got = fast.handle_batch(buffer, [(len(payload), peer) for payload, peer, *_ in part], slot, now)
        difference = differs(golden, fast, want, got)
        if difference:
            return first, difference
    return None


def batched_streams(config, address, kind):
    if kind == "mutated":
        return mutated_stream(config, seed=5, count=DATAGRAMS)
    if kind == "leases":
        return CliqueStream(seed=31, slots=4, max_elements=32).timed_stream(DATAGRAMS, config.lease)
    stream = CliqueStream(seed=9, slots=4, max_elements=32).stream(DATAGRAMS)
    if kind == "own_address":  # a forged source now and then: copies to it are left out and counted
        return [(payload, address if index % 5 == 0 else peer)
                for index, (payload, peer) in enumerate(stream)]
    return stream


@pytest.mark.parametrize("kind", ["mutated", "cliques", "leases", "own_address"])
@pytest.mark.parametrize("unicast", [True, False], ids=["unicast", "multicast"])
def test_a_batch_at_a_time_equals_the_model_datagram_by_datagram(pair, unicast, kind):
    """`inwire serve` decides a recvmmsg batch at a time (with the compiled decider, the batch's common case in
    one call, `Decider.serve_batch`, and each datagram whose answer the service sends itself in Python, in
    between): the same answers in the same order, and the same counters, as the golden service's datagram by
    datagram."""
    golden, fast = pair(unicast=unicast, slots=4, max_elements=32, lease=20)
    assert first_batched_difference(golden, fast, batched_streams(golden.config, golden.address, kind)) is None
    counters = fast.counters()
    assert counters["frames_in"] == DATAGRAMS and counters["accumulated"] > 0
    assert counters["unicast_copies"] > 0 if unicast else counters["results_emitted"] > 0
    if kind == "own_address" and unicast:
        assert counters["sends_refused"] > 0


def test_a_batch_that_loses_a_copy_or_skips_a_datagram_is_caught(pair, monkeypatch):
    """The batched comparison can fail: a batch call whose last copy goes missing, or one that steps over the
    datagram it stopped at, is caught."""
    for tamper in ("copy", "skip"):
        golden, fast = pair(unicast=True, slots=4, max_elements=32)
        real = fast.fast.serve_batch

        def tampered(buffer, batch, slot, start, now, own, sends, real=real, tamper=tamper):
            index, decided, refused, copies = real(buffer, batch, slot, start, now, own, sends)
            if tamper == "copy" and copies:
                sends.pop()
            if tamper == "skip" and index < len(batch) - 1:
                index += 1
            return index, decided, refused, copies

        monkeypatch.setattr(fast.fast, "serve_batch", tampered)
        stream = CliqueStream(seed=9, slots=4, max_elements=32).stream(DATAGRAMS)
        assert first_batched_difference(golden, fast, stream) is not None, tamper


def test_saturation_is_per_contribution(pair):
    """MAX + MAX - MAX: the sum clips at MAX after the second member, so the third brings it to 0."""
    golden, fast = pair(slots=2, max_elements=4)
    stream = CliqueStream(0, 2, 4)
    fields = dict(opcode=Opcode.CONTRIBUTION, fanin=3, job=1, round=1, clique=0, slot=0, chunk=0,
                  group=0xEF000001)
    vectors = [[INT32_MAX, INT32_MIN, 5], [INT32_MAX, INT32_MIN, 6], [-INT32_MAX, INT32_MAX, 7]]
    datagrams = [(stream.payload(v, sender=s, **fields), PEERS[s]) for s, v in enumerate(vectors)]
    assert first_difference(golden, fast, datagrams[:2]) is None
    (result, _), = fast.handle(datagrams[2][0], datagrams[2][1])
    elements = np.frombuffer(result, ">i4", 3, 86)
    assert elements.tolist() == [0, -1, 18] and result[-1] == 1


def test_without_the_kernel_the_golden_model_serves(monkeypatch):
    """No compiled kernel: no fast path (refused by name when asked for), and the service runs the model."""
    from inwire import serve
    from inwire.model import AggregatorConfig

    monkeypatch.setattr(fastpath, "compiled", None)
    monkeypatch.setattr(serve, "compiled", None)
    with pytest.raises(ValueError, match="not built"):
        fastpath.FastAggregator(AggregatorConfig())
    with pytest.raises(serve.ServeError, match="needs the compiled kernel"):
        SoftwareAggregator(("127.0.0.1", 0), engine="fast", log=lambda line: None)
    service = SoftwareAggregator(("127.0.0.1", 0), log=lambda line: None)
    try:
        assert (service.engine, service.fast, service.batch_io) == ("golden", None, False)
        assert service.description == "the golden model"
    finally:
        service.close()


def _set(part, name, value):
    """A tamper of the compiled decider: its `part` ("fields" or "constants") with `name` set to `value(part)`."""
    def tamper(fields, constants):
        table = fields if part == "fields" else constants
        assert name in table, name
        table[name] = value(table)
    return tamper


DECIDER_TAMPERS = {
    # name: (stream the differential test runs, the decider's numbers altered)
    "saturation_counted_as_lease_expiry": ("cliques", _set("constants", "saturations", lambda c: c["leases_expired"])),
    "overflow_flag_lost": ("cliques", _set("constants", "status_overflow", lambda c: 0)),
    "answer_counted_as_accumulation": ("cliques", _set("constants", "answered", lambda c: c["accumulated"])),
    "result_request_opcode_wrong": ("cliques", _set("constants", "result_request", lambda c: c["stats_reply"])),
    "timer_17_bits": ("timed", _set("constants", "time_mask", lambda c: 2**17 - 1)),
    "lease_one_tick_longer": ("timed", None),
    "hop2_read_at_hop1": ("tree", _set("fields", "hop2", lambda f: f["hop1"])),
    "stale_counted_as_collision": ("tree", _set("constants", "drop_stale", lambda c: c["drop_collision"])),
    "runt_limit_one_byte_short": ("edge", _set("constants", "runt_payload", lambda c: c["runt_payload"] - 1)),
    "longest_payload_one_element_longer": ("edge", _set("constants", "max_payload", lambda c: c["max_payload"] + 4)),
    "member_drop_counted_as_token_drop": ("jobs", _set("constants", "drop_member", lambda c: c["drop_token"])),
    "relay_counted_as_answer": ("jobs", _set("constants", "relayed", lambda c: c["answered"])),
    "token_read_2_bytes_early": ("jobs", _set("fields", "token", lambda f: (f["token"][0] - 2, 8))),
    "job_version_read_as_2": ("jobs", _set("constants", "version_job", lambda c: c["version"])),
}


@pytest.mark.parametrize("tamper", DECIDER_TAMPERS)
def test_a_tampered_decider_is_caught(pair, monkeypatch, tamper):
    """The compiled backend is held to the model too: a decider made with one of its numbers wrong (a counter
    index, the overflow flag, an opcode, the timer's width, the lease, a field's offset, a length limit, the
    version of registered jobs) is caught, by the stream that reaches it."""
    require_kernel()
    stream, alter = DECIDER_TAMPERS[tamper]
    if alter is not None:
        original = fastpath.decider_parameters

        def tampered(config):
            fields, constants, decider_config = original(config)
            alter(fields, constants)
            return fields, constants, decider_config
        monkeypatch.setattr(fastpath, "decider_parameters", tampered)
    if stream == "jobs":
        difference = job_difference(JobPair(slots=12, max_elements=16), JobStream(seed=66, max_elements=16).stream(
            DATAGRAMS))
    elif stream == "tree":
        tree = ModelAndFast(ip=AGGREGATOR_IPS[0], slots=4, max_elements=32)
        difference = tree_difference(tree, TreeStream(seed=44, slots=4, max_elements=32).stream(DATAGRAMS))
    elif stream == "edge":
        edges = ModelAndFast(ip=AGGREGATOR_IPS[0], slots=4, max_elements=MAX_RESULT_ELEMENTS)
        difference = tree_difference(edges, [(payload, PEERS[0]) for payload in edge_datagrams(
            AGGREGATOR_IPS[0], ip_int(PEERS[0][0]))])
    else:
        lease = 20 if stream == "timed" else 0
        golden, fast = pair(unicast=False, slots=4, max_elements=32, lease=lease)
        if alter is None:  # the lease, through the configuration the decider is given
            fast.fast.config = dataclasses.replace(golden.config, lease=lease + 1)
        clique = CliqueStream(seed=4, slots=4, max_elements=32)
        datagrams = clique.timed_stream(DATAGRAMS, lease) if stream == "timed" else clique.stream(DATAGRAMS)
        difference = first_difference(golden, fast, datagrams)
    assert difference is not None
    print(f"{tamper}: caught at datagram {difference[0]}: {difference[1][:200]}")


def test_the_decider_refuses_numbers_that_would_take_it_out_of_bounds():
    """A field beyond the header, a counter index beyond the counters, a bitmap narrower than the members or
    another number of slots is refused when the decider is made (or configured), not found out by a datagram;
    so are a decider that was never made and a payload that is no contiguous buffer."""
    from inwire.model import AggregatorConfig

    require_kernel()
    config = AggregatorConfig(slots=4)
    fields, constants, decider_config = fastpath.decider_parameters(config)
    assert fastpath.compiled.Decider(fields, constants, decider_config).slot_key(3) is None
    for part, name, value in (("fields", "chunk", (85, 4)), ("fields", "job", (0, 9)),
                              ("constants", "saturations", constants["counters"]),
                              ("constants", "drop_slot", 1000), ("constants", "max_members", 65),
                              ("constants", "element_bytes", 8), ("constants", "time_mask", 1000)):
        table = {"fields": dict(fields), "constants": dict(constants)}
        table[part][name] = value
        with pytest.raises(ValueError):
            fastpath.compiled.Decider(table["fields"], table["constants"], decider_config)
    fast = fastpath.FastAggregator(config)
    with pytest.raises(ValueError, match="slots"):
        fast.config = dataclasses.replace(config, slots=5)
    with pytest.raises(RuntimeError, match="not made"):
        fastpath.compiled.Decider.__new__(fastpath.compiled.Decider).handle(b"")
    released = memoryview(bytes(100))
    released.release()
    for payload in (released, memoryview(bytes(200))[::2]):
        with pytest.raises(TypeError, match="contiguous"):
            fast.handle(payload)
    assert fast.stats()["frames_in"] == 0


def test_a_missing_kernel_fails_under_ci(monkeypatch):
    monkeypatch.setattr(fastpath, "compiled", None)
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="not built"):
        require_kernel()


def test_batched_io_keeps_each_peer_s_datagrams_whole_and_in_order():
    """send_batch groups runs of equal-sized datagrams to one peer into GSO messages; recv_batch reads them
    back one by one: every receiver gets exactly its payloads, in order, with the sender's address."""
    import socket

    from inwire.datagram import set_receive_buffer

    require_kernel()
    kernel = fastpath.compiled
    receivers = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(2)]
    sender = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        for sock in (*receivers, sender):
            sock.bind(("127.0.0.1", 0))
        for receiver in receivers:
            # Room for every datagram sent: a loss here would be the buffer's, not the batching's.
            set_receive_buffer(receiver, 4 << 20)
        rnd = random.Random(5)
        messages = []
        for index in range(150):
            # Mostly runs of one size to one peer (GSO), broken by other sizes and by the other peer.
            peer = receivers[0] if index % 40 < 30 else receivers[1]
            size = 1110 if index % 17 else rnd.randrange(1, 3000)
            messages.append((index.to_bytes(2, "big") + bytes([index % 256]) * (size - 2), peer.getsockname()))
        start = 0
        while start < len(messages):
            start, refused = kernel.send_batch(sender.fileno(), messages, start)
            assert refused == 0
        slot = 65536
        buffer = bytearray(slot * 64)
        for receiver in receivers:
            want = [payload for payload, to in messages if to == receiver.getsockname()]
            got = []
            while len(got) < len(want):
                batch = kernel.recv_batch(receiver.fileno(), buffer, slot, True)
                assert batch, f"{len(got)} of {len(want)} datagrams arrived"
                for position, (size, peer) in enumerate(batch):
                    assert peer == sender.getsockname()
                    got.append(bytes(buffer[position * slot:position * slot + size]))
            assert got == want
            assert kernel.recv_batch(receiver.fileno(), buffer, slot, False) == []
    finally:
        for sock in (*receivers, sender):
            sock.close()


# Reduction trees (protocol v2): the fast path against the model, payload for payload, one aggregator at a
# time; serve.py's routing of the answers is not in these tests, only what the aggregator decides and sends.

AGGREGATOR_IPS = [0x7F_00_00_0A + i for i in range(3)]
"""Three aggregators on loopback addresses, for routes and chains."""
_GROUP_AT = FRAME_OFFSETS["group"] - PAYLOAD_OFFSET


class ModelAndFast:
    """A model aggregator and a fast one with the same configuration, fed the same datagrams."""

    def __init__(self, **config):
        from inwire.model import Aggregator, AggregatorConfig

        require_kernel()
        self.config = AggregatorConfig(**config)
        self.model = Aggregator(self.config)
        self.fast = fastpath.FastAggregator(self.config)
        self.address = (ip_str(self.config.ip), self.config.port)
        self.sent = []
        """The fast path's answers, in order."""

    def feed(self, payload, peer=PEERS[0], now=None):
        """Both aggregators' (disposition, answer payloads, destinations): the model's frames name theirs,
        the fast path's partial goes to the asker's hop1 and its result to the group."""
        before = self.model.stats()
        frames = self.model.process(wrap(payload, peer, self.address, bytes(6)), now)
        after = self.model.stats()
        want = (next(d for d in Disposition if after[d.name.lower()] > before[d.name.lower()]),
                [payload_of(frame) for frame in frames],
                [frame_field(frame, "ip_dst") for frame in frames
                 if frame_field(frame, "opcode") != Opcode.STATS_REPLY])
        disposition, answer = self.fast.handle(payload, now, peer[0])
        answers = [] if answer is None else [bytes(answer)]
        self.sent += answers
        destinations = [_destination(payload, body) for body in answers if body[3] != Opcode.STATS_REPLY]
        return want, (disposition, answers, destinations)


def _destination(payload, answer):
    """Where the fast path's answer to `payload` goes: a partial up to the asker's hop1, a result to its group."""
    if answer[3] == Opcode.PARTIAL:
        return fastpath.next_hop(payload)
    return int.from_bytes(answer[_GROUP_AT:_GROUP_AT + 4], "big")


def tree_difference(pair, stream):
    """Index and description of the first datagram on which model and fast path differ, or None."""
    for index, (payload, peer, *now) in enumerate(stream):
        want, got = pair.feed(payload, peer, *now)
        if want != got:
            return index, f"golden {want!r:.400} fast {got!r:.400}"
        if pair.model.stats() != pair.fast.stats():
            return index, f"counters differ: golden {pair.model.stats()} fast {pair.fast.stats()}"
    return None


class TreeStream(CliqueStream):
    """Interleaved levels of reduction trees, as one aggregator of the tree sees them: leaf contributions and
    partials of lower levels (with and without a carried overflow) that make up the level, in any order,
    routes of one to three levels, and trouble: overlapping bitmaps, members outside the level, levels with
    members beyond the clique, another level for the same owner, retransmissions and result requests to
    completed slots (from leaves and children, with other routes and versions), version 1 frames with stray
    bytes in their tree fields, and lengths off by the status trailer. Some datagrams come from the
    aggregators a route names (a route back to its source is refused)."""

    peers = PEERS + [(ip_str(ip), 40000) for ip in AGGREGATOR_IPS[1:]]

    def payload(self, values, status=None, **fields):
        frame = build_frames(np.asarray(values, dtype=np.int64).reshape(1, -1), status=status, **fields)
        return payload_of(frame[0])

    def route(self):
        """hop1, hop1_expect, hop2, hop2_expect of a level 0, 1 or 2 levels below the root."""
        rnd = self.rnd
        depth = rnd.choice((0, 1, 1, 2, 2))
        hops = dict(hop1=0, hop1_expect=0, hop2=0, hop2_expect=0)
        if depth >= 1:
            hops.update(hop1=rnd.choice(AGGREGATOR_IPS), hop1_expect=rnd.choice((0, rnd.getrandbits(64))))
        if depth == 2:
            hops.update(hop2=rnd.choice(AGGREGATOR_IPS), hop2_expect=rnd.choice((0, rnd.getrandbits(64))))
        return hops

    def clique(self):
        rnd = self.rnd
        fanin = rnd.choice((1, 2, 3, 5, 8, rnd.randint(1, 64), 64))
        whole = clique_mask(fanin)
        pick = rnd.random()
        if pick < 0.3:
            level, expect = whole, 0
        elif pick < 0.4:
            level = expect = whole
        else:
            level = expect = rnd.getrandbits(fanin) or 1 << rnd.randrange(fanin)
        count = rnd.choice((1, 2, rnd.randint(1, self.max_elements), self.max_elements))
        slot = rnd.randrange(self.slots + 1)
        self.rounds[slot % self.slots] += 1
        job, round_ = 7, self.rounds[slot % self.slots]
        if rnd.random() < 0.25:  # another job's level collides; an older round is stale
            job, round_ = rnd.choice(((8, round_), (7, round_ - 2), (7, (round_ + 2**31) & 0xFFFFFFFF)))
        fields = dict(fanin=fanin, job=job, round=round_, clique=rnd.randrange(3), slot=slot,
                      chunk=rnd.randrange(4) * count, exponent=rnd.randint(-2, 2),
                      group=0xEF000000 | rnd.randrange(1, 4), expect=expect, **self.route())
        members = [m for m in range(fanin) if level >> m & 1]
        rnd.shuffle(members)
        parts = []
        while members:
            cut = rnd.randint(1, len(members))
            parts.append(members[:cut])
            members = members[cut:]
        frames = [self.part(part, count, fields, whole) for part in parts]
        return frames + self.trouble(frames, parts, count, fields, level, whole)

    def part(self, part, count, fields, whole):
        """A leaf contribution (one member; bitmap 0 or its bit; version 1 when the level is the clique) or a
        partial (several members, or one, with or without the overflow flag of a level below)."""
        rnd = self.rnd
        bitmap = sum(1 << m for m in part)
        if len(part) == 1 and rnd.random() < 0.6:
            if fields["expect"] in (0, whole) and rnd.random() < 0.3:
                stray = {name: rnd.getrandbits(bits) for name, bits in (
                    ("bitmap", 64), ("expect", 64), ("hop1", 32), ("hop1_expect", 64), ("hop2", 32))}
                return self.payload(self.elements(count), **{**fields, **stray, "version": 1, "sender": part[0]})
            return self.payload(self.elements(count), **{**fields, "sender": part[0],
                                                         "bitmap": rnd.choice((0, bitmap))})
        if rnd.random() < 0.2:  # a contribution may hold several members too
            return self.payload(self.elements(count), **{**fields, "sender": rnd.choice(part), "bitmap": bitmap})
        return self.payload(self.elements(count), status=rnd.choice((0, 0, 1, 3)), opcode=Opcode.PARTIAL,
                            **{**fields, "sender": rnd.choice(part), "bitmap": bitmap})

    def trouble(self, frames, parts, count, fields, level, whole):
        rnd = self.rnd
        fanin = fields["fanin"]
        extra = [rnd.choice(frames) for _ in range(rnd.randrange(3))]
        sender = rnd.choice(parts[0])
        kinds = rnd.sample(range(11), rnd.randrange(4))
        for kind in kinds:
            if kind == 0:  # overlaps one part and holds another member (or the same members again)
                bitmap = sum(1 << m for m in rnd.choice(parts)) | 1 << rnd.choice([m for p in parts for m in p])
                extra.append(self.payload(self.elements(count), status=0, opcode=Opcode.PARTIAL,
                                          **{**fields, "sender": sender, "bitmap": bitmap}))
            elif kind == 1 and level != whole:  # a member outside the level
                outside = rnd.choice([m for m in range(fanin) if not level >> m & 1])
                extra.append(self.payload(self.elements(count), **{**fields, "sender": outside}))
            elif kind == 2 and fanin < 64:  # a level member not below fan-in
                extra.append(self.payload(self.elements(count), **{**fields, "sender": sender,
                                                                   "expect": level | 1 << rnd.randrange(fanin, 64)}))
            elif kind == 3:  # the same owner with another level
                other = (level ^ 1 << rnd.randrange(fanin)) or whole
                extra.append(self.payload(self.elements(count), **{**fields, "sender": sender, "expect": other,
                                                                   "bitmap": 1 << sender}))
            elif kind == 4:  # a retransmission or request with another route or version
                request = rnd.random() < 0.5
                frame = self.payload(np.zeros(count) if request else self.elements(count), **{
                    **fields, **self.route(), "sender": sender, "version": rnd.choice((1, 2)),
                    "opcode": Opcode.RESULT_REQUEST if request else Opcode.CONTRIBUTION})
                extra.append(frame[:86] if request else frame)
            elif kind == 5:  # a partial without its trailer, a contribution with one
                frame = rnd.choice(frames)
                extra.append(frame[:-4] if frame[3] == Opcode.PARTIAL else frame + bytes(4))
            elif kind == 6:  # a partial's bytes called a contribution, and the reverse
                frame = bytearray(rnd.choice(frames))
                frame[3] = Opcode.CONTRIBUTION if frame[3] == Opcode.PARTIAL else Opcode.PARTIAL
                extra.append(bytes(frame))
            elif kind == 7:  # a version 1 frame to a level that is not the whole clique
                extra.append(self.payload(self.elements(count), **{**fields, "sender": sender, "version": 1}))
            elif kind == 8:  # a partial of the whole level with overflow, once more after completion
                extra.append(self.payload(self.elements(count), status=1, opcode=Opcode.PARTIAL,
                                          **{**fields, "sender": sender, "bitmap": level}))
            elif kind == 9:  # a sender index equal to the fan-in, its bitmap within the level
                extra.append(self.payload(self.elements(count), **{**fields, "sender": fanin, "bitmap": 1 << sender,
                                                                   "version": rnd.choice((1, 2))}))
            elif kind == 10:  # a frame of the level again with another route: its answer goes where it says
                frame = bytearray(rnd.choice(frames))
                hops = self.route()
                frame[fastpath.HOP1_AT:fastpath.ROUTE_END] = b"".join(
                    hops[name].to_bytes(size, "big") for name, size in (("hop1", 4), ("hop1_expect", 8),
                                                                         ("hop2", 4), ("hop2_expect", 8)))
                extra.append(bytes(frame))
        return extra


@pytest.mark.parametrize("slots, max_elements", [(4, 32), (6, 512)])
def test_fast_path_equals_the_model_on_reduction_tree_traffic(slots, max_elements):
    pair = ModelAndFast(ip=AGGREGATOR_IPS[0], slots=slots, max_elements=max_elements)
    count = DATAGRAMS if max_elements <= 256 else DATAGRAMS // 4
    stream = TreeStream(seed=40 + slots, slots=slots, max_elements=max_elements).stream(count)
    assert tree_difference(pair, stream) is None
    counters = pair.fast.stats()
    # The stream reaches what it is meant to: both outputs, stored answers, every drop it aims at.
    for name in ("partials_emitted", "results_emitted", "answered", "saturations", "slots_reclaimed",
                 "drop_duplicate", "drop_mismatch", "drop_sender", "drop_length", "drop_no_result",
                 "drop_collision", "drop_route", "drop_stale"):
        assert counters[name] > 0, name
    versions = {(body[2], body[3]) for body in pair.sent}
    assert {(1, Opcode.RESULT), (2, Opcode.RESULT), (2, Opcode.PARTIAL)} <= versions


def test_a_partial_sent_to_the_wrong_hop_is_caught(monkeypatch):
    """The tree differential test fails when a partial goes to its asker's hop2 instead of hop1."""
    hop2 = FRAME_OFFSETS["hop2"] - PAYLOAD_OFFSET
    monkeypatch.setattr(fastpath, "next_hop", lambda payload: int.from_bytes(payload[hop2:hop2 + 4], "big"))
    pair = ModelAndFast(ip=AGGREGATOR_IPS[0], slots=4, max_elements=32)
    difference = tree_difference(pair, TreeStream(seed=44, slots=4, max_elements=32).stream(DATAGRAMS))
    assert difference is not None
    print(f"caught at datagram {difference[0]}: {difference[1][:200]}")


def test_time_counts_from_0_until_a_datagram_brings_one():
    """An aggregator that was never told the time is at tick 0, as the model's: a slot claimed then
    collides for `lease` - 1 ticks and expires at `lease`."""
    pair = ModelAndFast(ip=AGGREGATOR_IPS[0], slots=1, max_elements=2, lease=5)
    fields = dict(opcode=Opcode.CONTRIBUTION, fanin=2, sender=0, round=1, clique=0, slot=0, chunk=0,
                  group=0xEF000001)
    stranger = payload_of(build_frames(np.array([[1]]), job=2, **fields)[0])
    stream = [(payload_of(build_frames(np.array([[1]]), job=1, **fields)[0]), PEERS[0]), (stranger, PEERS[0], 4),
              (stranger, PEERS[0], 5)]
    assert tree_difference(pair, stream) is None
    assert (pair.fast.stats()["drop_collision"], pair.fast.stats()["leases_expired"]) == (1, 1)


def test_three_level_tree_with_a_lost_partial():
    """Members 0, 1 -> A -> B -> C (root) <- members 4, 5, with members 2, 3 at B: each partial moves the
    hops up one level. Member 1 saturates A's sum and the flag reaches C's result without counting as a
    saturation there. B's first partial is lost; member 0's retransmission to A walks up: A answers with its
    stored partial, B with its own, and C completes. Model and fast path agree on every datagram and
    destination."""
    require_kernel()
    a, b, c = AGGREGATOR_IPS
    pairs = {ip: ModelAndFast(ip=ip, slots=2, max_elements=8) for ip in AGGREGATOR_IPS}
    fields = dict(fanin=6, job=3, round=1, clique=0, slot=1, chunk=0, group=0xEF000009)
    level_a, level_b = 0b000011, 0b001111
    routes = {a: dict(expect=level_a, hop1=b, hop1_expect=level_b, hop2=c), b: dict(expect=level_b, hop1=c), c: {}}
    at = {0: a, 1: a, 2: b, 3: b, 4: c, 5: c}
    values = {m: [m + 1 if m < 2 else -(m + 1), -(m + 1), 100 * m] for m in range(6)}
    values[1][0] = INT32_MAX  # 1 + MAX clips at A; the members above bring the sum back down
    leaves = {m: payload_of(build_frames(np.array([values[m]]), sender=m, **fields, **routes[at[m]])[0])
              for m in range(6)}
    sent, lost = [], [(b, c)]

    def deliver(to, payload, source):
        want, got = pairs[to].feed(payload)
        assert want == got, f"at {ip_str(to)}: golden {want!r:.300} fast {got!r:.300}"
        for answer, destination in zip(got[1], got[2], strict=True):
            sent.append((to, answer, destination))
            if (to, destination) in lost:
                lost.remove((to, destination))
            elif destination in pairs:
                deliver(destination, answer, to)
        return got[0]

    for member in (4, 2, 0, 5, 1, 3):
        assert deliver(at[member], leaves[member], None) == Disposition.ACCUMULATED
    assert [(source, body[3]) for source, body, _ in sent] == [(a, Opcode.PARTIAL), (b, Opcode.PARTIAL)]
    assert pairs[c].fast.stats()["results_emitted"] == 0
    # The retransmission: answered by A and B from their stored partials, summed at C.
    assert deliver(a, leaves[0], None) == Disposition.ANSWERED
    source, result, destination = sent[-1]
    assert (source, result[3], destination) == (c, Opcode.RESULT, fields["group"])
    # B's stored partial again, naming whose frame caused it: member 3 completed it, A's answer asked again.
    first, again = [body for source, body, _ in sent if source == b]
    assert (first[4], again[4], first[:4] + first[5:]) == (3, 0, again[:4] + again[5:])
    header = header_struct("magic", "expect").unpack_from(result)
    assert (header[6], header[15], header[16], result[-1]) == (6, 0b111111, 0, 1)
    assert np.frombuffer(result, ">i4", 3, 86).tolist() == [INT32_MAX - 3 - 4 - 5 - 6, -21, 1500]
    counters = {ip: pair.fast.stats() for ip, pair in pairs.items()}
    assert [counters[ip]["partials_emitted"] for ip in (a, b, c)] == [2, 2, 0]
    assert [counters[ip]["saturations"] for ip in (a, b, c)] == [1, 0, 0]
    assert counters[c]["results_emitted"] == 1


def _with(payload, **values):
    """`payload` with header fields set to `values` (lengths and counts as given, not made to agree)."""
    changed = bytearray(payload)
    for name, value in values.items():
        at, size = FRAME_OFFSETS[name] - PAYLOAD_OFFSET, fastpath.FIELDS_BY_NAME[name].nbytes
        changed[at:at + size] = (value & (1 << 8 * size) - 1).to_bytes(size, "big")
    return bytes(changed)


def edge_datagrams(own, source):
    """Datagrams at the edges of every check, in order: truncations of a header at every length, counts of 0,
    at and past the aggregator's maximum and the longest payload, fan-ins of 0, 1, 64 and beyond, senders and
    bitmaps at and past the fan-in, slots at and past the last, hops to the aggregator itself, to the sender,
    outside the upstream prefix, hop2 equal to hop1 or to the aggregator, unknown magic, versions and opcodes,
    and stats requests with every header byte set."""
    def frame(count=1, **fields):
        fields = dict(dict(opcode=Opcode.CONTRIBUTION, fanin=2, sender=0, job=9, round=1, clique=0, slot=0,
                           chunk=0, group=0xEF000001), **fields)
        values = np.full((1, count), INT32_MAX if count % 2 else INT32_MIN + 1, dtype=np.int64)
        return payload_of(build_frames(values, **fields)[0])

    base = frame()
    datagrams = [base[:length] for length in range(len(base))]
    longest = (fastpath.MAX_PAYLOAD - fastpath.PAYLOAD_HEADER_BYTES) // 4
    # Counts past MAX_RESULT_ELEMENTS are refused: their result's IPv4 length would not fit. A one-member sum at
    # the limit completes with the longest result; one element more (which once crashed the model) is dropped.
    datagrams += [frame(longest, slot=2), _with(frame(longest, slot=2, sender=1) + bytes(4), count=longest + 1),
                  frame(longest - 1, slot=2), frame(MAX_RESULT_ELEMENTS + 1, fanin=1, slot=1),
                  frame(MAX_RESULT_ELEMENTS, fanin=1, slot=1),
                  _with(base, count=0), _with(base, count=0xFFFF), _with(base[:86], count=0), frame(2, slot=2)]
    for fanin in (0, 1, 63, 64, 65, 255):
        datagrams += [frame(fanin=fanin, sender=max(fanin - 1, 0), slot=3),
                      frame(fanin=fanin, sender=fanin & 0xFF, slot=3),
                      frame(fanin=fanin, sender=0, slot=3, bitmap=2**64 - 1, expect=clique_mask(fanin))]
    datagrams += [frame(fanin=64, sender=63, slot=0, chunk=64, bitmap=1 << 63, expect=2**64 - 1),
                  frame(fanin=64, sender=0, slot=0, chunk=64, bitmap=2**63 - 1, expect=2**64 - 1),
                  frame(slot=4), frame(slot=5), frame(slot=0xFFFF), frame(fanin=3, expect=0b1000),
                  frame(bitmap=0b100), frame(fanin=3, expect=0b011, bitmap=0b011, sender=2)]
    aggregators = AGGREGATOR_IPS[1:]
    for hops in (dict(hop1=own), dict(hop1=source), dict(hop1=0x0A000001), dict(hop1=aggregators[0],
                 hop2=aggregators[0]), dict(hop1=aggregators[0], hop2=own), dict(hop2=aggregators[0]),
                 dict(hop1=aggregators[0], hop2=aggregators[1], hop1_expect=2**64 - 1)):
        datagrams += [frame(slot=1, chunk=8, **hops), frame(slot=1, chunk=8, version=1, **hops)]
    datagrams += [frame(slot=1, chunk=8, sender=1, hop1=aggregators[0], hop2=aggregators[1])]
    datagrams += [_with(base, magic=0x4956), _with(base, version=0), _with(base, version=3), _with(base, version=255)]
    datagrams += [_with(base, opcode=opcode) for opcode in (0, 2, 5, 7, 255)]
    datagrams += [_with(base[:86], opcode=Opcode.STATS_REQUEST, sender=255, job=2**32 - 1, fanin=0, count=0xFFFF),
                  _with(base[:86], opcode=Opcode.RESULT_REQUEST, slot=1, chunk=8, sender=1),
                  _with(base[:86], opcode=Opcode.RESULT_REQUEST, slot=2), _with(base[:86], opcode=Opcode.RESULT_REQUEST,
                                                                                slot=0xFFFF)]
    return datagrams


def test_fast_path_equals_the_model_on_edge_datagrams():
    """Every check at and just past its limit, one datagram each, model and fast path compared on each (and
    the source given as an int as well as a string: the route rule reads it)."""
    pair = ModelAndFast(ip=AGGREGATOR_IPS[0], slots=4, max_elements=MAX_RESULT_ELEMENTS,
                        max_fanin=64)
    source = ip_int(PEERS[0][0])
    datagrams = edge_datagrams(AGGREGATOR_IPS[0], source)
    assert tree_difference(pair, [(payload, PEERS[0]) for payload in datagrams]) is None
    counters = pair.fast.stats()
    for name in ("drop_runt", "drop_length", "drop_version", "drop_opcode", "drop_fanin", "drop_sender", "drop_count",
                 "drop_slot", "drop_route", "drop_no_result", "partials_emitted", "results_emitted", "saturations"):
        assert counters[name] > 0, name
    by_string, by_int = (fastpath.FastAggregator(pair.config) for _ in range(2))
    for payload in datagrams:
        assert by_int.handle(payload, None, source) == by_string.handle(payload, None, PEERS[0][0])
    assert by_int.stats() == counters


# Registered jobs (protocol version 3): the fast path against the model on the same job tables, datagram for
# datagram: disposition, every output payload and the endpoint it goes to, and every counter.

MEMBER_PEERS = [("127.0.0.1", 41000 + i) for i in range(6)]
"""Where the jobs' members send from."""
CHILD_PEERS = [("127.0.0.3", 42000 + i) for i in range(2)]
PARENT_PEER = ("127.0.0.4", 43000)
STRANGERS = [("127.0.0.1", 41999), ("127.0.0.9", 41000), ("127.0.0.3", 42009), ("127.0.0.4", 43001)]
"""Not in any table: another port of a member's host, another host with a member's port, and so on."""


def _endpoint(peer):
    return ip_int(peer[0]), peer[1]


def job_entries():
    """Three jobs: flat cliques with unicast results (job 0x51), flat with a multicast group (0x52), and a tree
    (0x53): clique 0 gathers members 0 and 1 here and sends its partial up to a parent; clique 1 is rooted here
    with members 0 and 1 and a child holding members 2 and 3; clique 2 is a middle level, members 0 and 1 here,
    a child holding 2 and 3, and a parent whose result comes down."""
    from inwire.jobs import CliqueRoute, JobEntry

    members = frozenset(_endpoint(peer) for peer in MEMBER_PEERS[:4])
    child, parent = _endpoint(CHILD_PEERS[0]), _endpoint(PARENT_PEER)
    routes = {0: CliqueRoute(level=0b0011, parent=parent),
              1: CliqueRoute(level=0b1111, children={child: 0b1100}),
              2: CliqueRoute(level=0b1111, parent=parent, children={child: 0b1100, _endpoint(CHILD_PEERS[1]): 0b1000})}
    return [JobEntry(job=0x51, token=0x1111_2222_3333_4444, slots=3, members=members),
            JobEntry(job=0x52, token=0xFEDC_BA98_7654_3210, slots=2, members=members, group=0xEF000005),
            JobEntry(job=0x53, token=0x0123_4567_89AB_CDEF, slots=3, members=members, routes=routes)]


class JobPair:
    """A model aggregator and a fast one, both holding job tables and taking versions 1 and 2, fed the same
    datagrams and the same installs and removals."""

    def __init__(self, **config):
        from inwire.model import Aggregator, AggregatorConfig

        require_kernel()
        self.config = AggregatorConfig(**{"ip": AGGREGATOR_IPS[0], "registered": True, **config})
        self.model = Aggregator(self.config)
        self.fast = fastpath.FastAggregator(self.config)
        self.address = (ip_str(self.config.ip), self.config.port)
        self.sent = []
        """The fast path's sends, in order."""

    def install(self, entry):
        """Both aggregators' answer to installing `entry`: its base, or the error's type and message."""
        outcomes = []
        for aggregator in (self.model, self.fast):
            try:
                outcomes.append(aggregator.install(entry))
            except (ValueError, JobTableError) as error:
                outcomes.append((type(error), str(error)))
        return outcomes

    def remove(self, job):
        return [self.model.remove(job), self.fast.remove(job)]

    def leave(self, job, members):
        return [self.model.leave(job, members), self.fast.leave(job, members)]

    def feed(self, payload, peer, now=None):
        """(disposition, [(payload, (host, port))]) of the model (its frames unwrapped, each to its IPv4
        destination and UDP port) and of the fast path (a version 3 answer names its sends; a stats reply goes
        to the asker, a version 1 or 2 result to its group, a partial to its asker's hop1)."""
        before = self.model.stats()
        frames = self.model.process(wrap(payload, peer, self.address, bytes(6)), now)
        after = self.model.stats()
        want = (next(d for d in Disposition if after[d.name.lower()] > before[d.name.lower()]),
                [(payload_of(frame), (ip_str(frame_field(frame, "ip_dst")), frame_field(frame, "udp_dport")))
                 for frame in frames])
        disposition, answer = self.fast.handle(payload, now, peer)
        if answer is None:
            sends = []
        elif isinstance(answer, list):
            sends = [(bytes(body), tuple(to)) for body, to in answer]
        elif answer[3] == Opcode.STATS_REPLY:
            sends = [(bytes(answer), peer)]
        else:
            sends = [(bytes(answer), (ip_str(_destination(payload, answer)), self.config.port))]
        self.sent += sends
        return want, (disposition, sends)


def job_difference(pair, stream):
    """Index and description of the first event on which model and fast path differ, or None. An event is a
    datagram (payload, peer[, now]), ("install", entry), ("remove", job) or ("leave", job, members)."""
    for index, event in enumerate(stream):
        if event[0] == "install":
            want, got = pair.install(event[1])
        elif event[0] == "remove":
            want, got = pair.remove(event[1])
        elif event[0] == "leave":
            want, got = pair.leave(*event[1:])
        else:
            want, got = pair.feed(*event)
        if want != got:
            return index, f"golden {want!r:.400} fast {got!r:.400}"
        if pair.model.stats() != pair.fast.stats():
            return index, f"counters differ: golden {pair.model.stats()} fast {pair.fast.stats()}"
    return None


class JobStream(CliqueStream):
    """Version 3 traffic of the registered jobs of `job_entries`, interleaved, with trouble: members sending from
    another member's address, non-members (a stranger's contribution, result request, partial and result), wrong
    tokens, unknown jobs, partials from children (within, beyond or beside what the child holds; from a stranger),
    results from the parent (the one awaited, again, with another shape, before the level completed, from
    elsewhere), retransmissions and result requests to completed slots, wrong groups, slots past the quota,
    `expect` or hops set, and floods of another job; versions 1 and 2 into the jobs' slots and beside them;
    damaged datagrams; and now and then a job removed and installed again, a member added, members leaving
    (the job with its last), or a clash."""

    def __init__(self, seed, max_elements):
        super().__init__(seed, slots=12, max_elements=max_elements)
        self.entries = {entry.job: entry for entry in job_entries()}
        self.removed = set()

    def frame(self, entry, values, status=None, **fields):
        fields = {"version": 3, "token": entry.token, "job": entry.job, "group": entry.group, **fields}
        return self.payload(values, status=status, **fields)

    def payload(self, values, status=None, **fields):
        frame = build_frames(np.asarray(values, dtype=np.int64).reshape(1, -1), status=status, **fields)
        return payload_of(frame[0])

    def member_peer(self, sender):
        """A member's own address mostly; now and then another member's (the tables allow any member's)."""
        if self.rnd.random() < 0.85 and sender < 4:
            return MEMBER_PEERS[sender]
        return self.rnd.choice(MEMBER_PEERS[:4])

    def clique(self):
        rnd = self.rnd
        entry = self.entries[rnd.choice(list(self.entries))]
        clique = rnd.randrange(3) if entry.routes else rnd.randrange(5)
        route = entry.route(clique)
        fanin = 4 if entry.routes else rnd.randint(1, 4)
        count = rnd.choice((1, 2, rnd.randint(1, self.max_elements), self.max_elements))
        slot = rnd.randrange(entry.slots + (rnd.random() < 0.05))  # past the quota now and then
        key = (entry.job, slot)
        self.rounds[hash(key) % len(self.rounds)] += 1
        round_ = self.rounds[hash(key) % len(self.rounds)]
        if rnd.random() < 0.1:  # an older round is stale
            round_ -= 2
        fields = dict(fanin=fanin, round=round_, clique=clique, slot=slot, chunk=rnd.randrange(3) * count,
                      exponent=rnd.randint(-2, 2))
        level = route.resolved_level(fanin)
        gathered = [(sum(1 << m for m in (2, 3)), CHILD_PEERS[0])] if 0b1100 & level and route.children else []
        local = [m for m in range(fanin) if level >> m & 1 and not (gathered and m in (2, 3))]
        frames = [(self.frame(entry, self.elements(count), opcode=Opcode.CONTRIBUTION, sender=m, **fields),
                   self.member_peer(m)) for m in local]
        for bitmap, child in gathered:
            if rnd.random() < 0.3:  # the child's members one partial each
                frames += [(self.frame(entry, self.elements(count), status=rnd.choice((0, 1)), opcode=Opcode.PARTIAL,
                                       sender=m, bitmap=1 << m, **fields), child) for m in (2, 3)]
            else:
                frames.append((self.frame(entry, self.elements(count), status=rnd.choice((0, 0, 1)),
                                          opcode=Opcode.PARTIAL, sender=2, bitmap=bitmap, **fields), child))
        rnd.shuffle(frames)
        if route.parent is not None:
            result = self.frame(entry, self.elements(count), status=rnd.choice((0, 1)), opcode=Opcode.RESULT,
                                sender=rnd.randrange(fanin), bitmap=clique_mask(fanin), **fields)
            frames.append((result, PARENT_PEER))
            if rnd.random() < 0.3:
                frames.insert(rnd.randrange(len(frames)), (result, PARENT_PEER))  # before the level completed
            if rnd.random() < 0.3:
                frames.append((result, PARENT_PEER))  # again: a duplicate
        return frames + self.trouble(entry, frames, fields, count, level)

    def trouble(self, entry, frames, fields, count, level):
        rnd = self.rnd
        extra = [rnd.choice(frames) for _ in range(rnd.randrange(3))]
        request = dict(fields, opcode=Opcode.RESULT_REQUEST, sender=rnd.randrange(fields["fanin"]))
        for kind in rnd.sample(range(14), rnd.randrange(5)):
            body, peer = rnd.choice(frames)
            if kind == 0:  # a result request from a member, or from a stranger
                extra.append((self.frame(entry, np.zeros(count), **request)[:86],
                              rnd.choice(MEMBER_PEERS[:4] + STRANGERS)))
            elif kind == 1:  # any frame of the clique from a stranger
                extra.append((body, rnd.choice(STRANGERS + CHILD_PEERS + [PARENT_PEER] + MEMBER_PEERS[4:])))
            elif kind == 2:  # a wrong token, or an unknown job
                extra.append((_with(body, token=rnd.choice((0, entry.token ^ 1 << rnd.randrange(64)))), peer))
            elif kind == 3:
                extra.append((_with(body, job=rnd.choice((0, 0x54, entry.job ^ 0x100))), peer))
            elif kind == 4:  # another group, a slot past the quota, or a tree field set
                name = rnd.choice(("group", "slot", "expect", "hop1", "hop1_expect", "hop2", "hop2_expect"))
                value = {"group": rnd.choice((0, 0xEF000005, 0xEF000006)), "slot": entry.slots + rnd.randrange(3)}.get(
                    name, 1 << rnd.randrange(8))
                extra.append((_with(body, **{name: value}), peer))
            elif kind == 5:  # a partial with a member its child does not hold, or from the other child
                extra.append((self.frame(entry, self.elements(count), status=0, opcode=Opcode.PARTIAL, sender=1,
                                         bitmap=rnd.choice((0b0110, 0b1000, 0b0100, 0b0001)), **fields),
                              rnd.choice(CHILD_PEERS)))
            elif kind == 6:  # a result from the parent with another shape, or from a member
                other = rnd.choice(({"fanin": fields["fanin"] - 1 or 2}, {"exponent": fields["exponent"] + 1}, {}))
                extra.append((self.frame(entry, self.elements(count), status=0, opcode=Opcode.RESULT,
                                         sender=0, bitmap=0b0011, **{**fields, **other}),
                              rnd.choice((PARENT_PEER, PARENT_PEER, MEMBER_PEERS[0]))))
            elif kind == 7:  # version 1 or 2 into the job's slots (and beside them), from a member
                extra.append((self.payload(self.elements(count), **{**fields, "version": rnd.choice((1, 2)),
                                                                    "job": entry.job, "sender": 0,
                                                                    "slot": rnd.randrange(14),
                                                                    "group": 0xEF000001}), MEMBER_PEERS[0]))
            elif kind == 8:  # a flood of another job on the same relative slot
                other = self.entries[rnd.choice([job for job in self.entries if job != entry.job])]
                extra += [(self.frame(other, self.elements(count), opcode=Opcode.CONTRIBUTION, sender=m,
                                      **{**fields, "fanin": 4, "clique": 3, "round": rnd.randrange(2**32)}),
                           MEMBER_PEERS[m]) for m in range(rnd.randint(1, 4))]
            elif kind == 9:  # a sender past the fan-in, or beyond 64 with no bitmap
                extra.append((_with(body, sender=rnd.choice((fields["fanin"], 64, 200))), peer))
            elif kind == 10:  # a member outside the clique's level here
                outside = [m for m in range(fields["fanin"]) if not level >> m & 1]
                if outside:
                    extra.append((self.frame(entry, self.elements(count), opcode=Opcode.CONTRIBUTION,
                                             sender=outside[0], **fields), MEMBER_PEERS[0]))
            elif kind == 11:  # damaged: truncated, extended (a result's trailer lost or doubled), a bit flipped
                damaged = bytearray(rnd.choice((body[:rnd.randrange(len(body))], body + bytes(4), body)))
                if len(damaged) >= 86 and rnd.random() < 0.5:
                    damaged[rnd.randrange(86)] ^= 1 << rnd.randrange(8)
                extra.append((bytes(damaged), peer))
            elif kind == 12:  # a version 3 stats request (whatever its job)
                extra.append((_with(self.frame(entry, np.zeros(0))[:86], opcode=Opcode.STATS_REQUEST),
                              rnd.choice(MEMBER_PEERS + STRANGERS)))
            elif kind == 13:  # a result request of another round or chunk
                extra.append((self.frame(entry, np.zeros(count), **{**request, "chunk": fields["chunk"] + 1})[:86],
                              MEMBER_PEERS[1]))
        return extra

    def table_change(self):
        """Remove a job, install one (again: its members merge, a clash is refused), add a member, or let some
        leave (a stranger among them changes nothing; the last one's leave removes the job)."""
        from inwire.jobs import JobEntry

        rnd = self.rnd
        if self.removed and rnd.random() < 0.7:
            job = rnd.choice(sorted(self.removed))
            self.removed.discard(job)
            return ("install", self.entries[job])
        entry = self.entries[rnd.choice(sorted(set(self.entries) - self.removed))]
        pick = rnd.random()
        if pick < 0.3:
            self.removed.add(entry.job)
            return ("remove", entry.job)
        if pick < 0.4:
            members = sorted(entry.members)
            leaving = set(rnd.sample(members, rnd.randint(1, len(members)))) | {_endpoint(STRANGERS[0])}
            if leaving >= entry.members:
                self.removed.add(entry.job)
            return ("leave", entry.job, frozenset(leaving))
        if pick < 0.5:
            return ("install", dataclasses.replace(entry, members=frozenset({_endpoint(MEMBER_PEERS[4])})))
        if pick < 0.6:  # a clash: the same job id with another token
            return ("install", dataclasses.replace(entry, token=entry.token ^ 1))
        if pick < 0.7:  # a job too large for the free slots, or a new one that fits
            return ("install", JobEntry(job=0x60 + rnd.randrange(3), token=5, slots=rnd.choice((1, 2, 13)),
                                        members=frozenset({_endpoint(MEMBER_PEERS[5])})))
        return ("install", entry)

    def next(self):
        if self.rnd.random() < 0.01:
            return self.table_change()
        while len(self.pending) < 3:
            self.pending.append(self.clique())
        frames = self.rnd.choice(self.pending)
        event = frames.pop(0 if self.rnd.random() < 0.7 else self.rnd.randrange(len(frames)))
        self.pending = [f for f in self.pending if f]
        return event

    def stream(self, count):
        return [("install", entry) for entry in self.entries.values()] + [self.next() for _ in range(count)]


@pytest.mark.parametrize("max_elements", [16, 300])
def test_fast_path_equals_the_model_on_registered_job_traffic(max_elements):
    pair = JobPair(slots=12, max_elements=max_elements)
    count = DATAGRAMS if max_elements <= 256 else DATAGRAMS // 2
    stream = JobStream(seed=50 + max_elements, max_elements=max_elements).stream(count)
    assert job_difference(pair, stream) is None
    counters = pair.fast.stats()
    # Every kind of destination the tables name: the group, members, the child, the parent.
    destinations = {to for body, to in pair.sent if body[3] != Opcode.STATS_REPLY}
    assert {("239.0.0.5", pair.config.port), PARENT_PEER, CHILD_PEERS[0], *MEMBER_PEERS[:4]} <= destinations
    assert not destinations & {*STRANGERS, pair.address}
    # The stream reaches what it is meant to: every version 3 check, both outputs, relays, stored answers.
    for name in ("drop_job", "drop_token", "drop_member", "relayed", "partials_emitted", "results_emitted",
                 "answered", "accumulated", "drop_duplicate", "drop_mismatch", "drop_no_result", "drop_group",
                 "drop_slot", "drop_route", "drop_sender", "drop_length", "drop_stale", "saturations"):
        assert counters[name] > 0, name


def test_fast_path_equals_the_model_on_a_tree_with_a_group():
    """`JobStream`'s traffic of the tree job (0x53), beside the same tree with a multicast group (0x56): below
    the root a result from the parent goes only to those whose retransmission asked for it."""
    pair = JobPair(slots=12, max_elements=16)
    stream = JobStream(seed=77, max_elements=16)
    tree = stream.entries[0x53]
    stream.entries = {0x53: tree, 0x56: dataclasses.replace(tree, job=0x56, token=0x0BAD_F00D_0000_0003,
                                                            group=0xEF000007)}
    assert job_difference(pair, stream.stream(DATAGRAMS // 2)) is None
    assert pair.fast.stats()["relayed"] > 0
    assert any(to == ("239.0.0.7", pair.config.port) for _, to in pair.sent)


@pytest.mark.parametrize("copies", [True, False], ids=["copies", "group_only"])
def test_with_a_group_a_result_relayed_down_goes_to_those_that_asked_as_in_the_model(copies):
    """A job with a group and a tree, below the root: the result that comes down answers the partial sent up
    again for a member's and a child's retransmissions; both engines send it to those two, not to the group,
    drop a second copy, and then answer a retransmission to its source alone. An aggregator that sends no
    copies (one frame per result, as the gateware) sends it to the group again instead."""
    from inwire.jobs import CliqueRoute, JobEntry, JobLimits

    pair = JobPair(slots=4, max_elements=8, limits=JobLimits(unicast_results=copies))
    entry = JobEntry(job=0x55, token=0x0BAD_F00D_0000_0001, slots=1, group=0xEF000007,
                     members=frozenset(_endpoint(peer) for peer in MEMBER_PEERS[:2]),
                     routes={0: CliqueRoute(level=0b111, parent=_endpoint(PARENT_PEER),
                                            children={_endpoint(CHILD_PEERS[0]): 0b100})})
    shared = dict(version=3, token=entry.token, job=entry.job, group=entry.group, fanin=4, round=5, clique=0,
                  slot=0, chunk=0, exponent=0)

    def payload(values, status=None, **fields):
        return payload_of(build_frames(np.asarray(values, dtype=np.int64).reshape(1, -1), status=status,
                                       **shared, **fields)[0])

    member = [payload([1, 2], opcode=Opcode.CONTRIBUTION, sender=m) for m in (0, 1)]
    child = payload([3, 4], status=0, opcode=Opcode.PARTIAL, sender=2, bitmap=0b100)
    result = payload([10, 20], status=0, opcode=Opcode.RESULT, sender=3, bitmap=0b1111)
    stream = [("install", entry), (member[0], MEMBER_PEERS[0]), (member[1], MEMBER_PEERS[1]),
              (child, CHILD_PEERS[0]), (member[0], MEMBER_PEERS[0]), (child, CHILD_PEERS[0]),
              (result, PARENT_PEER)]
    assert job_difference(pair, stream) is None
    if copies:
        assert [to for _, to in pair.sent[-2:]] == [MEMBER_PEERS[0], CHILD_PEERS[0]], pair.sent
    else:
        assert pair.sent[-1][1] == (ip_str(entry.group), pair.config.port), pair.sent
    assert job_difference(pair, [(result, PARENT_PEER), (member[1], MEMBER_PEERS[1])]) is None
    assert [to for _, to in pair.sent[-1:]] == [MEMBER_PEERS[1]]
    assert [pair.fast.stats()[name] for name in ("relayed", "drop_duplicate")] == [1, 1]


def frame_source(frame):
    """Where a frame's datagram comes from, as a kernel reports it: the frame's IPv4 source and UDP port; a frame
    too short to name them, from the first of PEERS."""
    if len(frame) < PAYLOAD_OFFSET:
        return PEERS[0]
    return ip_str(frame_field(frame, "ip_src")), frame_field(frame, "udp_sport")


def test_fast_path_equals_the_model_on_mutated_registered_datagrams():
    """The fuzzer's stream with its registered jobs (`mutate.fuzz_jobs`) installed in both: the jobs' version 3
    cliques from their members, forgeries of them (another or an unknown job, a wrong token, a stranger's or
    another job's source, a slot at or past the quota, another group, hops, another opcode or version) and the
    fuzzer's mutations of them, each datagram from the source its frame names, beside versions 1 and 2."""
    from mutate import Mutator, fuzz_jobs

    pair = JobPair(slots=16, max_elements=32)
    jobs = fuzz_jobs(pair.config, seed=21)
    mutated = Mutator(pair.config, seed=21, jobs=jobs).frames(DATAGRAMS // 4)
    stream = [("install", entry) for entry in jobs] + [(payload_of(frame), frame_source(frame)) for _, frame in mutated]
    assert job_difference(pair, stream) is None
    counters = pair.fast.stats()
    for name in ("drop_job", "drop_token", "drop_member", "drop_slot", "drop_group", "drop_route", "drop_opcode",
                 "drop_version", "accumulated", "answered", "results_emitted"):
        assert counters[name] > 0, name
    # Version 3 outputs go only where the tables say: results to each job's group, answers to its members.
    groups = {(ip_str(entry.group), pair.config.port) for entry in jobs}
    members = {(ip_str(address), port) for entry in jobs for address, port in entry.members}
    destinations = {to for body, to in pair.sent if body[2] == JOB_VERSION}
    assert groups <= destinations <= groups | members, destinations


@pytest.mark.parametrize("registered, unregistered", [(True, False), (False, True)])
def test_fast_path_equals_the_model_with_or_without_job_tables(registered, unregistered):
    """An aggregator of registered jobs only refuses versions 1 and 2 (drop_version); one without job tables
    refuses version 3 and every install (the model's error, word for word); the fast path as the model."""
    pair = JobPair(slots=12, max_elements=16, registered=registered, unregistered=unregistered)
    stream = JobStream(seed=70 + registered, max_elements=16).stream(DATAGRAMS // 4)
    assert job_difference(pair, stream) is None
    counters = pair.fast.stats()
    assert counters["drop_version"] > 0
    assert (counters["relayed"] > 0) == registered


def serve_job_difference(golden, fast, stream, batch=0):
    """`job_difference` through the services' `handle` (or, with `batch`, the fast one's `handle_batch` on up to
    `batch` datagrams at a time, between table changes): the first event whose sends (in order) or counters
    (the aggregator's and the service's own) differ, or None."""
    pending = []

    def flush():
        if not pending:
            return None
        slot = max(len(payload) for payload, _ in pending) + 1
        buffer = bytearray(slot * len(pending))
        for index, (payload, _) in enumerate(pending):
            buffer[index * slot:index * slot + len(payload)] = payload
        want = [send for payload, peer in pending for send in golden.handle(payload, peer, 0)]
        got = fast.handle_batch(buffer, [(len(payload), peer) for payload, peer in pending], slot, 0)
        pending.clear()
        return differs(golden, fast, want, got)

    for index, event in enumerate(stream):
        if event[0] in ("install", "remove"):
            difference = flush()
            outcomes = []
            for service in (golden, fast):
                try:
                    outcomes.append(getattr(service, f"{event[0]}_job")(event[1]))
                except JobTableError as error:
                    outcomes.append(str(error))
            difference = difference or (None if outcomes[0] == outcomes[1] else f"tables differ: {outcomes}")
        elif batch:
            pending.append(event)
            difference = flush() if len(pending) == batch else None
        else:
            difference = differs(golden, fast, golden.handle(*event, 0), fast.handle(*event, 0))
        if difference:
            return index, difference
    return None if flush() is None else (len(stream), "in the last batch")


@pytest.mark.parametrize("batch", [0, 7], ids=["each", "batched"])
@pytest.mark.parametrize("unicast", [True, False], ids=["unicast", "multicast"])
def test_the_services_send_a_job_s_outputs_where_its_tables_say(pair, unicast, batch):
    """`inwire serve` with either engine, datagram by datagram or a recvmmsg batch at a time: a version 3
    decision's outputs go to the endpoints it names and nowhere else (not through the service's learning, copies
    or relays, whatever `unicast` says), never to the service itself (a job whose members include the service's
    own address gets no copy there; each is counted, sends_refused), the same on both engines. Only version 3
    datagrams here, so that the service's unicast copies, relays and learning table stay unused."""
    golden, fast = pair(unicast=unicast, slots=12, max_elements=16, registered=True, key=bytes(32))
    own = (ip_int(golden.address[0]), golden.address[1])
    stream = []
    for event in JobStream(seed=80 + unicast + batch, max_elements=16).stream(DATAGRAMS // 2):
        if event[0] == "install" and event[1].job == 0x51:
            event = ("install", dataclasses.replace(event[1], members=event[1].members | {own}))
        elif event[0] not in ("install", "remove"):
            if len(event[0]) < 3 or event[0][2] != 3:
                continue  # version 3 only: the service's own machinery for versions 1 and 2 stays idle
            if event[1] == MEMBER_PEERS[0] and len(stream) % 3 == 0:
                event = (event[0], golden.address)  # a member sending from the service's own address
        stream.append(event)
    assert serve_job_difference(golden, fast, stream, batch) is None
    counters = fast.counters()
    assert counters["sends_refused"] > 0 and counters["relayed"] > 0 and counters["results_emitted"] > 0
    assert counters["unicast_copies"] == counters["results_relayed"] == 0
    assert fast.learned == {} == golden.learned
