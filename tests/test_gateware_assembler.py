"""The output assembler alone in amaranth.sim: beats, tkeep and the status trailer of a result.

A contribution completing a fresh slot is fed to `OutputAssembler` as the decider would (its beats and
its context); the result must come out in ceil(length / width) beats, every byte kept but past the end of
the last beat, the elements as they came (a fresh slot's sum is the contribution), and the 4-byte status
trailer 0 right after them. Element counts sit at the boundaries: one element, the trailer alone on a beat
(the count a multiple of the lanes) or sharing one, and the configuration's maximum. A forwarded frame
comes out byte for byte, and a contribution that does not complete its slot sends nothing. A second
contribution to the slot is added to the first from the sum memory's other bank, with saturation, and the
trailer then carries the overflow flag.
"""

import numpy as np
import pytest
from amaranth.sim import Simulator
from amaranth.utils import ceil_log2

from inwire.model import AggregatorConfig
from inwire.protocol import (
    ELEMENT_BYTES,
    ELEMENT_DTYPE,
    FRAME_HEADER_BYTES,
    INT32_MAX,
    INT32_MIN,
    RESULT_TRAILER_BYTES,
    STATUS_OVERFLOW,
    Disposition,
    Opcode,
)
from inwire_hdl.aggregator import Aggregator
from inwire_hdl.cocotb.traffic import Traffic
from inwire_hdl.signatures import Action

CONFIG = AggregatorConfig(slots=4, max_elements=32, max_fanin=8)
SLOT = 2

# The assembler is taken from an aggregator (which sizes its context); the rest is never elaborated.
pytestmark = pytest.mark.filterwarnings("ignore:.*created but never used")


def counts_at_the_boundaries(width):
    lanes = width // ELEMENT_BYTES
    return sorted({1, lanes - 1, lanes, lanes + 1, CONFIG.max_elements - 1, CONFIG.max_elements} - {0})


