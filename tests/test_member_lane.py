"""The compiled result lane (`client.CompiledMemberSum`, `inwire._kernel.member_result`) against its
definition, `client.MemberSum.on_result`: the same random and adversarial result streams (loss, duplicates,
reordering, another job's, round's or clique's results, wrong counts, exponents, bitmaps and fan-ins, another
version or token (refused and counted by a registered job's sum), the overflow flag, truncated and oversized
datagrams, offsets off a chunk boundary, results of chunks not in flight, random bytes) under one fake clock,
with the Python `due` between them; every payload returned and every piece of state compared after every
step. A tampered lane shows that the comparison can fail."""

import random
import types

import numpy as np
import pytest

from inwire import client
from inwire.client import CliqueKey, CompiledMemberSum, Contributions, MemberSum, contributions, slots_needed
from inwire.datagram import PAYLOAD_OFFSET, header_struct, payload_of, wrap
from inwire.jobs import JobEntry
from inwire.model import Aggregator, AggregatorConfig
from inwire.protocol import FIELDS_BY_NAME, FRAME_OFFSETS, RESULT_TRAILER_BYTES, STATUS_OVERFLOW

pytestmark = pytest.mark.skipif(client.compiled is None, reason="the compiled kernel (inwire._kernel) is not built")

STATE = ("deadline", "tries", "sent_at", "backoff", "fast_resent", "wrong_chunks", "overflowed_chunks", "checked",
         "remaining", "next", "progress_at", "probed", "result_at", "interval", "srtt", "rttvar", "rto",
         "retransmits", "failed_chunk", "results_refused")


def state_of(run):
    """Everything a sum holds, dicts with their order."""
    state = {name: getattr(run, name) for name in STATE}
    for name in ("deadline", "tries", "sent_at", "backoff"):
        state[name] = list(state[name].items())
    state["received"], state["done_chunks"] = bytes(run.received), bytes(run.done_chunks)
    state["next_deadline"] = run.next_deadline()
    return state


def patch(payload, name, value):
    """`payload` with field `name` set to `value` (wrapped to the field's width)."""
    out = bytearray(payload)
    field = FIELDS_BY_NAME[name]
    header_struct(name, name).pack_into(out, FRAME_OFFSETS[name] - PAYLOAD_OFFSET,
                                        value % (1 << field.bits) if not field.signed else
                                        (value + (1 << (field.bits - 1))) % (1 << field.bits) - (1 << (field.bits - 1)))
    return bytes(out)


def field(payload, name):
    return header_struct(name, name).unpack_from(payload, FRAME_OFFSETS[name] - PAYLOAD_OFFSET)[0]


def adversarial(rnd, result, chunk):
    """A result as a network may deliver it: mostly as sent, else damaged or another sum's."""
    kind = rnd.randrange(20)
    if kind < 8:
        return result
    if kind == 8:
        return patch(result, rnd.choice(("job", "round", "clique")), field(result, "job") + rnd.randint(1, 3))
    if kind == 9:
        name = rnd.choice(("exponent", "fanin", "bitmap", "contributors", "magic", "version", "opcode", "token",
                           "token"))
        return patch(result, name, field(result, name) + rnd.choice((-1, 1, 7)))
    if kind == 10:  # fewer or more elements, the length saying so: read as a wrong chunk
        count = max(0, field(result, "count") + rnd.choice((-2, -1, 1, 3)))
        elements = result[client.PAYLOAD_HEADER_BYTES:-RESULT_TRAILER_BYTES]
        elements = (elements + bytes(range(256)) * 4)[:4 * count]
        return patch(result, "count", count)[:client.PAYLOAD_HEADER_BYTES] + elements + result[-RESULT_TRAILER_BYTES:]
    if kind == 11:  # a count that the length does not match
        return patch(result, "count", field(result, "count") + rnd.choice((-1, 1, 1 << 15)))
    if kind == 12:
        status = int.from_bytes(result[-RESULT_TRAILER_BYTES:], "big") | STATUS_OVERFLOW | rnd.getrandbits(8)
        return result[:-RESULT_TRAILER_BYTES] + status.to_bytes(RESULT_TRAILER_BYTES, "big")
    if kind == 13:
        return result[:rnd.randrange(len(result))]
    if kind == 14:
        return result + bytes(rnd.randint(1, 9))
    if kind == 15:  # off a chunk boundary, or far past the vector
        return patch(result, "chunk", field(result, "chunk") + rnd.choice((1, chunk - 1 or 1, 1 << 31, (1 << 32) - 1)))
    if kind == 16:
        noisy = bytearray(result)
        for _ in range(rnd.randint(1, 4)):
            noisy[rnd.randrange(min(len(noisy), client.PAYLOAD_HEADER_BYTES))] = rnd.getrandbits(8)
        return bytes(noisy)
    if kind == 17:
        return bytes(rnd.getrandbits(8) for _ in range(rnd.choice((0, 1, 40, client.RESULT_MIN_BYTES))))
    if kind == 18:  # a result request of the same chunk, which carries no elements
        return patch(result, "opcode", client.Opcode.RESULT_REQUEST)[:client.PAYLOAD_HEADER_BYTES]
    return result[:client.PAYLOAD_HEADER_BYTES] + result[client.PAYLOAD_HEADER_BYTES:-RESULT_TRAILER_BYTES][::-1] \
        + result[-RESULT_TRAILER_BYTES:]


