"""The fast software aggregator against the golden model: the same datagrams into both, the same answers,
destinations and counters out, datagram for datagram.

Two streams: the fuzzer's mutated frames (tb/fuzz/mutate.py: damaged headers, lengths, limits, random
bytes) as UDP payloads, and a stream of interleaved cliques built here (saturation at both int32 limits,
duplicates, retransmissions to completed slots, reclaims by newer rounds, collisions, shape mismatches,
result and stats requests, truncated, extended and bit-flipped datagrams), also timed: arrival times with
gaps around the slot lease and datagrams left out, so that abandoned slots expire. Both backends of the fast path
run them: numpy and, when built, the C kernel; under CI=true a missing kernel fails the test.
`INWIRE_FUZZ_FRAMES` scales the streams as it does for the fuzz tests.
"""

import dataclasses
import os
import random

import numpy as np
import pytest

from inwire import fastpath
from inwire.datagram import payload_of
from inwire.packets import build_frames
from inwire.protocol import INT32_MAX, INT32_MIN, Opcode
from inwire.serve import SoftwareAggregator

PEERS = [("127.0.0.1", 40000 + i) for i in range(5)] + [("127.0.0.2", 40000)]
DATAGRAMS = int(os.environ.get("INWIRE_FUZZ_FRAMES", 4000))
BACKENDS = ["numpy", "c"]


def backend_available(backend):
    if backend == "c" and fastpath.compiled is None:
        if os.environ.get("CI") == "true":
            pytest.fail("the compiled fast path inwire._fastpath is not built (make setup builds it)")
        pytest.skip("the compiled fast path inwire._fastpath is not built")
    return backend


