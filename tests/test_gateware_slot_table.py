"""The slot table alone in amaranth.sim: lookup, commit, and a commit forwarded to the lookup right after it.

A lookup reads the slot on the edge that registers C2 (`load`) and compares the frame's key with the entry
on the next (`compare`); the match (`access.found`) is there the cycle after. Expectations come from the
model's slot rules (`round_is_newer`, `is_older`, the lease's modular idle time) and the frame arithmetic.
"""

import random

import pytest
from amaranth.sim import Simulator

from inwire.model import TIME_BITS, AggregatorConfig, is_older, round_is_newer
from inwire.protocol import ELEMENT_BYTES, FRAME_HEADER_BYTES, RESULT_TRAILER_BYTES
from inwire_hdl.aggregator import Aggregator

CONFIG = AggregatorConfig(slots=4, max_elements=32, max_fanin=8)
ENTRY_FIELDS = ("job", "round", "clique", "chunk", "fanin", "group", "count", "exponent", "level", "bitmap",
                "contributors", "complete", "cur", "stamp")
MATCH_FIELDS = ("meta_valid", "key_match", "shape_match", "duplicate", "newer", "older", "last_member", "idle",
                "len_meta", "beats_meta")

# The slot table is taken from an aggregator (which sizes it); the rest is never elaborated.
pytestmark = pytest.mark.filterwarnings("ignore:.*created but never used")


def random_entry(rng):
    level = rng.choice([0b11, 0b1111, 0xFF, 0b1010])
    return {"job": rng.choice([1, 2]), "round": rng.choice([0, 1, 5, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF]),
            "clique": rng.choice([0, 3]), "chunk": rng.choice([0, 2, 9]), "fanin": rng.choice([4, 8]),
            "group": 0xEF000001, "count": rng.choice([1, 2, 31, 32]), "exponent": 0, "level": level,
            "bitmap": level & rng.getrandbits(8), "contributors": rng.randrange(9), "complete": rng.randrange(2),
            "cur": rng.randrange(2), "stamp": rng.choice([0, 5, 0xFFFE, rng.getrandbits(TIME_BITS)])}


def key_near(entry, rng):
    """A frame's key that shares some of `entry`'s fields and differs in others."""
    def near(value, *others):
        return rng.choice([value, value, *others])
    return {"job": near(entry["job"], 3 - entry["job"]),
            "round": near(entry["round"], (entry["round"] + 1) & 0xFFFFFFFF, (entry["round"] - 1) & 0xFFFFFFFF,
                          (entry["round"] + 2**31) & 0xFFFFFFFF),
            "clique": near(entry["clique"], 3 - entry["clique"]), "chunk": near(entry["chunk"], 0, 9),
            "fanin": near(entry["fanin"], 2), "group": near(entry["group"], 0xEF000002),
            "count": near(entry["count"], 3), "exponent": near(entry["exponent"], 1),
            "level": near(entry["level"], 0b111), "members": rng.choice([1, 2, 4, 8, 0b1100, 0x80]),
            "sender": 0, "now": near(entry["stamp"], (entry["stamp"] + 3) % 2**TIME_BITS,
                                     (entry["stamp"] - 3) % 2**TIME_BITS, rng.getrandbits(TIME_BITS))}