def model_results(vectors, key, chunk, window):
    """Every chunk's result, from the golden model, of the clique's `vectors` (one row per member)."""
    config = AggregatorConfig(slots=slots_needed(3, window), max_elements=16, registered=key.token != 0)
    model, address = Aggregator(config), ("10.73.87.1", config.port)
    peers = [("10.0.0.9", 4000 + m) for m in range(len(vectors))]
    if key.token:  # a registered job's sum: version 3, results to each member
        model.install(JobEntry(key.job, key.token, config.slots, frozenset((0x0A000009, port) for _, port in peers)))
    members = [contributions(vector, m, key, chunk, window) for m, vector in enumerate(vectors)]
    results = []
    for index in range(len(members[0])):
        frames = [frame for m, payloads in enumerate(members)
                  for frame in model.process(wrap(payloads[index], peers[m], address, bytes(6)))]
        results.append(payload_of(frames[-1]))
    return results


def make_sum(kind, vector, key, chunk, window, timeouts, as_list, in_place=False):
    """A sum of `kind` over member 0's `vector`; `in_place`: the sums overwrite the payloads' elements, as
    `UdpMember.average` runs them."""
    payloads = contributions(vector, 0, key, chunk, window) if as_list else Contributions(vector, 0, key, chunk, window)
    received = payloads.wire if in_place else None
    return kind(payloads, key, len(vector), chunk, window, *timeouts, received=received)


def differential(seed, steps=400):
    """Drive a `MemberSum` and a `CompiledMemberSum` of one random sum with one random stream; assert they agree
    after every step. Returns what happened: results taken, sums done, chunks fast-retransmitted, wrong and
    overflowed chunks, failed sums."""
    rnd = random.Random(seed)
    fanin, chunk, window = rnd.randint(1, 4), rnd.choice((1, 3, 7, 16)), rnd.randint(1, 6)
    elements = rnd.choice((0, 1, chunk, rnd.randint(1, 200)))
    registered = rnd.random() < 0.5
    key = CliqueKey(job=rnd.randrange(1, 1 << 32), round=rnd.randrange(1 << 32), clique=rnd.randrange(3),
                    group=0 if registered else 0xEF000001, fanin=fanin, exponent=-rnd.randrange(8), max_cliques=3,
                    token=rnd.randrange(1, 1 << 64) if registered else 0)
    adaptive = rnd.random() < 0.75
    timeouts = (rnd.choice((0.05, 1.0)), rnd.choice((None, 2, 8)), rnd.choice((0.002, 0.01)) if adaptive else None)
    rng = np.random.default_rng(seed)
    vectors = rng.integers(-2**30, 2**30, (fanin, elements)).astype(np.int32)
    as_list = rnd.random() < 0.2
    in_place = not as_list and rnd.random() < 0.3
    definition = make_sum(MemberSum, vectors[0], key, chunk, window, timeouts, as_list, in_place)
    lane = make_sum(CompiledMemberSum, vectors[0], key, chunk, window, timeouts, as_list, in_place)
    assert lane.lane is not None
    results = model_results(vectors, key, chunk, window)
    now = 0.0
    sent = definition.start(now)
    assert lane.start(now) == sent
    assert state_of(lane) == state_of(definition)
    taken = 0
    for _ in range(steps):
        now += rnd.choice((0.0, 1e-4, 0.001, 0.003, 0.02))
        if rnd.random() < 0.15 or not results:
            if rnd.random() < 0.3:
                now += 0.3  # a silence: timeouts and probes fall due, retries run out
            due = definition.due(now)
            assert lane.due(now) == due
        else:
            index = rnd.randrange(len(results))
            if rnd.random() < 0.5 and definition.deadline:  # mostly results of chunks in flight
                index = rnd.choice(list(definition.deadline))
            datagram = adversarial(rnd, results[index], chunk)
            checked = lane.checked
            given = datagram if rnd.random() < 0.5 else memoryview(bytearray(b"?" + datagram))[1:]
            assert list(lane.on_result(given, now)) == list(definition.on_result(datagram, now))
            taken += lane.checked - checked
        assert state_of(lane) == state_of(definition)
        if definition.done or definition.failed_chunk is not None:
            break
    return {"taken": taken, "done": definition.done, "fast": len(definition.fast_resent),
            "wrong": len(definition.wrong_chunks), "overflow": len(definition.overflowed_chunks),
            "failed": definition.failed_chunk is not None, "refused": definition.results_refused}


