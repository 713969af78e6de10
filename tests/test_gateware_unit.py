"""Fast amaranth.sim tests of the gateware's blocks and of the whole aggregator against the golden model."""

import random

import numpy as np
import pytest
from amaranth.hdl import Module
from amaranth.sim import Simulator

from inwire.model import Aggregator as Model
from inwire.model import AggregatorConfig
from inwire.packets import build_frames
from inwire.protocol import COUNTERS, FRAME_HEADER_BYTES, Opcode
from inwire_hdl.aggregator import Aggregator
from inwire_hdl.blocks import INT32_MAX, INT32_MIN, RegisteredFIFO, SaturatingAdder, popcount

CONFIG = AggregatorConfig(slots=4, max_elements=32, max_fanin=8)


def run_comb(dut, process):
    sim = Simulator(dut)
    sim.add_testbench(process)
    sim.run()


def test_saturating_adder_matches_numpy_clip():
    lanes = 16
    dut = SaturatingAdder(lanes)
    rng = np.random.default_rng(1)
    edges = np.array([INT32_MAX, INT32_MIN, -1, 0, 1, INT32_MAX - 5, INT32_MIN + 5], dtype=np.int64)
    cases = [rng.integers(INT32_MIN, INT32_MAX, size=(2, lanes), endpoint=True) for _ in range(20)]
    cases += [rng.choice(edges, size=(2, lanes)) for _ in range(20)]

    async def process(ctx):
        for a, b in cases:
            for base_zero in (0, 1):
                ctx.set(dut.a, int.from_bytes(a.astype(">i4").tobytes(), "little"))
                ctx.set(dut.b, int.from_bytes(b.astype(">i4").tobytes(), "little"))
                ctx.set(dut.base_zero, base_zero)
                total = b + (0 if base_zero else a)
                expected = np.clip(total, INT32_MIN, INT32_MAX).astype(">i4").tobytes()
                assert ctx.get(dut.sum).to_bytes(4 * lanes, "little") == expected
                saturated = (total > INT32_MAX) | (total < INT32_MIN)
                assert ctx.get(dut.saturated) == sum(int(s) << i for i, s in enumerate(saturated))

    run_comb(dut, process)


def test_popcount_counts_bits():
    from amaranth.hdl import Signal

    value = Signal(37)
    count = Signal(6)
    m = Module()
    m.d.comb += count.eq(popcount(value))
    cases = [0, (1 << 37) - 1] + [random.Random(4).getrandbits(37) for _ in range(50)]

    async def process(ctx):
        for case in cases:
            ctx.set(value, case)
            assert ctx.get(count) == bin(case).count("1")

    run_comb(m, process)


def test_registered_fifo_keeps_order_under_random_traffic():
    """Same contract as SyncFIFOBuffered: every word written comes out once, in order, and the FIFO
    takes `depth` words before it refuses one."""
    depth = 5
    dut = RegisteredFIFO(8, depth)
    rng = random.Random(7)
    written, read = [], []

    async def process(ctx):
        nxt, full_seen = 0, False
        for cycle in range(600):
            w_en = rng.random() < (0.9 if cycle < 60 else 0.5)
            r_en = cycle >= 60 and rng.random() < 0.5
            ctx.set(dut.w_en, w_en)
            ctx.set(dut.w_data, nxt & 0xFF)
            ctx.set(dut.r_en, r_en)
            if not ctx.get(dut.w_rdy):
                full_seen = True
                assert len(written) - len(read) == depth
            if w_en and ctx.get(dut.w_rdy):
                written.append(nxt & 0xFF)
                nxt += 1
            if r_en and ctx.get(dut.r_rdy):
                read.append(ctx.get(dut.r_data))
            await ctx.tick()
        assert full_seen

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(process)
    sim.run()
    assert read == written[:len(read)] and len(read) > 200


class StreamHarness:
    """Drives the aggregator in amaranth.sim: frames in at one beat per cycle, frames out."""

    def __init__(self, width, config=CONFIG, ready_probability=1.0, seed=0):
        self.dut = Aggregator(config, width)
        self.width = width
        self.ready_probability = ready_probability
        self.random = random.Random(seed)

    def run(self, frames):
        dut, width = self.dut, self.width
        outputs, counters = [], {}
        received = bytearray()
        sent = []

        async def source(ctx):
            for frame in frames:
                beats = [frame[i:i + width] for i in range(0, len(frame), width)]
                for index, beat in enumerate(beats):
                    ctx.set(dut.s_axis_tdata, int.from_bytes(beat, "little"))
                    ctx.set(dut.s_axis_tkeep, (1 << len(beat)) - 1)
                    ctx.set(dut.s_axis_tlast, index == len(beats) - 1)
                    ctx.set(dut.s_axis_tvalid, 1)
                    await ctx.tick().until(dut.s_axis_tready)
            ctx.set(dut.s_axis_tvalid, 0)
            sent.append(True)

        async def sink(ctx):
            idle = 0
            while not sent or idle < 200:
                ready = self.random.random() < self.ready_probability
                ctx.set(dut.m_axis_tready, ready)
                await ctx.delay(1e-9)
                valid = ctx.get(dut.m_axis_tvalid)
                if ready and valid:
                    idle = 0
                    keep, last = ctx.get(dut.m_axis_tkeep), ctx.get(dut.m_axis_tlast)
                    # Lanes from 0 up, and full but on a frame's last beat: slicing by the top lane would
                    # hide a hole.
                    assert keep and keep & (keep + 1) == 0 and (last or keep == (1 << width) - 1), (
                        f"tkeep {keep:0{width}b} is not contiguous or not full before tlast")
                    received.extend(ctx.get(dut.m_axis_tdata).to_bytes(width, "little")[:keep.bit_length()])
                    if last:
                        if not ctx.get(dut.m_axis_tuser):
                            outputs.append(bytes(received))
                        received.clear()
                else:
                    idle += 1
                await ctx.tick()
            counters.update({name: ctx.get(getattr(dut, f"stat_{name}")) for name in COUNTERS})

        sim = Simulator(dut)
        sim.add_clock(1e-8)
        sim.add_testbench(source, background=True)
        sim.add_testbench(sink)
        sim.run()
        return outputs, counters


