"""The header classifier alone in amaranth.sim, against the golden model's frame checks.

Each frame goes through `HeaderClassifier`; when its header's last beat reaches I3, C3 holds the
disposition before the slot table (`pre_disp`, or `pre_pass` when every check passes). The expectation is
the first of the model's `FRAME_CHECKS` that applies. A contribution's or partial's frame length is checked
later, beat by beat (the decider), so the classifier is held to the model on the frame as its header
announces it (`frame_bytes(count, opcode)` bytes), with `len_pending` and the expected last beat and its
byte count from that length. A frame that passes every check also carries the model's members and level
(`tree_fields`) on to the slot table, and the hops its partial goes to, moved up one level as the model's
`_output` moves them.
"""

import pytest
from amaranth.sim import Simulator

from inwire.model import FRAME_CHECKS, JOB_DISPOSITIONS, AggregatorConfig, tree_fields
from inwire.model import Aggregator as Model
from inwire.packets import parse_header
from inwire.protocol import FRAME_HEADER_BYTES, SUMMED_OPCODES, Disposition, Opcode, frame_bytes
from inwire_hdl.aggregator import Aggregator
from inwire_hdl.cocotb.traffic import (
    Traffic,
    all_hops_set,
    forged_routes,
    malformed,
    patch,
    stray_hop_levels,
    tree_child,
    upper_members,
    version1,
)

CONFIG = AggregatorConfig(slots=4, max_elements=32, max_fanin=64)
LENGTH_CHECKED = (Disposition.DROP_RUNT, Disposition.FORWARDED, Disposition.DROP_IP_HEADER,
                  Disposition.DROP_IP_FRAGMENT, Disposition.DROP_IP_CHECKSUM, Disposition.DROP_LENGTH,
                  Disposition.DROP_VERSION, Disposition.DROP_OPCODE)
"""The checks up to and with the lengths: a frame past them has its frame length still to be checked."""

# The classifier is taken from an aggregator (which sizes its beat counter); the rest is never elaborated.
pytestmark = pytest.mark.filterwarnings("ignore:.*created but never used")


def model_check(frame):
    """The first of the model's frame checks that applies to `frame`, or None when all pass."""
    model, header = Model(CONFIG), None
    for disposition, _condition, applies in FRAME_CHECKS:
        if disposition == Disposition.DROP_VERSION:
            header = parse_header(frame)
        if applies(model, frame, header):
            return disposition
    return None


def expected_class(frame):
    """(first check that applies or None, length still pending, announced length or None) of `frame`, as the
    classifier sees it: a summed frame holding its whole header as long as its header says."""
    announced = None
    if len(frame) >= FRAME_HEADER_BYTES and parse_header(frame)["opcode"] in SUMMED_OPCODES:
        header = parse_header(frame)
        announced = frame_bytes(int(header["count"]), int(header["opcode"]))
        frame = frame[:announced].ljust(announced, b"\0")
    check = model_check(frame)
    return check, announced is not None and check not in LENGTH_CHECKED, announced


def frames_to_classify():
    traffic = Traffic(CONFIG, seed=3)
    good = traffic.contribution(traffic.elements(6), fanin=2, slot=1, job=9)
    frames = [frame for frame, _ in malformed(traffic)] + traffic.foreign()
    frames += [good, traffic.request(slot=1, job=9, fanin=2, count=6),
               traffic.request(opcode=Opcode.STATS_REQUEST, slot=1),
               bytes(patch(bytearray(good), ip_dst=CONFIG.ip + 1)), bytes(patch(bytearray(good), udp_dport=1)),
               bytes(patch(bytearray(good), fix_checksum=False, ip_ttl=3)),
               traffic.contribution(traffic.elements(CONFIG.max_elements), fanin=CONFIG.max_fanin,
                                    sender=CONFIG.max_fanin - 1, slot=CONFIG.slots - 1)]
    frames += forged_routes(traffic, 3, 0, 55)[0] + tree_child(traffic, 4, 2, 52) + version1(traffic, 3, 0, 54)
    frames += upper_members(traffic, 2, 1, 58) + all_hops_set(traffic, 2, 2, 59) + stray_hop_levels(traffic, 2, 0, 60)
    return frames


def classify(frames, width):
    """[(pre_disp or None when it passes, len_pending, expected_last, expected_tail, members, level,
    member_count, (hop1, expect, hop1, hop1_expect) of its partial or None)] of each frame."""
    dut = Aggregator(CONFIG, width).classifier
    seen = []

    async def bench(ctx):
        ctx.set(dut.classified.advance, 1)

        async def step():
            await ctx.tick()
            beat, frame = dut.classified.beat, dut.classified.frame
            if ctx.get(beat.valid) and ctx.get(beat.hdr_end):
                seen.append((None if ctx.get(frame.pre_pass) else Disposition(ctx.get(frame.pre_disp)),
                             bool(ctx.get(frame.len_pending)), ctx.get(frame.expected_last),
                             ctx.get(frame.expected_tail), ctx.get(frame.members), ctx.get(frame.level),
                             ctx.get(frame.member_count),
                             (ctx.get(frame.hop1), ctx.get(frame.out_expect), ctx.get(frame.out_hop1),
                              ctx.get(frame.out_hop1_expect)) if ctx.get(frame.partial_out) else None))

        for frame in frames:
            beats = [frame[i:i + width] for i in range(0, len(frame), width)]
            for index, beat in enumerate(beats):
                ctx.set(dut.s_axis_tdata, int.from_bytes(beat, "little"))
                ctx.set(dut.s_axis_tkeep, (1 << len(beat)) - 1)
                ctx.set(dut.s_axis_tlast, index == len(beats) - 1)
                ctx.set(dut.s_axis_tvalid, 1)
                await step()
        ctx.set(dut.s_axis_tvalid, 0)
        for _ in range(4):
            await step()

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    return seen


@pytest.mark.parametrize("width", [8, 64])
def test_classifier_agrees_with_the_model_frame_checks(width):
    frames = frames_to_classify()
    seen = classify(frames, width)
    assert len(seen) == len(frames)
    reached = set()
    for frame, (disposition, pending, last, tail, members, level, member_count, route) in zip(frames, seen,
                                                                                               strict=True):
        check, length_pending, announced = expected_class(frame)
        reached.add(check)
        assert (disposition, pending) == (check, length_pending), frame.hex()
        if pending:
            assert (last, tail) == ((announced - 1) // width, (announced - 1) % width + 1)
        if check is None:
            tree = tree_fields(parse_header(frame))
            assert (members, level, member_count) == (tree.members, tree.level, bin(tree.members).count("1"))
            assert route == ((tree.hop1, tree.hop1_expect, tree.hop2, tree.hop2_expect) if tree.hop1 else None)
    # Every frame check of the model is reached by some frame, and some frames pass them all; except the job
    # checks, which need job tables: CONFIG holds none (the cocotb suite and the traffic table run the
    # gateware with them).
    assert not CONFIG.registered
    checks = {disposition for disposition, _, _ in FRAME_CHECKS}
    assert reached == checks - set(JOB_DISPOSITIONS) | {None}