def expected_match(entry, key, width):
    """What the slot table must answer for `key` against the committed `entry`."""
    owner = tuple(entry[name] for name in ("job", "round", "clique", "chunk"))
    frame = tuple(key[name] for name in ("job", "round", "clique", "chunk"))
    length = entry["count"] * ELEMENT_BYTES + FRAME_HEADER_BYTES + RESULT_TRAILER_BYTES
    return {"meta_valid": 1, "key_match": int(frame == owner),
            "shape_match": int(all(entry[name] == key[name]
                                   for name in ("fanin", "group", "count", "exponent", "level"))),
            "duplicate": int(entry["bitmap"] & key["members"] != 0),
            "newer": int(key["job"] == entry["job"] and round_is_newer(key["round"], entry["round"])),
            "older": int(is_older(frame, owner)),
            "last_member": int(entry["bitmap"] | key["members"] == key["level"]),
            "idle": (key["now"] - entry["stamp"]) % 2**TIME_BITS, "len_meta": length,
            "beats_meta": -(-length // width)}


class TableBench:
    """Drives `dut`'s lookup and access ports as the classifier and the decider do."""

    def __init__(self, dut, ctx):
        self.dut, self.ctx = dut, ctx

    def commit(self, slot, entry):
        ctx, access = self.ctx, self.dut.access
        ctx.set(access.commit, 1)
        ctx.set(access.commit_slot, slot)
        for name in ENTRY_FIELDS:
            ctx.set(getattr(access.commit_entry, name), entry[name])

    async def tick(self):
        await self.ctx.tick()
        self.ctx.set(self.dut.access.commit, 0)

    async def lookup(self, slot, key, commit_before=None, commit_with=None):
        """The match of `key` for `slot`; `commit_before` / `commit_with` ((slot, entry)) are committed in
        the cycle before the read's `load` edge / in that cycle."""
        ctx, lookup = self.ctx, self.dut.lookup
        if commit_before:
            self.commit(*commit_before)
            await self.tick()
        ctx.set(lookup.read, 1)
        ctx.set(lookup.addr, slot)
        ctx.set(lookup.load, 1)
        if commit_with:
            self.commit(*commit_with)
        await self.tick()
        ctx.set(lookup.load, 0)
        ctx.set(lookup.compare, 1)
        for name, value in {**key, "slot": slot, "slot_bad": 0}.items():
            ctx.set(getattr(lookup.key, name), value)
        await self.tick()
        ctx.set(lookup.compare, 0)
        found = self.dut.access.found
        return ({name: ctx.get(getattr(found, name)) for name in MATCH_FIELDS},
                {name: ctx.get(getattr(found.entry, name)) for name in ENTRY_FIELDS})


def run(width, bench):
    dut = Aggregator(CONFIG, width).slot_table

    async def process(ctx):
        await bench(TableBench(dut, ctx))

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(process)
    sim.run()


@pytest.mark.parametrize("width", [8, 64])
def test_lookup_compares_the_frame_with_the_committed_entry_as_the_model_does(width):
    rng = random.Random(width)
    cases = []
    for _ in range(150):
        entry = random_entry(rng)
        cases.append((rng.randrange(CONFIG.slots), entry, key_near(entry, rng)))
    answers = []

    async def bench(table):
        found, _ = await table.lookup(2, key_near(random_entry(rng), rng))
        answers.append(found["meta_valid"])
        for slot, entry, key in cases:
            table.commit(slot, entry)
            for _ in range(3):
                await table.tick()
            answers.append(await table.lookup(slot, key))

    run(width, bench)
    assert answers[0] == 0, "a slot never committed matches nothing"
    for (slot, entry, key), (found, stored) in zip(cases, answers[1:], strict=True):
        assert stored == entry
        assert found == expected_match(entry, key, width), (slot, entry, key)


@pytest.mark.parametrize("when", ["commit_before", "commit_with"])
def test_a_commit_reaches_the_lookup_right_after_it(when):
    """A commit one cycle before the read passes through the read port; one on the read's edge is written
    too late for the read and is forwarded. A commit to another slot leaves the lookup's entry alone."""
    rng = random.Random(7)
    old, new, other = random_entry(rng), random_entry(rng), random_entry(rng)
    key = key_near(new, rng)
    results = []

    async def bench(table):
        table.commit(1, old)
        for _ in range(3):
            await table.tick()
        results.append(await table.lookup(1, key, **{when: (1, new)}))
        for _ in range(3):
            await table.tick()
        results.append(await table.lookup(1, key, **{when: (2, other)}))

    run(8, bench)
    (found_new, stored_new), (found_after, stored_after) = results
    assert (found_new, stored_new) == (expected_match(new, key, 8), new)
    assert (found_after, stored_after) == (expected_match(new, key, 8), new)
