"""The aggregator testbench: clock, reset, AXI-Stream source and sink, pauses, and a golden-model scoreboard.

Every expected frame and counter comes from `inwire.model.Aggregator` fed with the same frames, aborted
cut-through answers (tuser on the last beat) included: the model says which beats leave before the abort.
Every output beat must carry a contiguous tkeep, full on every beat but the last.

Time: the testbench drives `lease_tick` itself, only while no frame is going in (`advance`), so every
frame's arrival time (the gateware's timer when its header ends) is the count of ticks driven before it,
which is what the model is given.
"""

import json
import os
import random

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles, RisingEdge
from cocotbext.axi import AxiStreamBus, AxiStreamFrame, AxiStreamSink, AxiStreamSource

from inwire.jobs import JobLimits
from inwire.model import Aggregator as Model
from inwire.model import AggregatorConfig
from inwire.protocol import COUNTERS
from inwire_hdl.job_table import GatewareJobs

CONFIG_ENV = "INWIRE_TB_CONFIG"
STALL_LIMIT = 10_000
"""Cycles without a beat moving while one waits at the input; the sink's pauses never last this long."""


def tb_config():
    fields = json.loads(os.environ.get(CONFIG_ENV, "{}"))
    if fields.get("upstream") is not None:
        # JSON made the (network, prefix length) pair a list; the configuration is hashable with a tuple.
        fields["upstream"] = tuple(fields["upstream"])
    if "limits" in fields:
        fields["limits"] = JobLimits(**fields["limits"])
    return AggregatorConfig(**fields)


def random_pauses(probability, seed):
    """A pause generator for cocotbext-axi: pauses a cycle with the given probability."""
    chooser = random.Random(seed)
    while True:
        yield chooser.random() < probability


def is_aborted(frame):
    user = frame.tuser
    return bool(user[-1] if isinstance(user, list) else user)


def contiguous_bytes(frame, width, index):
    """The frame's bytes, after checking that each beat's tkeep is contiguous from lane 0 and that every
    beat but the last is full (cocotbext-axi's own compaction would hide a hole)."""
    keep = frame.tkeep
    for start in range(0, len(keep), width):
        beat = keep[start:start + width]
        kept = sum(beat)
        last = start + width >= len(keep)
        assert kept and all(beat[:kept]) and (last or kept == width), (
            f"frame {index}, beat {start // width}: tkeep {''.join(map(str, beat))} is not contiguous"
            + ("" if last else " or not full before the last beat"))
    return bytes(byte for byte, kept in zip(frame.tdata, keep, strict=True) if kept)


RESOLVABLE_BITS = frozenset("01LH")
"""The bit values `LogicArray.is_resolvable` accepts."""


