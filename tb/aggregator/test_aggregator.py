"""cocotb tests of the aggregator; every expectation comes from the golden model via `TB.check`."""

import copy
import random

import cocotb
import numpy as np
from cocotb.triggers import ClockCycles, RisingEdge
from scapy.layers.l2 import Ether

from inwire.jobs import JobEntry
from inwire.packets import build_frames, frame_field
from inwire.protocol import (
    FRAME_OFFSETS,
    INT32_MAX,
    INT32_MIN,
    INWIRE_PORT,
    JOB_VERSION,
    STATUS_OVERFLOW,
    Disposition,
    Opcode,
)
from inwire_hdl.aggregator import Aggregator
from inwire_hdl.cocotb.testbench import TB
from inwire_hdl.cocotb.traffic import (
    ABOVE_IP,
    HOST_IP,
    TOP_IP,
    Traffic,
    all_hops_set,
    forged_routes,
    malformed,
    patch,
    saturated_partial_last,
    stale_chunks,
    stray_hop_levels,
    tree_child,
    tree_middle,
    tree_root,
    upper_members,
    version1,
)

LOCAL_EXPERIMENTAL_ETHERTYPE = 0x88B5


async def start(dut, seed, source_pause=0.0, sink_pause=0.0):
    tb = TB(dut, seed)
    tb.pauses(source_pause, sink_pause)
    await tb.reset()
    return tb, Traffic(tb.config, seed)


@cocotb.test()
async def one_clique(dut):
    tb, traffic = await start(dut, 1)
    count = tb.config.max_elements
    await tb.send(traffic.clique(count, fanin=4, slot=3, job=7, round=12, clique=2, chunk=4096, exponent=-3))
    await tb.check()
    assert tb.model.stats()["results_emitted"] == 1


@cocotb.test()
async def interleaved_cliques_and_jobs(dut):
    tb, traffic = await start(dut, 2, source_pause=0.2, sink_pause=0.2)
    frames = []
    for slot in range(min(12, tb.config.slots)):
        fanin = 1 + slot % 5
        count = traffic.random.randint(1, 40)
        frames.append(traffic.clique(count, fanin, slot=slot, job=100 + slot % 3, round=5, clique=slot,
                                     chunk=count * slot, group=0xEF_10_00_00 + slot))
    order = []
    while any(frames):
        queue = traffic.random.choice([q for q in frames if q])
        order.append(queue.pop(0))
    await tb.send(order)
    await tb.check()
    assert tb.model.stats()["results_emitted"] == min(12, tb.config.slots)


@cocotb.test()
async def back_to_back_same_slot(dut):
    tb, traffic = await start(dut, 3)
    frames = []
    for round_ in range(3):
        for count in (1, 2, 16, 17):
            # Rounds rise, so that each clique claims the slot the one before completed (none is stale).
            frames += traffic.clique(count, fanin=6, slot=0, job=1, round=round_ * 20 + count)
    await tb.send(frames)
    await tb.check()


@cocotb.test()
async def foreign_traffic_mixed_in(dut):
    tb, traffic = await start(dut, 4, source_pause=0.3, sink_pause=0.3)
    frames = []
    for slot in range(4):
        frames += traffic.clique(traffic.random.randint(1, 64), fanin=3, slot=slot, job=3)
    for _ in range(3):
        frames += traffic.foreign()
    traffic.random.shuffle(frames)
    await tb.send(frames)
    await tb.check()
    assert tb.model.stats()["forwarded"] == 21


@cocotb.test()
async def malformed_frames_dropped_by_reason(dut):
    tb, traffic = await start(dut, 5, sink_pause=0.2)
    cases = malformed(traffic)
    frames = [frame for frame, _ in cases]
    await tb.send(frames)
    stats = tb.model.stats()
    for _, reason in cases:
        assert stats[reason] > 0, reason
    await tb.check()


@cocotb.test()
async def slot_state_drops(dut):
    """Duplicate, mismatch, stale (an older round of the owner's job), collision and no-result: drops that
    depend on a slot's state."""
    tb, traffic = await start(dut, 6)
    first = traffic.contribution(traffic.elements(8), fanin=3, sender=0, slot=2, job=4, round=2)
    frames = [
        first,
        first,
        traffic.contribution(traffic.elements(8), fanin=3, sender=1, slot=2, job=4, round=2, exponent=1),
        traffic.contribution(traffic.elements(9), fanin=3, sender=1, slot=2, job=4, round=2),
        traffic.contribution(traffic.elements(8), fanin=2, sender=1, slot=2, job=4, round=2),
        traffic.contribution(traffic.elements(8), fanin=3, sender=1, slot=2, job=4, round=2, group=0xEF000002),
        traffic.contribution(traffic.elements(8), fanin=3, sender=1, slot=2, job=5, round=3),
        traffic.contribution(traffic.elements(8), fanin=3, sender=1, slot=2, job=4, round=1),
        traffic.request(slot=2, job=4, round=2, fanin=3, count=8),
        traffic.contribution(traffic.elements(8), fanin=3, sender=2, slot=2, job=4, round=2),
    ]
    await tb.send(frames)
    stats = tb.model.stats()
    for reason in ("drop_duplicate", "drop_mismatch", "drop_stale", "drop_collision", "drop_no_result"):
        assert stats[reason] > 0, reason
    await tb.check()


