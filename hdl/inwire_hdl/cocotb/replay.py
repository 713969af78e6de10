"""Replay: frames from a JSON list of hex strings through the gateware, frames out to JSON, with counters.
With INWIRE_REPLAY_TIMES (a JSON list of arrival times in lease ticks, one per frame, not decreasing), the
lease ticks between frames are driven before each one.

Only the gateware runs here: what comes out is whatever it sends, with no model involved."""

import json
import os

import cocotb
from cocotbext.axi import AxiStreamFrame

from .testbench import TB


@cocotb.test()
async def replay(dut):
    tb = TB(dut)
    await tb.reset()
    frames = [bytes.fromhex(frame) for frame in json.loads(open(os.environ["INWIRE_REPLAY_IN"]).read())]
    times_path = os.environ.get("INWIRE_REPLAY_TIMES")
    times = json.loads(open(times_path).read()) if times_path else [0] * len(frames)
    for frame, now in zip(frames, times, strict=True):
        await tb.advance(now - tb.ticks)
        await tb.source.send(AxiStreamFrame(frame))
    await tb.drain()
    with open(os.environ["INWIRE_REPLAY_OUT"], "w") as out:
        json.dump({"frames": [frame.hex() for frame in tb.received], "counters": tb.counters(),
                   "aborted": tb.aborted}, out)
