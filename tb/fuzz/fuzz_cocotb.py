"""cocotb fuzzing of the aggregator: mutated frames, then a clean round, the golden model as scoreboard.

Environment: INWIRE_FUZZ_FRAMES (mutated and random frames, default 2000), INWIRE_FUZZ_SEED,
INWIRE_FUZZ_CHUNK (frames between two scoreboard checks), INWIRE_FUZZ_REPORT (JSON written at the end:
frames per kind, counters, results of the clean round).
"""

import collections
import json
import os
import random
from pathlib import Path

import cocotb
from functional import Coverage
from mutate import Mutator, clean_round

from inwire.protocol import COUNTERS, Disposition
from inwire_hdl.cocotb.testbench import TB
from inwire_hdl.cocotb.traffic import Traffic

DISPOSITIONS = tuple(d.name.lower() for d in Disposition)
FRAMES_BETWEEN_PAUSES = 50
"""Frames sent between two pauses of the input, in each of which the lease timer runs for 0 to 2 leases:
abandoned slots expire and are claimed by other owners."""


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
    mutator = Mutator(tb.config, seed)
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
            await tb.advance(pauses.randrange(2 * tb.config.lease + 1))
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
            "aborted_outputs": tb.aborted, "frames_out": len(tb.received), "clean_results": results,
            "fuzz_counters": fuzz_counters, "counters": {name: tb.counters()[name] for name in COUNTERS},
            "cycles": tb.cycles, "coverage": coverage.report(),
        }, indent=1))