@cocotb.test()
async def retransmit_after_completion(dut):
    tb, traffic = await start(dut, 7, sink_pause=0.1)
    for count in (5, 16):
        clique = traffic.clique(count, fanin=3, slot=5, job=2, round=count)
        await tb.send(clique)
        await tb.send([clique[1], traffic.request(slot=5, job=2, round=count, fanin=3, count=count, sender=2),
                       clique[0], traffic.request(slot=5, job=2, round=count + 1, fanin=3, count=count)])
    # A result request answers with the slot's shape, whatever fan-in, group, count or exponent it names.
    await tb.send([traffic.request(slot=5, job=2, round=16, fanin=9, count=1, sender=8, exponent=4,
                                   group=0xEF_77_00_01)])
    await tb.check()
    assert tb.model.stats()["answered"] == 7


@cocotb.test()
async def overflow_saturates_and_flags(dut):
    tb, traffic = await start(dut, 8)
    count = 19
    high = np.full((2, count), INT32_MAX - 5)
    low = np.full((2, count), INT32_MIN + 5)
    high[:, ::2] = 3
    await tb.send(traffic.clique(count, fanin=2, elements=high, slot=0, job=1, round=1))
    await tb.send(traffic.clique(count, fanin=2, elements=low, slot=1, job=1, round=1))
    await tb.send(traffic.clique(count, fanin=2, slot=0, job=1, round=2))
    await tb.send([traffic.request(slot=1, job=1, round=1, fanin=2, count=count)])
    await tb.check()
    assert tb.model.stats()["saturations"] == 2


@cocotb.test()
async def slot_reuse_by_newer_round(dut):
    tb, traffic = await start(dut, 9)
    frames = traffic.clique(12, fanin=2, slot=4, job=6, round=1)
    frames += traffic.clique(12, fanin=3, slot=4, job=6, round=2)[:2]
    frames += traffic.clique(10, fanin=2, slot=4, job=6, round=3)[:1]
    frames += traffic.clique(10, fanin=2, slot=4, job=6, round=2)[2:]
    frames += traffic.clique(10, fanin=2, slot=4, job=8, round=9)
    frames += traffic.clique(7, fanin=2, slot=4, job=6, round=0xFFFFFFF0)
    frames += traffic.clique(7, fanin=2, slot=4, job=6, round=3)[1:]
    await tb.send(frames)
    await tb.check()
    assert tb.model.stats()["slots_reclaimed"] >= 1


@cocotb.test()
async def aborted_results_on_bad_length(dut):
    """A frame that would be answered but is found too long or too short ends its answer with tuser; the
    scoreboard compares the bytes sent before the abort with the model's prediction."""
    tb, traffic = await start(dut, 10, sink_pause=0.2)
    clique = traffic.clique(33, fanin=2, slot=6, job=3, round=3)
    completing = clique[1]
    header_end = len(traffic.request())
    frames = [clique[0], completing + bytes(8), completing[:-8], completing[:-64], completing + bytes(1),
              completing[:header_end + 1], completing[:header_end], completing[:header_end - 1], completing[:-1]]
    frames += [completing, clique[0] + bytes(3), clique[0][:-4]]
    frames += [traffic.request(Opcode.STATS_REQUEST) + bytes(tb.width), traffic.request(slot=6, job=3, round=3,
               fanin=2, count=33) + bytes(4)]
    await tb.send(frames)
    await tb.check()
    assert tb.aborted == sum(aborted for aborted, _ in tb.expected) == 9
    assert tb.model.stats()["drop_length"] == 12


@cocotb.test()
async def stats_request_answered(dut):
    tb, traffic = await start(dut, 11)
    frames = traffic.clique(4, fanin=2, slot=0) + traffic.foreign()[:2] + [bytes(30)]
    frames.append(traffic.request(Opcode.STATS_REQUEST, sender=5, job=77, udp_sport=4000))
    frames.append(traffic.request(Opcode.STATS_REQUEST, sender=1, job=78, udp_sport=INWIRE_PORT))
    await tb.send(frames)
    await tb.check()


