"""The traffic table (tests/traffic.py) through the gateware: one cocotb test that runs every scenario.

The scenarios come as JSON (INWIRE_TABLE_IN: {name: {"jobs": [job entry fields], "steps": [[frame hex, arrival
time], ...]}}). Each starts from a reset, as the model it is compared with starts empty, and installs its jobs
through the control interface; each frame goes in once the lease ticks up to its
arrival time are driven, and its output is collected until quiet. What the gateware sent for each frame
and its counters after it go to INWIRE_TABLE_OUT; tests/test_traffic_table.py compares them with the
golden model. Only the gateware decides here.
"""

import json
import os

import cocotb
from cocotbext.axi import AxiStreamFrame

from inwire.jobs import JobEntry
from inwire_hdl.cocotb.testbench import TB

QUIET_CYCLES = 64
"""Idle output cycles after which a frame's answer is complete (as the co-simulation waits)."""


@cocotb.test()
async def traffic_table(dut):
    with open(os.environ["INWIRE_TABLE_IN"]) as source:
        scenarios = json.load(source)
    tb = TB(dut)
    results = {}
    for name, scenario in scenarios.items():
        await tb.reset()
        tb.restart_model()
        for fields in scenario["jobs"]:
            await tb.install(JobEntry(**{**fields, "members": {tuple(member) for member in fields["members"]}}))
        frames = []
        for data, now in scenario["steps"]:
            await tb.advance(now - tb.ticks)
            await tb.source.send(AxiStreamFrame(bytes.fromhex(data)))
            await tb.drain(quiet_cycles=QUIET_CYCLES)
            frames.append({"outputs": [out.hex() for out in tb.received], "aborted": tb.aborted,
                           "counters": tb.counters()})
            tb.received.clear()
            tb.aborted = 0
        results[name] = frames
    with open(os.environ["INWIRE_TABLE_OUT"], "w") as out:
        json.dump(results, out)