def expected_of(frames, config=CONFIG):
    model = Model(config)
    outputs = [out for frame in frames for out in model.process(frame)]
    return outputs, {name: value & 0xFFFFFFFF for name, value in model.stats().items()}


def contribution(elements, **fields):
    header = dict(ip_dst=CONFIG.ip, eth_dst=CONFIG.mac, eth_src=0x020000000001, ip_src=0x0A000001,
                  opcode=Opcode.CONTRIBUTION, fanin=2, job=1, round=1, group=0xEF000001, slot=0)
    header.update(fields)
    return bytes(build_frames(np.asarray(elements, dtype=np.int64), **header)[0])


def small_traffic(seed):
    rng = np.random.default_rng(seed)
    frames = []
    for slot in range(3):
        for sender in range(2):
            frames.append(contribution(rng.integers(-100, 100, 5 + 4 * slot), slot=slot, sender=sender,
                                       chunk=slot))
    frames.insert(2, bytes(range(64)) * 2)
    frames.append(frames[0])
    frames.append(contribution([2**31 - 1] * 3, slot=3, sender=0, chunk=7))
    frames.append(contribution([5] * 3, slot=3, sender=1, chunk=7))
    frames.append(contribution([], opcode=Opcode.STATS_REQUEST, sender=1)[:FRAME_HEADER_BYTES])
    frames.append(bytes(40))
    return frames


@pytest.mark.parametrize("width", [8, 64])
def test_aggregator_matches_model(width):
    frames = small_traffic(width)
    outputs, counters = StreamHarness(width).run(frames)
    assert (outputs, counters) == expected_of(frames)


def test_aggregator_under_backpressure():
    frames = small_traffic(5)
    outputs, counters = StreamHarness(16, ready_probability=0.5, seed=3).run(frames)
    assert (outputs, counters) == expected_of(frames)


@pytest.mark.parametrize("width", [8, 16, 32, 64])
def test_elaborates_at_every_width(width):
    m = Module()
    m.submodules.dut = Aggregator(CONFIG, width)
    Simulator(m)


@pytest.mark.parametrize("width", [16, 32])
def test_every_drop_reason_and_foreign_frame(width):
    """The malformed and foreign frames of the cocotb suite, at the widths the cocotb runs leave out."""
    from inwire_hdl.cocotb.traffic import Traffic, malformed

    traffic = Traffic(CONFIG, seed=width)
    frames = [frame for frame, _ in malformed(traffic)] + traffic.foreign()
    frames += traffic.clique(9, fanin=2, slot=1, job=9) + [traffic.request(slot=1, job=9, fanin=2, count=9),
                                                          traffic.request(slot=1, job=9, fanin=5, count=2)]
    outputs, counters = StreamHarness(width, ready_probability=0.7, seed=width).run(frames)
    assert (outputs, counters) == expected_of(frames)


@pytest.mark.parametrize("width", [16, 32])
def test_reduction_trees_at_the_other_widths(width):
    """Root, child and middle levels of reduction trees and version 1 frames, at the widths the cocotb runs
    leave out."""
    from inwire_hdl.cocotb.traffic import Traffic, tree_child, tree_middle, tree_root, version1

    traffic = Traffic(CONFIG, seed=width)
    frames = (tree_root(traffic, 5, 0, 50, 1) + tree_root(traffic, 3, 1, 51, 0, saturate=True)
              + tree_child(traffic, 6, 2, 52, saturate=True) + tree_middle(traffic, 4, 3, 53, saturate=True)
              + version1(traffic, 7, 0, 54))
    outputs, counters = StreamHarness(width, ready_probability=0.7, seed=width).run(frames)
    expected = expected_of(frames)
    assert counters["partials_emitted"] == expected[1]["partials_emitted"] > 0
    assert (outputs, counters) == expected


@pytest.mark.parametrize("width", [16, 32])
def test_forged_routes_and_stale_copies_at_the_other_widths(width):
    """The cocotb suite's forged hops (each a drop_route) and stale copies of an older chunk, on a completed
    and on an unfinished slot, at the widths the cocotb runs leave out."""
    from inwire_hdl.cocotb.traffic import Traffic, forged_routes, stale_chunks

    traffic = Traffic(CONFIG, seed=width)
    frames = forged_routes(traffic, 5, 0, 55)[0]
    early, later, request = stale_chunks(traffic, 3, 2, 56)
    frames += early + later + [early[0], request, later[1]]
    early, later, request = stale_chunks(traffic, 6, 3, 57)
    frames += early + later[:1] + [early[1], later[1], request]
    outputs, counters = StreamHarness(width, ready_probability=0.7, seed=width).run(frames)
    expected = expected_of(frames)
    assert expected[1]["drop_route"] == 8 and expected[1]["drop_stale"] == 2
    assert (outputs, counters) == expected