@pytest.mark.parametrize("seed", range(150))
def test_the_compiled_lane_does_what_the_definition_does(seed):
    differential(seed)


def test_the_streams_reach_every_path():
    """The streams above take results, finish sums, fast-retransmit, see wrong and overflowed chunks, refuse
    results of another version or token, and run out of retries."""
    seen = {}
    for seed in range(60):
        for name, value in differential(seed).items():
            seen[name] = seen.get(name, 0) + value
    assert all(seen.values()), seen


def batch(datagrams, slot_size):
    buffer = bytearray(slot_size * max(1, len(datagrams)))
    for index, datagram in enumerate(datagrams):
        buffer[index * slot_size:index * slot_size + len(datagram)] = datagram
    return buffer, [len(d) for d in datagrams]


@pytest.mark.parametrize("seed", range(20))
def test_a_batch_of_results_is_read_as_one_by_one(seed):
    """`on_results` (one call per recvmmsg batch, as `UdpMember` reads them) against the definition's."""
    rnd = random.Random(seed)
    key = CliqueKey(job=3, round=5, clique=1, group=0xEF000001, fanin=2, exponent=-2, max_cliques=3)
    chunk, window, elements = 5, 4, 97
    vectors = np.random.default_rng(seed).integers(-1000, 1000, (2, elements)).astype(np.int32)
    runs = [make_sum(kind, vectors[0], key, chunk, window, (1.0, None, 0.002), False)
            for kind in (MemberSum, CompiledMemberSum)]
    results = model_results(vectors, key, chunk, window)
    assert runs[0].start(0.0) == runs[1].start(0.0)
    now = 0.0
    while not runs[0].done:
        now += 0.001
        datagrams = [adversarial(rnd, results[rnd.choice(list(runs[0].deadline))], chunk)
                     for _ in range(rnd.randint(0, 8))]
        buffer, sizes = batch(datagrams, client.RECEIVE_SLOT)
        assert runs[1].on_results(buffer, sizes, client.RECEIVE_SLOT, now) == runs[0].on_results(
            buffer, sizes, client.RECEIVE_SLOT, now)
        assert state_of(runs[1]) == state_of(runs[0])
        if not datagrams:
            assert runs[1].due(now + 1.0) == runs[0].due(now + 1.0)
    with pytest.raises(ValueError):  # sizes that do not fit the buffer are refused, not read past its end
        runs[1].on_results(bytearray(100), [101], 200, now)
    with pytest.raises(ValueError):
        runs[1].on_results(bytearray(220), [50, 50], 200, now)