class KeptLanes:
    """m_axis_tdata as the sink reads it: a lane whose tkeep bit is 0 carries no byte and reads as 0.

    cocotbext-axi's sink converts the whole bus to an integer, which fails on a lane the gateware leaves
    undefined: Icarus reads X from beyond the end of the sum memory when the last slot's upper bank ends a
    result in a partial beat (any slot count that is not a power of two). A kept lane that is not 0/1 is
    still an error, naming the lanes."""

    def __init__(self, tdata, tkeep):
        self.tdata, self.tkeep = tdata, tkeep

    def __len__(self):
        return len(self.tdata)

    @property
    def value(self):
        data = self.tdata.value
        # One string test: `is_resolvable` makes a Logic object per bit, 512 of them a beat at 64 bytes.
        bits = str(data)
        if set(bits) <= RESOLVABLE_BITS:
            return data.to_unsigned()
        keep = self.tkeep.value.to_unsigned()
        lanes = [bits[len(bits) - 8 * (lane + 1):len(bits) - 8 * lane] for lane in range(len(bits) // 8)]
        undefined = [lane for lane, text in enumerate(lanes) if keep >> lane & 1 and not set(text) <= {"0", "1"}]
        if undefined:
            raise ValueError(f"m_axis_tdata {bits}: lanes {undefined} are kept (tkeep {keep:b}) but not 0/1")
        return sum(int(text, 2) << 8 * lane for lane, text in enumerate(lanes) if keep >> lane & 1)


class TB:
    def __init__(self, dut, seed=0):
        self.dut = dut
        self.config = tb_config()
        self.width = len(dut.s_axis_tkeep)
        self.seed = seed
        Clock(dut.clk, 10, unit="ns").start()
        self.source = AxiStreamSource(AxiStreamBus.from_prefix(dut, "s_axis"), dut.clk, dut.rst)
        output = AxiStreamBus.from_prefix(dut, "m_axis")
        output.tdata = KeptLanes(output.tdata, output.tkeep)
        self.sink = AxiStreamSink(output, dut.clk, dut.rst)
        self.model = Model(self.config)
        self.jobs = GatewareJobs(self.model) if self.config.registered else None
        """Which entry of the gateware's job tables holds which job (with `config.registered`)."""
        if self.jobs is not None:
            dut.ctl_we.value = 0
        self.expected = []
        """(aborted, bytes) per frame the model predicts, in order."""
        self.outputs = []
        """(aborted, bytes) per frame that left the gateware, in order."""
        self.received = []
        """The frames that left whole, for the drivers that write them out."""
        self.aborted = 0
        self.cycles = 0
        self.ticks = 0
        """Lease ticks driven since the last reset: the arrival time of the frames sent now."""
        dut.lease_tick.value = 0
        cocotb.start_soon(self._count_cycles())

    async def _count_cycles(self):
        """Counts cycles, and fails the test when the aggregator holds off a beat on its input for
        STALL_LIMIT cycles while nothing moves on either side: a deadlock, which would otherwise hang
        the simulation."""
        dut, stalled = self.dut, 0
        while True:
            await RisingEdge(dut.clk)
            self.cycles += 1
            moving = (dut.s_axis_tvalid.value == 1 and dut.s_axis_tready.value == 1) or (
                dut.m_axis_tvalid.value == 1 and dut.m_axis_tready.value == 1)
            stalled = 0 if moving or dut.s_axis_tvalid.value != 1 else stalled + 1
            assert stalled < STALL_LIMIT, (
                f"deadlock at cycle {self.cycles}: input beat held off {STALL_LIMIT} cycles, nothing moving")

    async def reset(self, cycles=4):
        self.dut.rst.value = 1
        await ClockCycles(self.dut.clk, cycles)
        self.dut.rst.value = 0
        await ClockCycles(self.dut.clk, 2)

    def restart_model(self):
        """After a reset the gateware is empty: so is the model, and nothing in flight is expected."""
        self.model = Model(self.config)
        self.jobs = GatewareJobs(self.model) if self.config.registered else None
        self.ticks = 0
        self.expected.clear()
        self.outputs.clear()
        self.received.clear()
        self.sink.clear()

    def pauses(self, source=0.0, sink=0.0):
        """Random pauses on each side with the given probability per cycle; 0 for none."""
        for end, probability, seed in ((self.source, source, self.seed), (self.sink, sink, self.seed + 1)):
            if probability:
                end.set_pause_generator(random_pauses(probability, seed))
            else:
                end.clear_pause_generator()
                # Clearing the generator leaves `pause` at its last value, which may be a pause for good.
                end.pause = False

    async def install(self, entry):
        """Install a job (`inwire.jobs.JobEntry`) in the model and, through the control interface, in the
        gateware, once every frame sent so far has gone in and out (the model installs between frames)."""
        await self.drain(quiet_cycles=32)
        await self.control(self.jobs.install(entry))

    async def leave(self, job, members):
        await self.drain(quiet_cycles=32)
        writes, _, _ = self.jobs.leave(job, members)
        await self.control(writes)

    async def remove(self, job):
        await self.drain(quiet_cycles=32)
        await self.control(self.jobs.remove(job))

    async def control(self, writes):
        """Drive (address, word) writes on the control interface, one a cycle."""
        dut = self.dut
        for address, word in writes:
            dut.ctl_we.value, dut.ctl_addr.value, dut.ctl_data.value = 1, address, word
            await RisingEdge(dut.clk)
        dut.ctl_we.value = 0
        await RisingEdge(dut.clk)

    async def advance(self, ticks):
        """Let `ticks` lease ticks pass once every frame sent so far has gone in, one per cycle."""
        await self.source.wait()
        if ticks:
            self.dut.lease_tick.value = 1
            await ClockCycles(self.dut.clk, ticks)
            self.dut.lease_tick.value = 0
            self.ticks += ticks

    async def send(self, frames):
        for frame in frames:
            prefix = self.model.cut_through_abort(frame, self.width, self.ticks)
            answers = self.model.process(frame, self.ticks)
            self.expected.extend([(True, prefix)] if prefix is not None else [(False, out) for out in answers])
            await self.source.send(AxiStreamFrame(frame))

    def _collect(self):
        while not self.sink.empty():
            frame = self.sink.recv_nowait(compact=False)
            data = contiguous_bytes(frame, self.width, len(self.outputs))
            aborted = is_aborted(frame)
            self.outputs.append((aborted, data))
            if aborted:
                self.aborted += 1
            else:
                self.received.append(data)

    async def drain(self, quiet_cycles=200, limit_cycles=200_000):
        """Wait until the source is done and the output has been quiet for a while."""
        await self.source.wait()
        quiet, waited = 0, 0
        while quiet < quiet_cycles and waited < limit_cycles:
            await RisingEdge(self.dut.clk)
            waited += 1
            busy = self.dut.m_axis_tvalid.value == 1 or self.dut.s_axis_tvalid.value == 1
            quiet = 0 if busy else quiet + 1
        self._collect()

    def counters(self):
        return {name: int(getattr(self.dut, f"stat_{name}").value) for name in COUNTERS}

    async def check(self):
        """Compare everything that came out, in order, and all counters with the model."""
        await self.drain()
        expected = self.expected
        assert len(self.outputs) == len(expected), (
            f"{len(self.outputs)} frames out ({self.aborted} aborted), model predicts {len(expected)} "
            f"({sum(aborted for aborted, _ in expected)} aborted)")
        for index, ((aborted, got), (want_aborted, want)) in enumerate(zip(self.outputs, expected, strict=True)):
            kind = {True: "aborted", False: "whole"}
            assert aborted == want_aborted, f"frame {index}: {kind[aborted]}, model predicts {kind[want_aborted]}"
            if aborted:
                # The aborting beat has no defined content: what went before it must be the model's.
                assert got[:len(want)] == want and len(want) < len(got) <= len(want) + self.width, (
                    f"aborted frame {index} differs: got {got.hex()} want {want.hex()} and one beat")
            else:
                assert got == want, f"frame {index} differs: got {got.hex()} want {want.hex()}"
        model_counters = {name: value & 0xFFFFFFFF for name, value in self.model.stats().items()}
        assert self.counters() == model_counters, (self.counters(), model_counters)
