"""cocotb fuzzing of the aggregator: mutated frames, then a clean round, the golden model as scoreboard.

A gateware built with job tables (`registered`) first gets the registered jobs of `mutate.fuzz_jobs` through its
control interface, and the stream holds their version 3 traffic and forgeries of it beside versions 1 and 2.

Environment: INWIRE_FUZZ_FRAMES (mutated and random frames, default 2000), INWIRE_FUZZ_SEED,
INWIRE_FUZZ_CHUNK (frames between two scoreboard checks), INWIRE_FUZZ_REPORT (JSON written at the end:
frames per kind, the jobs installed, counters, results of the clean round).
"""

import collections
import json
import os
import random
from pathlib import Path

import cocotb
from functional import Coverage
from mutate import Mutator, clean_round, fuzz_jobs

from inwire.protocol import COUNTERS, Disposition
from inwire_hdl.cocotb.testbench import TB
from inwire_hdl.cocotb.traffic import Traffic

DISPOSITIONS = tuple(d.name.lower() for d in Disposition)
FRAMES_BETWEEN_PAUSES = 50
"""Frames sent between two pauses of the input. In most pauses the lease timer runs for a few ticks; in every
LONG_PAUSE-th for one to two leases: abandoned slots expire and are claimed by other owners."""
SHORT_PAUSE = 32
LONG_PAUSE = 3
"""Every this many pauses one lasts a lease or more: with a lease of thousands of ticks, pauses that long at
every step would take more cycles than the frames."""


def accounted(tb, sent):
    """Every frame sent is in the gateware's counters exactly once, by disposition."""
    counters = tb.counters()
    assert counters["frames_in"] == sent & 0xFFFFFFFF, (counters["frames_in"], sent)
    assert sum(counters[name] for name in DISPOSITIONS) & 0xFFFFFFFF == counters["frames_in"], counters


@cocotb.test()
async def fuzz_then_clean_round(dut):
    frames = int(os.environ.get("INWIRE_FUZZ_FRAMES", "2000"))
    seed = int(os.environ.get("INWIRE_FUZZ_SEED", "1"))
    chunk = int(os.environ.get("INWIRE_FUZZ_CHUNK", "1000"))
    tb = TB(dut, seed)
    await tb.reset()
    coverage = Coverage(tb.model)
    jobs = fuzz_jobs(tb.config, seed)
    for entry in jobs:
        await tb.install(entry)
    mutator = Mutator(tb.config, seed, jobs)
    pauses = random.Random(seed)
    kinds = collections.Counter()
    sent = 0
    stream = mutator.frames(frames)
    while sent < frames:
        batch = [next(stream) for _ in range(min(chunk, frames - sent))]
        # Alternate full speed with random pauses on both sides.
        pause = (sent // chunk) % 3
        tb.pauses(0.1 * pause, 0.25 * pause)
        kinds.update(kind for kind, _ in batch)
        for start in range(0, len(batch), FRAMES_BETWEEN_PAUSES):
            await tb.send([frame for _, frame in batch[start:start + FRAMES_BETWEEN_PAUSES]])
            if (sent + start) // FRAMES_BETWEEN_PAUSES % LONG_PAUSE == LONG_PAUSE - 1:
                await tb.advance(pauses.randint(tb.config.lease, 2 * tb.config.lease))
            else:
                await tb.advance(pauses.randrange(SHORT_PAUSE))
        sent += len(batch)
        await tb.check()
        accounted(tb, sent)
    fuzz_counters = tb.counters()

    # The clean round: every slot completes and its result is the model's.
    before = tb.model.stats()["results_emitted"]
    tb.pauses(0.2, 0.2)
    clean = clean_round(tb.model, Traffic(tb.config, seed + 1), seed + 2)
    await tb.send(clean)
    sent += len(clean)
    await tb.check()
    accounted(tb, sent)
    results = tb.model.stats()["results_emitted"] - before
    assert results == tb.config.slots, f"clean round completed {results} of {tb.config.slots} slots"

    report = os.environ.get("INWIRE_FUZZ_REPORT")
    if report:
        Path(report).write_text(json.dumps({
            "seed": seed, "frames": frames, "clean_frames": len(clean), "kinds": dict(kinds),
            "jobs": [{"job": entry.job, "slots": entry.slots, "members": len(entry.members)} for entry in jobs],
            "aborted_outputs": tb.aborted, "frames_out": len(tb.received), "clean_results": results,
            "fuzz_counters": fuzz_counters, "counters": {name: tb.counters()[name] for name in COUNTERS},
            "cycles": tb.cycles, "coverage": coverage.report(),
        }, indent=1))