def context(aggregator, action, count, rbank=0, fresh=1):
    """The context of a frame of `count` elements to `SLOT` whose sum is read from bank `rbank` (`fresh`:
    from zero), answered with a result."""
    out_len = FRAME_HEADER_BYTES + count * ELEMENT_BYTES + RESULT_TRAILER_BYTES
    depth = CONFIG.slots * 2 * aggregator.bank_words
    rd_first = ((SLOT * 2 + rbank) * aggregator.bank_words - aggregator.header_beats) % 2**ceil_log2(depth)
    return {"action": action, "disp": Disposition.ACCUMULATED, "slot": SLOT, "rbank": rbank, "fresh": fresh,
            "opcode": Opcode.RESULT, "fanin": 2, "count": count, "group": 0xEF000001, "bitmap": 0b11,
            "hdr_slot": SLOT, "dst_port": CONFIG.port, "out_len": out_len,
            "out_beats": -(-out_len // aggregator.data_width), "rd_first": rd_first}


def assemble(aggregator, frames):
    """The frames `aggregator`'s assembler sends for `frames`, each (frame bytes, context fields); each
    output frame as [(data bytes, keep)] per beat."""
    dut, width = aggregator.assembler, aggregator.data_width
    outputs, current, fed = [], [], []

    async def source(ctx):
        for frame, fields in frames:
            beats = [frame[i:i + width] for i in range(0, len(frame), width)]
            for index, beat in enumerate(beats):
                payload = dut.beats.payload
                ctx.set(payload.data, int.from_bytes(beat, "little"))
                ctx.set(payload.keep, (1 << len(beat)) - 1)
                ctx.set(payload.last, index == len(beats) - 1)
                ctx.set(payload.first, index == 0)
                ctx.set(payload.bad, 0)
                ctx.set(dut.beats.valid, 1)
                if index == 0:
                    for name, value in fields.items():
                        ctx.set(getattr(dut.contexts.payload, name), value)
                    ctx.set(dut.contexts.valid, 1)
                await ctx.tick().until(dut.beats.ready)
                ctx.set(dut.contexts.valid, 0)
        ctx.set(dut.beats.valid, 0)
        fed.append(True)

    async def sink(ctx):
        ctx.set(dut.m_axis_tready, 1)
        idle = 0
        while not fed or idle < 20:
            await ctx.tick()
            if ctx.get(dut.m_axis_tvalid):
                idle = 0
                keep = ctx.get(dut.m_axis_tkeep)
                current.append((ctx.get(dut.m_axis_tdata).to_bytes(width, "little"), keep))
                if ctx.get(dut.m_axis_tlast):
                    assert not ctx.get(dut.m_axis_tuser)
                    outputs.append(list(current))
                    current.clear()
            else:
                idle += 1

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(source, background=True)
    sim.add_testbench(sink)
    sim.run()
    return outputs


def result_parts(beats, count):
    """(elements, trailer) of a result of `count` elements sent as `beats`."""
    sent = b"".join(data for data, _ in beats)
    end = FRAME_HEADER_BYTES + count * ELEMENT_BYTES
    return np.frombuffer(sent[FRAME_HEADER_BYTES:end], dtype=ELEMENT_DTYPE), sent[end:end + RESULT_TRAILER_BYTES]


@pytest.mark.parametrize("width", [8, 64])
def test_result_beats_keep_and_trailer_at_the_element_count_boundaries(width):
    traffic = Traffic(CONFIG, seed=width)
    counts = counts_at_the_boundaries(width)
    elements = {count: traffic.elements(count) for count in counts}
    frames = {count: traffic.contribution(elements[count], fanin=2, slot=SLOT) for count in counts}
    aggregator = Aggregator(CONFIG, width)
    outputs = assemble(aggregator, [(frames[count], context(aggregator, Action.SUM_RESULT, count))
                                    for count in counts])
    assert len(outputs) == len(counts)
    for count, beats in zip(counts, outputs, strict=True):
        length = FRAME_HEADER_BYTES + count * ELEMENT_BYTES + RESULT_TRAILER_BYTES
        tail = (length - 1) % width + 1
        assert len(beats) == -(-length // width), count
        assert [keep for _, keep in beats] == [(1 << width) - 1] * (len(beats) - 1) + [(1 << tail) - 1], count
        sent = b"".join(data for data, _ in beats)[:length]
        payload = frames[count][FRAME_HEADER_BYTES:FRAME_HEADER_BYTES + count * ELEMENT_BYTES]
        assert sent[FRAME_HEADER_BYTES:length - RESULT_TRAILER_BYTES] == payload, count
        assert sent[length - RESULT_TRAILER_BYTES:] == bytes(RESULT_TRAILER_BYTES), count


@pytest.mark.parametrize("width", [8, 64])
def test_forwarded_frame_unchanged_and_silent_sum_not_sent(width):
    traffic = Traffic(CONFIG, seed=width)
    foreign = traffic.foreign()[0]
    silent = traffic.contribution(traffic.elements(3), fanin=2, slot=SLOT)
    aggregator = Aggregator(CONFIG, width)
    forward = {**context(aggregator, Action.FORWARD, 3), "disp": Disposition.FORWARDED}
    outputs = assemble(aggregator, [(silent, context(aggregator, Action.SUM_SILENT, 3)), (foreign, forward)])
    assert len(outputs) == 1
    keeps = [keep for _, keep in outputs[0]]
    assert b"".join(data[:keep.bit_length()] for data, keep in outputs[0]) == foreign
    assert keeps[:-1] == [(1 << width) - 1] * (len(keeps) - 1)



@pytest.mark.parametrize("width", [8, 64])
def test_second_contribution_added_from_the_other_bank_with_saturation(width):
    """The first contribution, fresh, writes its sum to the bank other than the one it read (0); the second
    reads that bank (1) and completes the slot. Sums beyond int32 clip, and the trailer says so."""
    traffic = Traffic(CONFIG, seed=width)
    aggregator = Aggregator(CONFIG, width)
    frames, expected = [], []
    for index, count in enumerate(counts_at_the_boundaries(width)):
        first = traffic.elements(count, INT32_MAX - 3, INT32_MAX)
        # Every other pair clips; the others come back below the limit.
        second = traffic.elements(count, 4, 5) if index % 2 else traffic.elements(count, -5, -4)
        frames += [(traffic.contribution(first, fanin=2, slot=SLOT), context(aggregator, Action.SUM_SILENT, count)),
                   (traffic.contribution(second, fanin=2, slot=SLOT, sender=1),
                    context(aggregator, Action.SUM_RESULT, count, rbank=1, fresh=0))]
        total = first.astype(np.int64) + second
        overflow = bool(((total > INT32_MAX) | (total < INT32_MIN)).any())
        expected.append((count, np.clip(total, INT32_MIN, INT32_MAX), overflow))
    outputs = assemble(aggregator, frames)
    assert len(outputs) == len(expected)
    assert any(overflow for _, _, overflow in expected) and not all(overflow for _, _, overflow in expected)
    for (count, sums, overflow), beats in zip(expected, outputs, strict=True):
        elements, trailer = result_parts(beats, count)
        assert list(elements) == list(sums), count
        assert trailer == (STATUS_OVERFLOW if overflow else 0).to_bytes(RESULT_TRAILER_BYTES, "big"), count