@pytest.fixture
def pair():
    made = []

    def make(backend, **options):
        golden = SoftwareAggregator(("127.0.0.1", 0), engine="golden", log=lambda line: None, **options)
        fast = SoftwareAggregator(("127.0.0.1", 0), engine="fast", backend=backend, log=lambda line: None,
                                  **options)
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
    holds (payload, peer) or (payload, peer, arrival time in lease ticks)."""
    for index, (payload, peer, *now) in enumerate(stream):
        want = [(bytes(body), to) for body, to in golden.handle(payload, peer, *now)]
        got = [(bytes(body), to) for body, to in fast.handle(payload, peer, *now)]
        if want != got:
            return index, f"answers differ: golden {want!r:.300} fast {got!r:.300}"
        if golden.counters() != fast.counters():
            return index, f"counters differ: golden {golden.counters()} fast {fast.counters()}"
    return None


def mutated_stream(config, seed, count):
    from mutate import Mutator

    rnd = random.Random(seed)
    return [(payload_of(frame), rnd.choice(PEERS)) for _, frame in Mutator(config, seed=seed).frames(count)]


class CliqueStream:
    """Interleaved cliques on few slots, with every kind of trouble a service sees."""

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
        fields = dict(opcode=Opcode.CONTRIBUTION, fanin=fanin, job=job, round=round_, clique=rnd.randrange(3),
                      slot=slot, chunk=rnd.randrange(4) * count, exponent=rnd.randint(-3, 3),
                      group=0xEF000000 | rnd.randrange(1, 4))
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
                                   job=rnd.randrange(2**32))
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
        return payload, rnd.choice(PEERS)

    def stream(self, count):
        return [self.next() for _ in range(count)]

    def timed_stream(self, count, lease):
        """Datagrams with arrival times: mostly a tick or two apart, now and then a pause of about the
        lease (one tick either side of it included); one in ten left out, so that slots stay unfinished."""
        rnd, now, timed = self.rnd, 0, []
        while len(timed) < count:
            payload, peer = self.next()
            if rnd.random() < 0.1:
                continue
            pick = rnd.random()
            now += rnd.choice((lease - 1, lease, lease + 1, 2 * lease)) if pick < 0.05 else rnd.randrange(3)
            timed.append((payload, peer, now))
        return timed


@pytest.mark.parametrize("unicast", [True, False], ids=["unicast", "multicast"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_fast_path_equals_the_model_on_mutated_datagrams(pair, backend, unicast):
    golden, fast = pair(backend_available(backend), unicast=unicast, slots=4, max_elements=32)
    stream = mutated_stream(golden.config, seed=11 + unicast, count=DATAGRAMS)
    assert first_difference(golden, fast, stream) is None
    counters = fast.counters()
    assert counters["frames_in"] == DATAGRAMS and counters["accumulated"] > 0
    assert sum(value for name, value in counters.items() if name.startswith("drop_")) > DATAGRAMS // 10


@pytest.mark.parametrize("slots, max_elements", [(4, 32), (6, 2048)])
@pytest.mark.parametrize("unicast", [True, False], ids=["unicast", "multicast"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_fast_path_equals_the_model_on_interleaved_cliques(pair, backend, unicast, slots, max_elements):
    golden, fast = pair(backend_available(backend), unicast=unicast, slots=slots, max_elements=max_elements)
    count = DATAGRAMS if max_elements <= 256 else DATAGRAMS // 4
    stream = CliqueStream(seed=slots + unicast, slots=slots, max_elements=max_elements).stream(count)
    assert first_difference(golden, fast, stream) is None
    counters = fast.counters()
    # The stream reaches what it is meant to: saturation, reclaims, stored answers, every drop it aims at.
    for name in ("saturations", "slots_reclaimed", "answered", "drop_duplicate", "drop_mismatch", "drop_collision",
                 "drop_no_result", "drop_slot", "drop_length", "results_emitted"):
        assert counters[name] > 0, name


@pytest.mark.parametrize("unicast", [True, False], ids=["unicast", "multicast"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_fast_path_equals_the_model_on_timed_cliques_with_leases(pair, backend, unicast):
    lease = 20
    golden, fast = pair(backend_available(backend), unicast=unicast, slots=4, max_elements=32, lease=lease)
    stream = CliqueStream(seed=30 + unicast, slots=4, max_elements=32).timed_stream(DATAGRAMS, lease)
    assert first_difference(golden, fast, stream) is None
    counters = fast.counters()
    for name in ("leases_expired", "slots_reclaimed", "drop_collision", "results_emitted"):
        assert counters[name] > 0, name


@pytest.mark.parametrize("backend", BACKENDS)
def test_saturation_is_per_contribution(pair, backend):
    """MAX + MAX - MAX: the sum clips at MAX after the second member, so the third brings it to 0."""
    golden, fast = pair(backend_available(backend), slots=2, max_elements=4)
    stream = CliqueStream(0, 2, 4)
    fields = dict(opcode=Opcode.CONTRIBUTION, fanin=3, job=1, round=1, clique=0, slot=0, chunk=0,
                  group=0xEF000001)
    vectors = [[INT32_MAX, INT32_MIN, 5], [INT32_MAX, INT32_MIN, 6], [-INT32_MAX, INT32_MAX, 7]]
    datagrams = [(stream.payload(v, sender=s, **fields), PEERS[s]) for s, v in enumerate(vectors)]
    assert first_difference(golden, fast, datagrams[:2]) is None
    (result, _), = fast.handle(datagrams[2][0], datagrams[2][1])
    elements = np.frombuffer(result, ">i4", 3, 86)
    assert elements.tolist() == [0, -1, 18] and result[-1] == 1


def _clip_once_at_the_end(self, sums, payload, count):
    np.add(sums, np.frombuffer(payload, ">i4", count, 86), out=sums)
    return False


def _clip_at_result(original):
    def complete(self, slot, *rest):
        sums = self.sums[slot]
        self.overflow[slot] = bool(((sums > INT32_MAX) | (sums < INT32_MIN)).any())
        np.clip(sums, INT32_MIN, INT32_MAX, out=sums)
        return original(self, slot, *rest)
    return complete


def _unpatched_answer(self, slot, payload, version, sender):
    self._count_output(fastpath._route(payload, version)[0])
    return self.results[slot]


@pytest.mark.parametrize("tamper", ["clip_once", "unpatched_sender", "lease_one_tick_longer"])
def test_a_tampered_fast_path_is_caught(pair, monkeypatch, tamper):
    """The differential test fails on a fast path that saturates once at the end, that answers a
    retransmission with the stored result without patching the asker's sender index, or whose lease
    is one tick longer than the model's."""
    if tamper == "lease_one_tick_longer":
        golden, fast = pair("numpy", unicast=True, slots=4, max_elements=32, lease=20)
        fast.fast.config = dataclasses.replace(golden.config, lease=21)
        difference = first_difference(golden, fast, CliqueStream(seed=3, slots=4, max_elements=32).timed_stream(
            DATAGRAMS, 20))
        assert difference is not None
        return
    if tamper == "clip_once":
        monkeypatch.setattr(fastpath.FastAggregator, "_accumulate_numpy", _clip_once_at_the_end)
        monkeypatch.setattr(fastpath.FastAggregator, "_complete", _clip_at_result(fastpath.FastAggregator._complete))
    else:
        monkeypatch.setattr(fastpath.FastAggregator, "_answer", _unpatched_answer)
    golden, fast = pair("numpy", unicast=True, slots=4, max_elements=32)
    stream = CliqueStream(seed=3, slots=4, max_elements=32).stream(DATAGRAMS)
    difference = first_difference(golden, fast, stream)
    assert difference is not None
    print(f"{tamper}: caught at datagram {difference[0]}: {difference[1][:200]}")


def test_unknown_or_missing_backend_is_refused():
    from inwire.model import AggregatorConfig

    with pytest.raises(ValueError, match="backend"):
        fastpath.FastAggregator(AggregatorConfig(), backend="fortran")
    if fastpath.compiled is None:
        with pytest.raises(ValueError, match="not built"):
            fastpath.FastAggregator(AggregatorConfig(), backend="c")


def test_a_tampered_kernel_is_caught(pair, monkeypatch):
    """The compiled backend is held to the model too: a kernel that loses the saturation flag is caught."""
    real = backend_available("c") and fastpath.compiled

    class Forgetful:
        encode_result = staticmethod(real.encode_result)

        @staticmethod
        def accumulate(sums, payload, offset, count):
            real.accumulate(sums, payload, offset, count)
            return False

    monkeypatch.setattr(fastpath, "compiled", Forgetful)
    golden, fast = pair("c", unicast=False, slots=4, max_elements=32)
    assert first_difference(golden, fast, CliqueStream(seed=4, slots=4, max_elements=32).stream(DATAGRAMS))


def test_a_missing_kernel_fails_under_ci(monkeypatch):
    monkeypatch.setattr(fastpath, "compiled", None)
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="not built"):
        backend_available("c")


def test_batched_io_keeps_each_peer_s_datagrams_whole_and_in_order():
    """send_batch groups runs of equal-sized datagrams to one peer into GSO messages; recv_batch reads them
    back one by one: every receiver gets exactly its payloads, in order, with the sender's address."""
    import socket

    from inwire.datagram import set_receive_buffer

    backend_available("c")
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