def tampered(monkeypatch, change):
    """The compiled kernel with `member_lane`'s arguments changed by `change(arguments) -> arguments`."""
    real = client.compiled
    fake = types.SimpleNamespace(**{name: getattr(real, name) for name in dir(real) if not name.startswith("__")})
    fake.member_lane = lambda *arguments: real.member_lane(*change(list(arguments)))
    monkeypatch.setattr(client, "compiled", fake)


def replace(sequence, index, value):
    return tuple(value if position == index else item for position, item in enumerate(sequence))


@pytest.mark.parametrize("change", [
    lambda a: replace(a, 2, replace(a[2], 7, a[2][7] + 1)),  # fast retransmit after 4 later results, not 3
    lambda a: replace(a, 2, replace(a[2], 3, 2)),  # another status bit read as the overflow
    lambda a: replace(a, 0, replace(a[0], 6, a[0][7])),  # the job read where the round is
    lambda a: replace(a, 1, replace(a[1], 4, None)),  # the exponent not compared
    lambda a: a if a[7] is None else replace(a, 7, replace(a[7], 4, a[7][4][1:] + a[7][4][:1])),  # slots shifted
    lambda a: replace(a, 1, replace(a[1], 12, None)),  # the token not compared
])
def test_the_differential_test_catches_a_tampered_lane(monkeypatch, change):
    tampered(monkeypatch, lambda arguments: list(change(arguments)))
    failed = 0
    for seed in range(60):
        try:
            differential(seed)
        except AssertionError:
            failed += 1
    assert failed > 0


def test_a_sum_no_header_can_match_is_read_in_python():
    """A key no result field can hold (an exponent beyond int8; the payloads made at another): the
    definition reads its results, and finds each of them wrong."""
    sent_key = CliqueKey(job=1, round=2, clique=0, group=0xEF000001, fanin=1, exponent=0)
    key = CliqueKey(job=1, round=2, clique=0, group=0xEF000001, fanin=1, exponent=300)
    payloads = contributions(np.arange(8, dtype=np.int32), 0, sent_key, 4, 2)
    run = CompiledMemberSum(payloads, key, 8, 4, 2)
    assert run.lane is None and run.start(0.0) == payloads
    model, address = Aggregator(AggregatorConfig(slots=8, max_elements=4)), ("10.73.87.1", 0x4957)
    (result,) = [payload_of(f) for f in model.process(wrap(payloads[0], ("10.0.0.9", 4000), address, bytes(6)))]
    run.on_result(result, 0.01)
    assert run.wrong_chunks == {0} and run.checked == 1


def test_the_island_client_uses_the_compiled_lane():
    key = CliqueKey(job=1, round=2, clique=0, group=0xEF000001, fanin=1, exponent=0)
    assert type(client.member_sum(contributions(np.arange(8, dtype=np.int32), 0, key, 4, 2), key, 8, 4, 2)) \
        is CompiledMemberSum


def test_the_lane_finds_the_sum_s_state_by_name_once_and_refuses_a_rename():
    """The lane reads and writes a sum's state at its slots' offsets, found by name when `client` binds
    `MemberSum`: a class where one of them is renamed, or shadowed by a class attribute (no longer the slot),
    is refused there, naming the attribute; a sum of another class is refused by `member_result`."""
    kernel = client.compiled
    names = MemberSum.__slots__
    renamed = type("Renamed", (), {"__slots__": tuple("smoothed_rtt" if name == "srtt" else name for name in names)})
    with pytest.raises(AttributeError, match=r"Renamed has no attribute srtt\b"):
        kernel.member_state(renamed)
    shadowed = type("Shadowed", (MemberSum,), {"__slots__": (), "retransmits": 0})
    with pytest.raises(TypeError, match=r"Shadowed\.retransmits is not a writable slot"):
        kernel.member_state(shadowed)
    key = CliqueKey(job=1, round=2, clique=0, group=0xEF000001, fanin=1, exponent=0)
    run = CompiledMemberSum(contributions(np.arange(8, dtype=np.int32), 0, key, 4, 2), key, 8, 4, 2)
    stand_in = types.SimpleNamespace(**{name: getattr(run, name) for name in names})
    with pytest.raises(TypeError, match="must be a MemberSum"):
        kernel.member_result(run.lane, stand_in, b"", 0.0)