@cocotb.test()
async def reset_in_the_middle_of_a_frame(dut):
    tb, traffic = await start(dut, 12)
    await tb.send(traffic.clique(20, fanin=2, slot=1))
    await tb.check()
    clique = traffic.clique(tb.config.max_elements, fanin=2, slot=2)
    await tb.send(clique)
    for _ in range(len(clique[0]) // tb.width + len(clique[1]) // (2 * tb.width)):
        await RisingEdge(dut.clk)
    await tb.reset()
    tb.restart_model()
    await ClockCycles(dut.clk, 5)
    assert tb.counters() == dict.fromkeys(tb.counters(), 0)
    await tb.send(traffic.clique(20, fanin=2, slot=1) + traffic.clique(9, fanin=2, slot=2))
    await tb.check()


def interleave(chooser, queues, stray, probability):
    """The queues' frames shuffled together, each queue's kept in order; before a frame, with `probability`,
    one more from `stray(frames so far)` (foreign, malformed or replayed)."""
    frames = []
    while any(queues):
        if chooser.random() < probability:
            frames.append(stray(frames))
        queue = chooser.choice([q for q in queues if q])
        frames.append(queue.pop(0))
    return frames

@cocotb.test()
async def random_mix_under_backpressure(dut):
    tb, traffic = await start(dut, 13, source_pause=0.25, sink_pause=0.5)
    chooser = random.Random(13)
    cliques = [traffic.clique(chooser.randint(1, 48), fanin=chooser.randint(1, 5), slot=slot, job=slot % 2,
                              round=chooser.randint(0, 2**32 - 1)) for slot in range(8)]

    def stray(frames):
        roll = chooser.random()
        if roll < 0.6:
            return chooser.choice(traffic.foreign())
        if roll < 0.8 or not frames:
            return chooser.choice(malformed(traffic))[0]
        return chooser.choice(frames)

    await tb.send(interleave(chooser, cliques, stray, 0.25))
    await tb.check()


@cocotb.test()
async def header_field_edge_values(dut):
    """Fields at their extremes: max fan-in, sender = fanin - 1, negative exponent, count = maximum."""
    tb, traffic = await start(dut, 14)
    cfg = tb.config
    frames = [traffic.contribution(traffic.elements(cfg.max_elements, INT32_MIN, INT32_MAX), sender=sender,
                                   fanin=cfg.max_fanin, exponent=-128, slot=cfg.slots - 1, job=2**32 - 1,
                                   clique=0xFFFF, chunk=2**32 - 1, group=0xEF_FF_FF_FF)
              for sender in (cfg.max_fanin - 1, 0)]
    bad_ttl = bytearray(frames[0])
    frames.append(bytes(patch(bad_ttl, ip_ttl=1, ip_tos=0xFF, ip_id=0xBEEF)))
    await tb.send(frames)
    await tb.check()


@cocotb.test()
async def frames_longer_than_the_beat_counters(dut):
    """Frames past the range of the beat counters, which saturate rather than wrap: a foreign frame still
    leaves byte for byte, a contribution with trailing bytes is dropped for its length, the next clique
    aggregates."""
    tb, traffic = await start(dut, 15)
    beats = 2 ** Aggregator(tb.config, tb.width).beat_bits + 2
    foreign = bytes(Ether(dst="02:00:00:00:00:08", src="02:00:00:00:00:07", type=LOCAL_EXPERIMENTAL_ETHERTYPE))
    foreign += bytes(traffic.random.randrange(256) for _ in range(beats * tb.width - len(foreign)))
    contribution = traffic.contribution(traffic.elements(3), fanin=2, slot=0)
    await tb.send([foreign, contribution + bytes(beats * tb.width)] + traffic.clique(5, fanin=2, slot=0))
    await tb.check()
    stats = tb.model.stats()
    assert (stats["forwarded"], stats["drop_length"], stats["results_emitted"]) == (1, 1, 1)


@cocotb.test()
async def lease_frees_an_idle_slot(dut):
    """Another job collides with an unfinished slot until `lease` ticks pass without an accepted contribution
    (a duplicate does not count), then claims it; the old owner's member collides until the new owner
    completes, and then claims the completed slot afresh."""
    tb, traffic = await start(dut, 16, sink_pause=0.2)
    lease, slot = tb.config.lease, tb.config.slots - 1
    abandoned = traffic.clique(9, fanin=3, slot=slot, job=21, round=4)
    stranger = traffic.clique(12, fanin=2, slot=slot, job=22, round=1)
    await tb.send(abandoned[:2])
    await tb.advance(lease - 1)
    await tb.send([abandoned[0], stranger[0]])
    await tb.advance(1)
    await tb.send([stranger[0], abandoned[2]])
    await tb.advance(lease)
    await tb.send(stranger[1:] + abandoned)
    await tb.check()
    stats = tb.model.stats()
    assert (stats["leases_expired"], stats["drop_collision"], stats["results_emitted"]) == (1, 2, 2), stats


@cocotb.test()
async def lease_kept_by_accepted_contributions(dut):
    """Each accepted contribution restarts the lease: a slot that gains a member every lease - 1 ticks
    stays its owner's, and is taken only lease ticks after its last member."""
    tb, traffic = await start(dut, 17)
    lease = tb.config.lease
    slow = traffic.clique(5, fanin=4, slot=1, job=31, round=2)
    stranger = traffic.clique(5, fanin=1, slot=1, job=32, round=2)
    for member in slow[:3]:
        await tb.send([member])
        await tb.advance(lease - 1)
        await tb.send(stranger)
    await tb.advance(1)
    await tb.send(stranger + [slow[3]])
    await tb.check()
    stats = tb.model.stats()
    assert (stats["drop_collision"], stats["leases_expired"], stats["results_emitted"]) == (3, 1, 1), stats


@cocotb.test()
async def abandoned_cliques_and_idle_gaps_under_backpressure(dut):
    """Bursts of interleaved cliques and other jobs' claims, one member in five lost for good, with idle gaps
    around the lease between bursts."""
    tb, traffic = await start(dut, 18, source_pause=0.2, sink_pause=0.4)
    chooser = random.Random(18)
    lease = tb.config.lease
    for burst in range(6):
        frames = []
        for _ in range(4):
            clique = traffic.clique(chooser.randint(1, 24), fanin=chooser.randint(1, 4), slot=chooser.randrange(4),
                                    job=chooser.randrange(3), round=burst)
            frames += [frame for frame in clique if chooser.random() > 0.2]
        chooser.shuffle(frames)
        await tb.send(frames)
        await tb.advance(chooser.choice((1, lease - 1, lease, lease + 3)))
    await tb.check()
    assert tb.model.stats()["leases_expired"] > 0


def whole(tb):
    """The frames the model expects whole, as (opcode, version, ip_dst, status or None)."""
    def fields(frame):
        opcode = frame[FRAME_OFFSETS["opcode"]]
        status = int.from_bytes(frame[-4:], "big") if opcode in (Opcode.RESULT, Opcode.PARTIAL) else None
        return opcode, frame[FRAME_OFFSETS["version"]], int.from_bytes(frame[30:34], "big"), status
    return [fields(frame) for aborted, frame in tb.expected if not aborted]


@cocotb.test()
async def tree_root_partial_before_between_and_after_leaves(dut):
    """The root of a two-level tree: the level below's partial before, between and after the direct
    members' contributions, overlapping member sets dropped, the partial again answered with the result."""
    tb, traffic = await start(dut, 19, source_pause=0.2, sink_pause=0.3)
    for slot, partial_at in enumerate((0, 1, 3)):
        await tb.send(tree_root(traffic, 3 + 7 * slot, slot=slot, job=60, partial_at=partial_at))
    await tb.check()
    stats = tb.model.stats()
    assert stats["results_emitted"] >= 6 and stats["partials_emitted"] == 0, stats
    assert stats["drop_duplicate"] >= 4 and stats["drop_mismatch"] >= 2 and stats["accumulated"] >= 11, stats


@cocotb.test()
async def tree_child_partial_up_and_again_after_loss(dut):
    """A level below the root: its partial goes to hop1 with the hops moved up; a member's retransmission
    (the partial lost) and a result request naming hop1 get the stored partial, one without it the result.
    Its own saturation sets the partial's status and counts."""
    tb, traffic = await start(dut, 20, sink_pause=0.2)
    await tb.send(tree_child(traffic, 11, slot=1, job=61, saturate=True) + tree_child(traffic, 1, slot=2, job=62))
    await tb.check()
    stats = tb.model.stats()
    assert (stats["partials_emitted"], stats["results_emitted"]) == (6, 2) and stats["saturations"] >= 1, stats
    partials = [out for out in whole(tb) if out[0] == Opcode.PARTIAL]
    assert all(ip == ABOVE_IP for _, _, ip, _ in partials) and partials[0][3] == STATUS_OVERFLOW, partials


@cocotb.test()
async def tree_saturation_below_carried_up(dut):
    """A level below saturated: its partial's trailer flag reaches the root's result (and the partial of a
    middle level) without counting as a saturation here."""
    tb, traffic = await start(dut, 21)
    await tb.send(tree_middle(traffic, 6, slot=0, job=63, saturate=True))
    await tb.send(tree_root(traffic, 2, slot=1, job=64, partial_at=2, saturate=True))
    await tb.send(tree_middle(traffic, 5, slot=2, job=65))
    await tb.check()
    outputs = whole(tb)
    assert outputs[0][0] == Opcode.PARTIAL and outputs[0][3] == STATUS_OVERFLOW, outputs
    assert [status for opcode, _, _, status in outputs if opcode == Opcode.RESULT][0] == STATUS_OVERFLOW
    assert outputs[-1][0] == Opcode.PARTIAL and outputs[-1][3] == 0, outputs


@cocotb.test()
async def version1_frames_still_work(dut):
    """Version 1 frames, whatever their tree bytes hold, are a flat clique's members; answers carry the
    version of the frame that caused them."""
    tb, traffic = await start(dut, 22, sink_pause=0.2)
    await tb.send(version1(traffic, 9, slot=0, job=66) + version1(traffic, 1, slot=1, job=67))
    await tb.check()
    versions = [version for _, version, _, _ in whole(tb)]
    assert versions == [1, 1, 1, 1] * 2 and tb.model.stats()["results_emitted"] == 6, versions


@cocotb.test()
async def random_tree_mix_under_backpressure(dut):
    """Trees at every position, flat cliques, version 1 cliques, foreign and malformed frames, shuffled
    with each clique's frames kept in order."""
    tb, traffic = await start(dut, 23, source_pause=0.3, sink_pause=0.4)
    chooser = random.Random(23)
    queues = []
    for slot in range(8):
        kind = chooser.randrange(5)
        count, job = chooser.randint(1, 20), 70 + slot
        if kind == 0:
            queues.append(tree_root(traffic, count, slot, job, chooser.randint(0, 3), chooser.random() < 0.5))
        elif kind == 1:
            queues.append(tree_child(traffic, count, slot, job, chooser.random() < 0.5))
        elif kind == 2:
            queues.append(tree_middle(traffic, count, slot, job, chooser.random() < 0.5))
        elif kind == 3:
            queues.append(version1(traffic, count, slot, job))
        else:
            queues.append(traffic.clique(count, fanin=3, slot=slot, job=job))
    strays = traffic.foreign() + [frame for frame, _ in malformed(traffic)]
    await tb.send(interleave(chooser, queues, lambda _frames: chooser.choice(strays), 0.1))
    await tb.check()


@cocotb.test()
async def aborted_partials_on_bad_length(dut):
    """A completing partial, or a completing contribution whose answer is a partial, found too long or too
    short (its trailer cut off, one byte over): the answer ends with tuser where the model says, the slot is
    unchanged, and the good frame completes it afterwards."""
    tb, traffic = await start(dut, 24, sink_pause=0.2)
    frames = tree_root(traffic, 16, slot=3, job=68, partial_at=3)
    direct, partial = frames[:3], frames[3]
    child = tree_child(traffic, 9, slot=4, job=69)[:3]
    completing = child[2]
    await tb.send(direct + [partial + bytes(8), partial[:-4], partial[:-8], partial + bytes(1), partial])
    await tb.send(child[:2] + [completing + bytes(4), completing[:-4], completing])
    await tb.check()
    assert tb.aborted == sum(aborted for aborted, _ in tb.expected) >= 4, tb.aborted
    stats = tb.model.stats()
    assert stats["drop_length"] == 6 and (stats["results_emitted"], stats["partials_emitted"]) == (1, 1), stats


def decided(tb, frames):
    """The model's disposition and output count for each of `frames` sent next, from its present state."""
    model = copy.deepcopy(tb.model)
    outcomes = []
    for frame in frames:
        before = model.stats()
        outputs = model.process(frame, tb.ticks)
        after = model.stats()
        (disposition,) = (d.name.lower() for d in Disposition if after[d.name.lower()] != before[d.name.lower()])
        outcomes.append((disposition, len(outputs)))
    return outcomes


@cocotb.test()
async def forged_hops_dropped_as_route(dut):
    """Hops that would send a partial back to the aggregator (a self-loop), to the frame's source (a
    ping-pong pair, a spoofed source), outside the upstream prefix, or a hop2 without hop1, equal to hop1 or
    to the aggregator: each a drop_route with no output that changes no slot; the clique then completes with
    its real members only."""
    tb, traffic = await start(dut, 25, source_pause=0.2, sink_pause=0.2)
    for slot in (0, 6):
        frames, forged = forged_routes(traffic, 3 + 5 * slot, slot, job=80 + slot)
        outcomes = dict(zip(frames, decided(tb, frames), strict=True))
        assert all(outcomes[frame] == ("drop_route", 0) for frame in forged), outcomes
        await tb.send(frames)
    await tb.check()
    stats = tb.model.stats()
    assert (stats["drop_route"], stats["results_emitted"], stats["partials_emitted"]) == (16, 4, 0), stats


async def stale_setup(tb, traffic, slot, complete):
    """Chunk 0 completed on `slot`, then chunk 2W claiming it, completed or not: the frames still to come."""
    early, later, request = stale_chunks(traffic, 4 + slot, slot, job=90 + slot)
    await tb.send(early + (later if complete else later[:1]))
    return early, later, request


@cocotb.test()
async def stale_copy_never_evicts_a_newer_chunk(dut):
    """A delayed copy of chunk 0 reaches the slot chunk 2W holds: dropped as stale whether chunk 2W is
    complete (its result request and retransmission still answered with the stored result) or unfinished
    (its last member then completes it)."""
    tb, traffic = await start(dut, 26, sink_pause=0.2)
    early, later, request = await stale_setup(tb, traffic, 2, complete=True)
    assert decided(tb, [early[0], request, later[1]]) == [("drop_stale", 0), ("answered", 1), ("answered", 1)]
    await tb.send([early[0], request, later[1]])
    early, later, request = await stale_setup(tb, traffic, 3, complete=False)
    assert decided(tb, [early[1], later[1], request]) == [("drop_stale", 0), ("accumulated", 1), ("answered", 1)]
    await tb.send([early[1], later[1], request])
    await tb.check()


@cocotb.test()
async def stale_copy_claims_once_the_lease_ran_out(dut):
    """One tick before the lease runs out a copy of chunk 0 is still stale; at the lease it claims the slot
    chunk 2W holds: a completed one afresh (chunk 2W's request then finds no result), an unfinished one as
    an expired lease."""
    tb, traffic = await start(dut, 27, sink_pause=0.2)
    lease = tb.config.lease
    done = await stale_setup(tb, traffic, 4, complete=True)
    open_ = await stale_setup(tb, traffic, 5, complete=False)
    await tb.advance(lease - 1)
    copies = [done[0][0], open_[0][0]]
    assert decided(tb, copies) == [("drop_stale", 0)] * 2
    await tb.send(copies)
    await tb.advance(1)
    assert decided(tb, copies + [done[2]]) == [("accumulated", 0)] * 2 + [("drop_no_result", 0)]
    await tb.send(copies + [done[2]] + done[0][1:] + open_[0][1:])
    await tb.check()
    stats = tb.model.stats()
    assert (stats["leases_expired"], stats["results_emitted"]) == (1, 5), stats


@cocotb.test()
async def lease_across_the_timer_wrap(dut):
    """The 16-bit lease timer is first driven to 3 ticks below 2**16, so that it wraps between the stamps
    and the frames that follow them: idle times count modulo 2**16. Another owner collides lease - 1 ticks
    after an unfinished slot's stamp and claims it at lease ticks, a stale copy is refused until the lease
    and claims the completed slot at it, and a member accepted after the wrap keeps its slot for another
    lease."""
    tb, traffic = await start(dut, 28)
    lease = tb.config.lease
    await tb.advance(2**16 - 3)
    abandoned = traffic.clique(7, fanin=3, slot=9, job=41, round=2)
    stranger = traffic.clique(5, fanin=2, slot=9, job=42, round=1)
    slow = traffic.clique(6, fanin=3, slot=10, job=43, round=1)
    late = traffic.clique(6, fanin=1, slot=10, job=44, round=1)
    early, later, request = stale_chunks(traffic, 4, slot=11, job=45)
    await tb.send(abandoned[:2] + slow[:1] + early + later)
    steps = [
        (lease - 1, [abandoned[0], stranger[0], slow[1], late[0], early[0]],
         ["drop_duplicate", "drop_collision", "accumulated", "drop_collision", "drop_stale"]),
        (1, [stranger[0], abandoned[2], late[0], early[0], request],
         ["accumulated", "drop_collision", "drop_collision", "accumulated", "drop_no_result"]),
        (lease - 2, [late[0]], ["drop_collision"]),
        (1, [late[0]], ["accumulated"]),
    ]
    for ticks, frames, dispositions in steps:
        await tb.advance(ticks)
        assert [disposition for disposition, _ in decided(tb, frames)] == dispositions, (tb.ticks, dispositions)
        await tb.send(frames)
    assert tb.ticks > 2**16
    await tb.send(stranger[1:] + abandoned + early[1:])
    await tb.check()
    stats = tb.model.stats()
    assert (stats["leases_expired"], stats["drop_collision"], stats["results_emitted"]) == (2, 5, 6), stats


@cocotb.test()
async def saturated_partial_completes_a_level(dut):
    """A partial whose trailer carries a level below's overflow is the frame that completes the level here,
    where no sum saturates: the root's result carries the flag, a middle level's partial up does, and so do
    their stored answers, while `saturations` stays 0. A status with only bit 1 set is no overflow."""
    tb, traffic = await start(dut, 29, sink_pause=0.2)
    await tb.send(saturated_partial_last(traffic, 5, slot=0, job=50)
                  + saturated_partial_last(traffic, 12, slot=1, job=51, middle=True))
    common = dict(fanin=3, slot=2, job=52)
    await tb.send([traffic.contribution(traffic.elements(3), sender=2, **common),
                   traffic.partial(traffic.elements(3), status=0b10, sender=0, bitmap=0b11, **common)])
    await tb.check()
    statuses = [(opcode, status) for opcode, _, _, status in whole(tb)]
    assert statuses == [(Opcode.RESULT, STATUS_OVERFLOW)] * 3 + [(Opcode.PARTIAL, STATUS_OVERFLOW)] * 3 + [
        (Opcode.RESULT, 0)], statuses
    assert tb.model.stats()["saturations"] == 0


TREE_FIELDS = ("expect", "hop1", "hop1_expect", "hop2", "hop2_expect")


@cocotb.test()
async def every_hop_field_set(dut):
    """Version 2 frames with hop1, hop2 and both hop levels set: the partial (new or stored) goes to hop1 with
    its level, hop1 and hop1's level taken from hop1_expect, hop2 and hop2_expect, hop2 and its level 0; a
    request without hops gets the result with every tree field 0. Hop levels that no hop reads: a root's
    result still has its tree fields 0, a partial carries hop2_expect up as hop1_expect."""
    tb, traffic = await start(dut, 30, source_pause=0.2, sink_pause=0.2)
    await tb.send(all_hops_set(traffic, 9, slot=3, job=53) + stray_hop_levels(traffic, 4, slot=4, job=54))
    await tb.check()
    routes = [(frame[FRAME_OFFSETS["opcode"]], frame_field(frame, "ip_dst"),
               *(frame_field(frame, name) for name in TREE_FIELDS)) for _, frame in tb.expected]
    up = (Opcode.PARTIAL, ABOVE_IP, 0b011111, TOP_IP, 0b111111, 0, 0)
    assert routes == [up] * 3 + [(Opcode.RESULT, 0xEF_00_00_0C, 0, 0, 0, 0, 0),
                                 (Opcode.RESULT, 0xEF_00_00_0D, 0, 0, 0, 0, 0),
                                 (Opcode.PARTIAL, ABOVE_IP, 0b11, 0, 0b01, 0, 0)], routes
    assert tb.model.stats()["drop_route"] == 1


@cocotb.test()
async def members_32_to_63(dut):
    """Fan-in 64, members in the upper half of the member set: a level of members 32 to 63 sends its partial
    up, a root sums the lower half's partial and members 32 to 63 into all 64; overlaps and a member outside
    the level are dropped."""
    tb, traffic = await start(dut, 31, source_pause=0.2, sink_pause=0.2)
    await tb.send(upper_members(traffic, 3, slot=7, job=55))
    await tb.check()
    members = [(frame[FRAME_OFFSETS["opcode"]], frame_field(frame, "bitmap"), frame_field(frame, "contributors"))
               for _, frame in tb.expected]
    assert members == [(Opcode.PARTIAL, 0xFFFFFFFF_00000000, 32)] * 2 + [(Opcode.RESULT, 2**64 - 1, 64)] * 2, members
    stats = tb.model.stats()
    assert (stats["drop_duplicate"], stats["drop_sender"]) == (2, 1), stats


@cocotb.test()
async def max_count_partial_keeps_to_its_bank(dut):
    """A partial carrying the maximum element count: at 8 bytes its status trailer has a beat of its own, one
    past the last word of the slot's bank of sums, where the next slot's bank begins. That beat writes no
    sum: the neighbouring slot's stored result is answered unchanged. Two rounds of each slot reach both
    banks of both."""
    tb, traffic = await start(dut, 32)
    count = tb.config.max_elements
    answers = []
    for neighbour_round in (1, 2):
        await tb.send(traffic.clique(5, fanin=2, slot=1, job=91, round=neighbour_round))
        for round_ in (2 * neighbour_round, 2 * neighbour_round + 1):
            frames = [traffic.partial(traffic.elements(count), bitmap=0b11, sender=0, fanin=2, slot=0, job=92,
                                      round=round_),
                      traffic.request(slot=1, job=91, round=neighbour_round, fanin=2, count=5)]
            answers += decided(tb, frames)
            await tb.send(frames)
    await tb.check()
    assert answers == [("accumulated", 1), ("answered", 1)] * 4, answers


@cocotb.test()
async def round_order_across_the_wrap_on_an_unfinished_slot(dut):
    """Rounds compare in serial order on a slot still gathering its members, not only on a completed one:
    round 0 is newer than round 2**32 - 1 and reclaims its unfinished slot; round 2**32 - 1 is then older
    than the owner and dropped as stale."""
    tb, traffic = await start(dut, 33)
    last = traffic.clique(6, fanin=3, slot=2, job=93, round=2**32 - 1)
    first = traffic.clique(6, fanin=3, slot=2, job=93, round=0)
    frames = [last[0], first[0], last[1], first[1], first[2]]
    assert [disposition for disposition, _ in decided(tb, frames)] == [
        "accumulated", "accumulated", "drop_stale", "accumulated", "accumulated"]
    await tb.send(frames)
    await tb.check()
    stats = tb.model.stats()
    assert (stats["slots_reclaimed"], stats["results_emitted"]) == (1, 1), stats


@cocotb.test()
async def earlier_chunk_of_another_clique_is_not_stale(dut):
    """Only an earlier chunk of the owner's own clique is stale: a lower chunk of another clique of the same
    job and round claims a completed slot afresh, and collides with an unfinished one."""
    tb, traffic = await start(dut, 34)
    owner = dict(fanin=2, job=94, round=5, clique=1, chunk=64)
    other = dict(fanin=2, job=94, round=5, clique=2, chunk=0)
    await tb.send(traffic.clique(4, slot=3, **owner) + traffic.clique(4, slot=4, **owner)[:1])
    frames = traffic.clique(4, slot=3, **other) + traffic.clique(4, slot=4, **other)[:1]
    assert decided(tb, frames) == [("accumulated", 0), ("accumulated", 1), ("drop_collision", 0)]
    await tb.send(frames)
    await tb.check()
    assert tb.model.stats()["drop_stale"] == 0


@cocotb.test()
async def reclaim_counted_only_when_accepted(dut):
    """A newer round's member that would reclaim an unfinished slot but is dropped for its length (a byte
    over, four short) reclaims nothing and counts no `slots_reclaimed`; the good copy then reclaims once."""
    tb, traffic = await start(dut, 35)
    old = traffic.clique(5, fanin=3, slot=5, job=95, round=1)
    new = traffic.clique(5, fanin=2, slot=5, job=95, round=2)
    await tb.send(old[:2])
    bad = [new[0] + bytes(1), new[0][:-4]]
    assert decided(tb, bad) == [("drop_length", 0)] * 2
    await tb.send(bad)
    await tb.check()
    assert tb.model.stats()["slots_reclaimed"] == 0
    await tb.send(new)
    await tb.check()
    stats = tb.model.stats()
    assert (stats["slots_reclaimed"], stats["results_emitted"]) == (1, 1), stats


MEMBER_PORTS = (40001, 40002, 40003)
ASKING = dict(job=0x5EED_0001, token=0x0123_4567_89AB_CDEF, group=0xEF_21_00_01)
"""A registered job: three members on the host's address, one port each, results to its group."""


def job_entry(job=ASKING["job"], token=ASKING["token"], group=ASKING["group"], slots=4, ports=MEMBER_PORTS):
    return JobEntry(job=job, token=token, slots=slots, members={(HOST_IP, port) for port in ports}, group=group)


def registered(traffic, count, fanin=3, ports=MEMBER_PORTS, **fields):
    """One version 3 contribution per member of a clique of the registered job `ASKING`, each from its port."""
    fields = {**ASKING, "version": JOB_VERSION, "fanin": fanin, **fields}
    return [traffic.contribution(traffic.elements(count), sender=sender, udp_sport=ports[sender], **fields)
            for sender in range(fanin)]


def need_tables(tb):
    assert tb.config.registered, "this test needs the gateware built with job tables (config.registered)"


@cocotb.test()
async def registered_job_sums_to_its_group_and_answers_only_its_members(dut):
    """A registered job's clique is summed in its range and its result goes to the job's group; a member's
    retransmission and result request are answered to that member alone."""
    tb, traffic = await start(dut, 40, sink_pause=0.2)
    need_tables(tb)
    await tb.install(job_entry())
    clique = registered(traffic, 9, slot=1, round=7)
    request = traffic.request(slot=1, round=7, fanin=3, count=9, version=JOB_VERSION, udp_sport=MEMBER_PORTS[2],
                              **ASKING)
    frames = clique + [clique[0], request]
    assert decided(tb, frames) == [("accumulated", 0), ("accumulated", 0), ("accumulated", 1), ("answered", 1),
                                   ("answered", 1)]
    await tb.send(frames)
    await tb.check()
    destinations = [(frame_field(out, "ip_dst"), frame_field(out, "udp_dport")) for _, out in tb.expected]
    assert destinations == [(ASKING["group"], INWIRE_PORT), (HOST_IP, MEMBER_PORTS[0]), (HOST_IP, MEMBER_PORTS[2])]


@cocotb.test()
async def registered_job_refuses_what_its_tables_do_not_allow(dut):
    """Strangers (another job, a wrong token, a source outside the members), a partial or result no route
    allows, a slot beyond the quota, another group, hops, and a version 2 frame in the job's range change no
    slot and send nothing; the job's own clique then completes exactly."""
    tb, traffic = await start(dut, 41, source_pause=0.2, sink_pause=0.2)
    need_tables(tb)
    await tb.install(job_entry(slots=2))
    elements = traffic.elements(6)
    good = dict(ASKING, version=JOB_VERSION, fanin=2, slot=0, round=3, udp_sport=MEMBER_PORTS[0])

    def v3(**fields):
        return traffic.contribution(elements, **{**good, **fields})

    cases = [
        (v3(job=ASKING["job"] + 1), "drop_job"),
        (v3(token=ASKING["token"] ^ 1), "drop_token"),
        (v3(token=0), "drop_token"),
        (v3(udp_sport=40009), "drop_member"),
        (v3(ip_src=HOST_IP + 1), "drop_member"),
        (traffic.partial(elements, **{**good, "bitmap": 1}), "drop_member"),
        (bytes(build_frames(elements, status=0, **traffic.header(**{**good, "opcode": Opcode.RESULT}))[0]),
         "drop_member"),
        (v3(slot=2), "drop_slot"),
        (v3(group=ASKING["group"] + 1), "drop_group"),
        (v3(hop1=ABOVE_IP), "drop_route"),
        (v3(expect=1), "drop_route"),
        (traffic.contribution(elements, fanin=2, slot=0, job=ASKING["job"]), "drop_slot"),
        (traffic.contribution(elements, fanin=2, slot=1, job=ASKING["job"]), "drop_slot"),
    ]
    frames = [frame for frame, _ in cases]
    assert [name for name, _ in decided(tb, frames)] == [reason for _, reason in cases]
    clique = registered(traffic, 6, fanin=2, slot=0, round=3)
    # A version 2 clique beside the job's range is still summed (an unregistered aggregator takes it).
    beside = traffic.clique(5, fanin=2, slot=2, job=ASKING["job"])
    await tb.send(frames + clique + beside)
    await tb.check()
    stats = tb.model.stats()
    assert stats["results_emitted"] == 2, stats


@cocotb.test()
async def jobs_keep_to_their_ranges_and_leave_them_empty(dut):
    """Two jobs naming the same slot sum in ranges of their own; a member that left is refused while the others
    still sum; a torn-down job's frames are refused and its range is free for version 2 frames; a job
    installed over a range those used starts it empty."""
    tb, traffic = await start(dut, 42, sink_pause=0.3)
    need_tables(tb)
    other = dict(job=0x5EED_0002, token=0xFEED_FACE_0000_0001, group=0xEF_21_00_02)
    await tb.install(job_entry())
    await tb.install(job_entry(**other, ports=(40011, 40012)))
    first = registered(traffic, 7, slot=3, round=1)
    second = registered(traffic, 7, fanin=2, ports=(40011, 40012), slot=3, round=1, **other)
    await tb.send([frame for pair in zip(first, second) for frame in pair] + first[2:])
    await tb.check()
    await tb.leave(other["job"], {(HOST_IP, 40012)})
    after = registered(traffic, 7, fanin=2, ports=(40011, 40012), slot=2, round=2, **other)
    assert [name for name, _ in decided(tb, after)] == ["accumulated", "drop_member"]
    await tb.send(after)
    await tb.check()
    await tb.remove(ASKING["job"])
    await tb.send(registered(traffic, 7, slot=3, round=2)[:1] + traffic.clique(3, fanin=2, slot=0, job=9)[:1])
    await tb.install(job_entry(job=0x5EED_0003))
    third = registered(traffic, 3, fanin=2, slot=0, round=1, job=0x5EED_0003)
    assert [name for name, _ in decided(tb, third)] == ["accumulated", "accumulated"]
    await tb.send(third)
    await tb.check()
    stats = tb.model.stats()
    assert (stats["drop_job"], stats["drop_member"], stats["results_emitted"]) == (1, 1, 3), stats


@cocotb.test()
async def registered_and_stranger_traffic_mixed_under_backpressure(dut):
    """Random cliques of two registered jobs interleaved with version 2 cliques, forged copies of their frames
    (wrong token, job, port or address), malformed and foreign frames, with pauses on both sides."""
    tb, traffic = await start(dut, 43, source_pause=0.25, sink_pause=0.4)
    need_tables(tb)
    chooser = random.Random(43)
    jobs = [dict(ASKING), dict(job=0x5EED_0004, token=chooser.getrandbits(64) | 1, group=0xEF_21_00_04)]
    for fields in jobs:
        await tb.install(job_entry(**fields, slots=3))
    queues = [registered(traffic, chooser.randint(1, 40), fanin=chooser.randint(1, 3), slot=chooser.randrange(3),
                         round=chooser.getrandbits(32), **fields) for fields in jobs for _ in range(2)]
    queues += [traffic.clique(chooser.randint(1, 20), fanin=2, slot=slot, job=3) for slot in (6, 7)]

    def stray(frames):
        roll = chooser.random()
        if roll < 0.5 and frames:
            forged = bytearray(chooser.choice(frames))
            change = chooser.choice([dict(token=chooser.getrandbits(64)), dict(job=chooser.getrandbits(32)),
                                     dict(udp_sport=chooser.randrange(1, 65536)), dict(ip_src=HOST_IP + 9)])
            return bytes(patch(forged, **change))
        if roll < 0.8:
            return chooser.choice(malformed(traffic))[0]
        return chooser.choice(traffic.foreign())

    await tb.send(interleave(chooser, queues, stray, 0.3))
    await tb.check()
