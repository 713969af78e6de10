"""Co-simulation service: frames and control-interface writes arrive one at a time over a socket (the
messages: `inwire_hdl.cosim`); what the gateware sends for each frame, and its counters, go back. Only the
gateware decides here: no model is consulted."""

import json
import os
import socket
import struct

import cocotb
from cocotbext.axi import AxiStreamFrame

from inwire_hdl.cosim import CONTROL, QUIT, receive_exactly

from .testbench import TB

QUIET_CYCLES = 64
"""Idle output cycles after which a frame's answer is complete: the pipeline's latency is far shorter."""
@cocotb.test()
async def cosim(dut):
    tb = TB(dut)
    await tb.reset()
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    connection.connect(os.environ["INWIRE_COSIM_SOCKET"])
    with connection:
        while (size := struct.unpack(">I", receive_exactly(connection, 4))[0]) != QUIT:
            if size == CONTROL:
                count = struct.unpack(">I", receive_exactly(connection, 4))[0]
                await tb.control(list(struct.iter_unpack(">II", receive_exactly(connection, 8 * count))))
            else:
                await tb.advance(struct.unpack(">I", receive_exactly(connection, 4))[0])
                await tb.source.send(AxiStreamFrame(receive_exactly(connection, size)))
                await tb.drain(quiet_cycles=QUIET_CYCLES)
            reply = json.dumps({"frames": [frame.hex() for frame in tb.received], "counters": tb.counters(),
                                "aborted": tb.aborted}).encode()
            tb.received.clear()
            connection.sendall(struct.pack(">I", len(reply)) + reply)
