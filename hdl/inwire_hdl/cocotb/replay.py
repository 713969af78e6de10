"""Replay: frames from a JSON list of hex strings through the gateware, frames out to JSON, with counters.

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
    for frame in frames:
        await tb.source.send(AxiStreamFrame(frame))
    await tb.drain()
    with open(os.environ["INWIRE_REPLAY_OUT"], "w") as out:
        json.dump({"frames": [frame.hex() for frame in tb.received], "counters": tb.counters(),
                   "aborted": tb.aborted}, out)
