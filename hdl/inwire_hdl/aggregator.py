"""The in-line aggregator: AXI4-Stream in, AXI4-Stream out, cut-through.

Input side (one frame at a time, in order): each accepted beat is registered in stage I0 while its
bytes of the first 128 are captured into a FRAME_HEADER register. On the beat that ends the header (beat
128/W - 1, or tlast if earlier) the frame is classified combinationally against the slot table, and a
context (what to do, the answer's header fields) is pushed into the context FIFO. Every beat goes into the
beat FIFO tagged with `first` and `bad` (the frame length is found wrong on this beat or before). At a
good tlast a contribution or partial commits its slot entry (level, bitmap, completion, which sum bank is
current).

Reduction trees (protocol version 2): a contribution or partial holds a set of members (`bitmap`, 0 for
its sender alone) and names its level (`expect`, 0 for the whole clique); a version 1 frame reads as one
whose tree fields are all 0. A frame overlapping the members already summed is a duplicate; a slot is
complete when the members summed make up its level. The frame that completes a slot, or asks for its
stored output, decides where the output goes: to `hop1` as a partial (its hops moved up one level, the
status trailer carrying the overflow flag) when that is set, else to the group as the result. A partial's
own trailer flag is or'ed into the slot's overflow flag as it goes by. Hops that would send a partial to
this aggregator, back to the frame's source or outside the upstream prefix (`config.upstream_prefix`)
are dropped before the slot table (DROP_ROUTE); a frame older than its job's owner of the slot (an
earlier round, or an earlier chunk of the same round and clique) is dropped (DROP_STALE) until the
slot's lease runs out, whether the slot is complete or not.

Output side: pops beats in order; a frame starts only when its context is there, which is what makes the
beat FIFO the header delay line. Stage R loads a beat and reads the slot's sum memory (one word per beat);
stage A adds with saturation and prepares the beat's other sources (forwarded bytes, the rewritten header,
stored sums or counters) and picks up a partial's trailer flag; stage S picks per lane, adds the status
trailer and writes the sums to the slot's other bank; stage B is the output register. Frames that need
more output beats than input beats (trailer beat, answers to 128-byte requests) insert beats at stage R
while the input keeps filling the beat FIFO.
Counters and the per-slot overflow flags are updated as each frame's last beat leaves stage S, so a stats
reply reads exactly the frames before its request.

Slot leases: a TIME_BITS-bit (16) timer counts pulses of `lease_tick`; a frame's time is the timer's value when
its header's last beat is accepted, and a contribution's commit stamps its slot entry with it. The idle
time (frame time minus stamp, modulo 2**TIME_BITS) is a subtraction in C3 and its comparison with the
lease a comparison with a constant in I3: one carry chain per stage.
"""

import enum

from amaranth.hdl import Array, Cat, Const, Module, Mux, Signal, Value, signed, unsigned
from amaranth.lib import data, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from inwire.model import LEASE_TICK_S, TIME_BITS, AggregatorConfig
from inwire.protocol import (
    COUNTERS,
    ELEMENT_BYTES,
    ETHERNET_BYTES,
    ETHERTYPE_IPV4,
    FRAME_HEADER_BYTES,
    IP_FLAG_DF,
    IP_PROTO_UDP,
    IP_VER_IHL,
    IPV4_BYTES,
    MAGIC,
    MIN_FRAME_BYTES,
    MULTICAST_MASK,
    MULTICAST_PREFIX,
    RESULT_TRAILER_BYTES,
    RESULT_TTL,
    VERSION,
    Disposition,
    Opcode,
    multicast_mac,
)

from . import DATA_WIDTHS
from .blocks import RegisteredFIFO, SaturatingAdder, fold16, ipv4_words, lane_bytes, popcount
from .layout import FRAME_HEADER, field_bytes, field_shape, field_value

STATS_COUNT = len(COUNTERS)


class Action(enum.IntEnum):
    DROP = 0
    FORWARD = 1
    SUM_SILENT = 2
    SUM_RESULT = 3
    STORED = 4
    STATS = 5


def context_layout(slot_bits, beat_bits, sum_addr_bits):
    return data.StructLayout({
        "action": 3, "disp": Disposition, "slot": slot_bits, "rbank": 1, "fresh": 1, "reclaim": 1, "expire": 1,
        "opcode": 8, "sender": 8, "fanin": 8, "exponent": 8, "contributors": 8,
        "job": 32, "round": 32, "clique": 16, "chunk": 32, "count": 16, "group": 32, "bitmap": 64,
        "hdr_slot": 16, "dst_mac": 48, "dst_ip": 32, "dst_port": 16, "out_len": 16, "out_beats": beat_bits,
        "ip_csum": 16, "rd_first": sum_addr_bits,
        # The answer's version (1 or 2) and tree fields, and whether the frame is a partial (its trailer's
        # overflow flag is picked up as it goes by).
        "v1": 1, "expect": 64, "hop1": 32, "hop1_expect": 64, "carry_in": 1,
    })


def header_register(name):
    """A 128-byte header as a FRAME_HEADER view over a plain signal: a signal declared with the layout
    would carry one named wire per header byte into the Verilog, which slows Icarus down a lot."""
    return data.View(FRAME_HEADER, Signal(FRAME_HEADER.size, name=name))


META = data.StructLayout({
    "job": 32, "round": 32, "clique": 16, "chunk": 32,
    "fanin": 8, "group": 32, "count": 16, "exponent": 8,
    "level": 64, "bitmap": 64, "contributors": 8, "complete": 1, "cur": 1, "stamp": TIME_BITS,
})


def answers(context):
    """Whether the frame of `context` is answered: its output beats follow the context, not the input."""
    return ((context.action == Action.SUM_RESULT) | (context.action == Action.STORED)
            | (context.action == Action.STATS))


class _Pipeline:
    """What the stage methods of one `Aggregator.elaborate` share: the Module, the FIFOs and memories, and
    the signals a stage makes that later stages read. Each stage adds its own with `share`."""

    def __init__(self, m, **shared):
        self.m = m
        self.share(**shared)

    def share(self, **shared):
        vars(self).update(shared)


class Aggregator(wiring.Component):
    """Aggregator gateware for `config` (an `inwire.model.AggregatorConfig`), `data_width` bytes per beat.

    Ports: `s_axis_t{data,keep,last,valid,ready}` in, `m_axis_t{data,keep,last,valid,ready,user}` out
    (tuser on a last beat marks an aborted frame), one 32-bit `stat_<name>` per `COUNTERS` name, and
    `lease_tick`, one pulse per tick of the lease timer (`LeaseTicker` makes them from the clock).
    `buffer_beats` is the depth of the beat FIFO (at least the header's beats plus slack).
    """

    def __init__(self, config=None, data_width=8, buffer_beats=None):
        config = config or AggregatorConfig()
        if data_width not in DATA_WIDTHS:
            raise ValueError(f"data width must be one of {DATA_WIDTHS} bytes, got {data_width}")
        self.config = config
        self.data_width = data_width
        self.header_beats = FRAME_HEADER_BYTES // data_width
        self.buffer_beats = buffer_beats or 2 * self.header_beats + 16
        if self.buffer_beats < self.header_beats + 2:
            raise ValueError(f"buffer_beats must be at least {self.header_beats + 2}")
        self.lanes = data_width // ELEMENT_BYTES
        self.slot_bits = max(1, ceil_log2(config.slots))
        self.bank_words = -(-ELEMENT_BYTES * config.max_elements // data_width)
        longest = FRAME_HEADER_BYTES + ELEMENT_BYTES * 0xFFFF + RESULT_TRAILER_BYTES
        self.beat_bits = ceil_log2(longest // data_width + 2)
        ports = {
            "s_axis_tdata": In(8 * data_width), "s_axis_tkeep": In(data_width), "s_axis_tlast": In(1),
            "s_axis_tvalid": In(1), "s_axis_tready": Out(1),
            "m_axis_tdata": Out(8 * data_width), "m_axis_tkeep": Out(data_width), "m_axis_tlast": Out(1),
            "m_axis_tvalid": Out(1), "m_axis_tready": In(1), "m_axis_tuser": Out(1), "lease_tick": In(1),
        }
        ports.update({f"stat_{name}": Out(32) for name in COUNTERS})
        super().__init__(ports)

    def elaborate(self, platform):
        p = self._resources()
        # Input side: beats move I0 → I1 → I2 → I3 while their frame's header is classified (C1 → C3).
        self._input(p)
        self._classifier_registers(p)
        self._classify_header(p)
        self._classify_lengths(p)
        self._classify_checks(p)
        self._classify_slot(p)
        self._answer(p)
        self._decide(p)
        self._commit(p)
        self._enqueue(p)
        # Output side: R loads a beat, A adds, S picks and writes the sums back, B is the output register.
        self._output_control(p)
        self._stage_r(p)
        self._stage_a(p)
        self._result_header(p)
        self._lane_sources(p)
        self._stage_s(p)
        self._stage_b(p)
        return p.m

    def _resources(self):
        """The Module, the FIFOs and memories between the two sides, and the counters."""
        m = Module()
        cfg, W = self.config, self.data_width
        sum_depth = cfg.slots * 2 * self.bank_words
        ctx_layout = context_layout(self.slot_bits, self.beat_bits, ceil_log2(sum_depth))
        beat_layout = data.StructLayout({"data": 8 * W, "keep": W, "last": 1, "first": 1, "bad": 1})

        m.submodules.beats = beats = RegisteredFIFO(beat_layout.size, self.buffer_beats)
        m.submodules.contexts = contexts = RegisteredFIFO(ctx_layout.size, self.buffer_beats)
        m.submodules.meta = meta_mem = Memory(shape=META, depth=cfg.slots, init=[])
        meta_wr = meta_mem.write_port()
        meta_rd = meta_mem.read_port(transparent_for=(meta_wr,))
        slot_valid = Signal(cfg.slots)
        m.submodules.sums = sum_mem = Memory(shape=unsigned(8 * W), depth=sum_depth, init=[])
        sum_wr = sum_mem.write_port()
        sum_rd = sum_mem.read_port(transparent_for=(sum_wr,))
        m.submodules.adder = adder = SaturatingAdder(self.lanes)

        counters = [Signal(32, name=f"count_{name}") for name in COUNTERS]
        for name, counter in zip(COUNTERS, counters, strict=True):
            m.d.comb += getattr(self, f"stat_{name}").eq(counter)
        return _Pipeline(m, shift=ceil_log2(W), ctx_layout=ctx_layout, beat_layout=beat_layout, beats=beats,
                         contexts=contexts, meta_wr=meta_wr, meta_rd=meta_rd, slot_valid=slot_valid,
                         sum_wr=sum_wr, sum_rd=sum_rd, adder=adder, counters=counters)

    def _input(self, p):
        """I0–I3, and the header register filled from the beats entering I0."""
        m, W, H = p.m, self.data_width, self.header_beats
        # Beats move I0 → I1 → I2 → I3 in lockstep (`adv`); I3 writes the beat FIFO. The frame whose
        # header ends in a beat is classified while that beat travels: entering I1 the header's decoded
        # flags, fields and partial checksums are registered (C1); entering I2 the frame-length checks and
        # the checksum total (C2), and the slot table is read; entering I3 the checks before the slot
        # table, the slot-table comparisons and the answer's fields (C3); in I3 the disposition is chosen.
        stage_layout = data.StructLayout({"valid": 1, "data": 8 * W, "keep": W, "last": 1, "first": 1,
                                          "hdr_end": 1, "idx": self.beat_bits, "bytes": range(W + 1)})
        i0, i1, i2, i3 = (Signal(stage_layout, name=f"i{n}") for n in range(4))
        in_idx = Signal(self.beat_bits)
        hdr = header_register("hdr")
        timer, hdr_now = Signal(TIME_BITS), Signal(TIME_BITS)
        with m.If(self.lease_tick):
            m.d.sync += timer.eq(timer + 1)
        adv = Signal()
        m.d.comb += [adv.eq(p.beats.w_rdy & p.contexts.w_rdy), self.s_axis_tready.eq(adv)]
        with m.If(adv):
            m.d.sync += [
                i0.valid.eq(self.s_axis_tvalid), i0.data.eq(self.s_axis_tdata), i0.keep.eq(self.s_axis_tkeep),
                i0.last.eq(self.s_axis_tlast), i0.first.eq(in_idx == 0), i0.idx.eq(in_idx),
                i0.hdr_end.eq(self.s_axis_tvalid & (in_idx < H) & (self.s_axis_tlast | (in_idx == H - 1))),
                i1.eq(i0), i1.bytes.eq(popcount(i0.keep)), i2.eq(i1), i3.eq(i2),
            ]
            with m.If(self.s_axis_tvalid):
                m.d.sync += in_idx.eq(Mux(self.s_axis_tlast, 0, Mux(in_idx.all(), in_idx, in_idx + 1)))
                with m.If(in_idx < H):
                    m.d.sync += [hdr.as_value().word_select(in_idx[:ceil_log2(H)], 8 * W).eq(self.s_axis_tdata),
                                 hdr_now.eq(timer)]
        p.share(i0=i0, i1=i1, i2=i2, i3=i3, hdr=hdr, hdr_now=hdr_now, adv=adv)

    def _classifier_registers(self, p):
        """C1–C3 (what is known so far about the frame whose header ended), the slot entry read for it
        (`meta3`, in C3's cycle) and the answer's fields (`ans`, from C3)."""
        W = self.data_width
        cls = data.StructLayout({
            **{flag: 1 for flag in (
                "foreign", "bad_ver", "frag", "bad_magic", "summed", "partial", "v1", "partial_out",
                "level_outside", "members_full", "result_req", "stats_req",
                "lengths_bad", "fanin_bad", "sender_bad", "count_bad", "group_bad", "slot_bad",
                "runt", "header_short", "request_len_ok", "len_pending", "pre_pass",
                "route_bad", "slot_seen", "meta_valid", "key_match", "shape_match", "duplicate", "newer", "older",
                "last_member")},
            "pre_disp": Disposition, "pre_action": 3, "csum_a": 18, "csum_b": 18, "csum_c": 17, "csum_total": 20,
            "slot": 16, "job": 32, "round": 32, "clique": 16, "chunk": 32, "fanin": 8, "group": 32,
            "count": 16, "exponent": 8, "sender": 8, "members": 64, "level": 64, "member_count": 7,
            "hop1": 32, "out_expect": 64, "out_hop1": 32, "out_hop1_expect": 64, "eth_src": 48, "ip_src": 32,
            "udp_sport": 16, "expected_last": self.beat_bits, "expected_tail": range(W + 1),
            "len_hdr": 19, "beats_hdr": self.beat_bits, "len_meta": 19, "beats_meta": self.beat_bits,
            "now": TIME_BITS, "idle": TIME_BITS,
        })
        c1, c2, c3 = (Signal(cls, name=f"c{n}") for n in (1, 2, 3))
        meta3 = Signal(META)
        ans = Signal(p.ctx_layout)
        p.share(c1=c1, c2=c2, c3=c3, meta3=meta3, ans=ans)

    def _classify_header(self, p):
        """C1: everything that needs only the header."""
        m, cfg, W, shift, hdr, c1 = p.m, self.config, self.data_width, p.shift, p.hdr, p.c1

        def f(name):
            return field_value(hdr, name)

        opcode, count, fanin, sender = f("opcode"), f("count"), f("fanin"), f("sender")
        is_partial = opcode == Opcode.PARTIAL
        summed = (opcode == Opcode.CONTRIBUTION) | is_partial
        # A version 1 frame reads as one with every tree field 0: its sender alone, the whole clique, the root.
        v1 = f("version") == 1
        bitmap, expect = f("bitmap"), f("expect")
        sender_bit = Const(1, 64) << sender[:6]
        clique = Cat(*(fanin > member for member in range(64)))
        hop1 = Mux(v1, 0, f("hop1"))
        # Where the frame's hops may send this level's partial (the model's `_route_allowed`): up, never to
        # this aggregator or back to the frame's source, only within the upstream prefix; `hop2` only above
        # a `hop1` and distinct from it and from this aggregator. A version 1 frame has no route to check.
        hop1_raw, hop2_raw = f("hop1"), f("hop2")
        network, length = cfg.upstream_prefix
        upstream_mask = (0xFFFFFFFF << (32 - length)) & 0xFFFFFFFF
        route_bad = ~v1 & Mux(hop1_raw == 0, hop2_raw != 0,
                              (hop1_raw == cfg.ip) | (hop1_raw == f("ip_src")) | ((hop1_raw & upstream_mask) != network)
                              | (hop2_raw == hop1_raw) | (hop2_raw == cfg.ip))
        # Lengths as one adder each (constants folded), the opcode choosing between results; a partial's
        # frame carries its status trailer as one more word after the elements.
        payload_bytes = count * ELEMENT_BYTES
        frame_payload = (count + is_partial) * ELEMENT_BYTES
        words = ipv4_words(hdr)
        contribution_lengths_ok = ((f("ip_len") == frame_payload + (FRAME_HEADER_BYTES - ETHERNET_BYTES))
                                   & (f("udp_len") == frame_payload + (FRAME_HEADER_BYTES - ETHERNET_BYTES
                                                                       - IPV4_BYTES)))
        request_lengths_ok = ((f("ip_len") == FRAME_HEADER_BYTES - ETHERNET_BYTES)
                              & (f("udp_len") == FRAME_HEADER_BYTES - ETHERNET_BYTES - IPV4_BYTES))
        contribution_end = frame_payload + (FRAME_HEADER_BYTES - 1)
        result_len_hdr = payload_bytes + (FRAME_HEADER_BYTES + RESULT_TRAILER_BYTES)
        with m.If(p.adv & p.i0.hdr_end):
            m.d.sync += [
                c1.foreign.eq(~((f("eth_type") == ETHERTYPE_IPV4) & (f("ip_proto") == IP_PROTO_UDP)
                                & (f("ip_dst") == cfg.ip) & (f("udp_dport") == cfg.port))),
                c1.bad_ver.eq(f("ip_ver_ihl") != IP_VER_IHL),
                c1.frag.eq(f("ip_frag")[:14] != 0),
                c1.bad_magic.eq((f("magic") != MAGIC) | ((f("version") != VERSION) & ~v1)),
                c1.summed.eq(summed), c1.partial.eq(is_partial), c1.v1.eq(v1),
                c1.members.eq(Mux(v1 | (bitmap == 0), sender_bit, bitmap)),
                c1.level.eq(Mux(v1 | (expect == 0), clique, expect)),
                c1.level_outside.eq(~v1 & (expect & ~clique).any()),
                c1.hop1.eq(hop1), c1.partial_out.eq(hop1 != 0), c1.route_bad.eq(route_bad),
                c1.out_expect.eq(f("hop1_expect")), c1.out_hop1.eq(hop2_raw), c1.out_hop1_expect.eq(f("hop2_expect")),
                c1.result_req.eq(opcode == Opcode.RESULT_REQUEST),
                c1.stats_req.eq(opcode == Opcode.STATS_REQUEST),
                c1.lengths_bad.eq(~Mux(summed, contribution_lengths_ok, request_lengths_ok)),
                c1.fanin_bad.eq((fanin == 0) | (fanin > cfg.max_fanin)),
                c1.sender_bad.eq(sender >= fanin),
                c1.count_bad.eq((count == 0) | (count > cfg.max_elements)),
                c1.group_bad.eq((f("group") & MULTICAST_MASK) != MULTICAST_PREFIX),
                c1.slot_bad.eq(f("slot") >= cfg.slots),
                c1.csum_a.eq((words[0] + words[1]) + (words[2] + words[3])),
                c1.csum_b.eq((words[4] + words[5]) + (words[6] + words[7])),
                c1.csum_c.eq(words[8] + words[9]),
                c1.now.eq(p.hdr_now),
                c1.slot.eq(f("slot")), c1.job.eq(f("job")), c1.round.eq(f("round")), c1.clique.eq(f("clique")),
                c1.chunk.eq(f("chunk")), c1.fanin.eq(fanin), c1.group.eq(f("group")), c1.count.eq(count),
                c1.exponent.eq(f("exponent")), c1.sender.eq(sender),
                c1.eth_src.eq(f("eth_src")), c1.ip_src.eq(f("ip_src")), c1.udp_sport.eq(f("udp_sport")),
                c1.expected_last.eq(Mux(summed, contribution_end >> shift, (FRAME_HEADER_BYTES - 1) >> shift)),
                c1.expected_tail.eq(Mux(summed, contribution_end[:shift] + 1,
                                        ((FRAME_HEADER_BYTES - 1) & (W - 1)) + 1)),
                c1.len_hdr.eq(result_len_hdr),
                c1.beats_hdr.eq((payload_bytes + (FRAME_HEADER_BYTES + RESULT_TRAILER_BYTES + W - 1)) >> shift),
            ]

    def _classify_lengths(self, p):
        """C2: the frame length so far, the checksum total, the member checks (outside the level, the whole
        level, how many); the slot table is read on the same edge."""
        m, i1, c1, c2 = p.m, p.i1, p.c1, p.c2
        # A frame that commits an entry has its tlast at least 128/W ≥ 2 beats ahead of the next frame's
        # header end, so its commit is registered on this edge or earlier and written on the next edge
        # or earlier: the transparent read port passes a write on this edge through, and a write on the
        # next one (`stale`) is forwarded in I2.
        commit, commit_q, stale = Signal(), Signal(), Signal()
        commit_slot = Signal(self.slot_bits)
        commit_entry = Signal(META)
        frame_len = (i1.idx << p.shift) + i1.bytes
        with m.If(p.adv & i1.hdr_end):
            m.d.sync += [
                c2.eq(c1),
                c2.runt.eq(i1.last & (frame_len < MIN_FRAME_BYTES)),
                c2.header_short.eq(i1.last & (frame_len < FRAME_HEADER_BYTES)),
                c2.request_len_ok.eq(i1.last & (frame_len == FRAME_HEADER_BYTES)),
                c2.csum_total.eq(c1.csum_a + c1.csum_b + c1.csum_c),
                # DROP_SENDER also for members outside the level, or a level member not below the fan-in.
                c2.sender_bad.eq(c1.sender_bad | c1.level_outside | (c1.members & ~c1.level).any()),
                c2.members_full.eq(c1.members == c1.level),
                c2.member_count.eq(popcount(c1.members)),
                c2.slot_seen.eq(p.slot_valid.bit_select(c1.slot[:self.slot_bits], 1)
                                | (commit_q & (commit_slot == c1.slot[:self.slot_bits]))),
                stale.eq(commit),
            ]
        m.d.comb += [p.meta_rd.en.eq(p.adv), p.meta_rd.addr.eq(c1.slot)]
        p.share(commit=commit, commit_q=commit_q, stale=stale, commit_slot=commit_slot, commit_entry=commit_entry)

    def _classify_checks(self, p):
        """C3, first half: the checks in the model's order up to the slot table."""
        m, c2 = p.m, p.c2
        once = c2.csum_total[:16] + c2.csum_total[16:]
        csum_ok = Mux(once[16], once[:16] == 0xFFFE, once[:16] == 0xFFFF)
        pre_disp, pre_action, pre_pass = Signal(Disposition), Signal(Action), Signal()
        len_pending = Signal()

        def pre(disposition, action=Action.DROP):
            m.d.comb += [pre_disp.eq(disposition), pre_action.eq(action)]

        with m.If(c2.runt):
            pre(Disposition.DROP_RUNT)
        with m.Elif(c2.foreign):
            pre(Disposition.FORWARDED, Action.FORWARD)
        with m.Elif(c2.bad_ver):
            pre(Disposition.DROP_IP_HEADER)
        with m.Elif(c2.frag):
            pre(Disposition.DROP_IP_FRAGMENT)
        with m.Elif(~csum_ok):
            pre(Disposition.DROP_IP_CHECKSUM)
        with m.Elif(c2.header_short):
            pre(Disposition.DROP_LENGTH)
        with m.Elif(c2.bad_magic):
            pre(Disposition.DROP_VERSION)
        with m.Elif(~c2.summed & ~c2.result_req & ~c2.stats_req):
            pre(Disposition.DROP_OPCODE)
        with m.Elif(c2.lengths_bad | (~c2.summed & ~c2.request_len_ok)):
            pre(Disposition.DROP_LENGTH)
        with m.Else():
            # From here on a contribution's or partial's frame length is still to be checked beat by beat.
            m.d.comb += len_pending.eq(c2.summed)
            with m.If(c2.stats_req):
                pre(Disposition.ANSWERED, Action.STATS)
            with m.Elif(c2.fanin_bad):
                pre(Disposition.DROP_FANIN)
            with m.Elif(c2.sender_bad):
                pre(Disposition.DROP_SENDER)
            with m.Elif(c2.count_bad):
                pre(Disposition.DROP_COUNT)
            with m.Elif(c2.group_bad):
                pre(Disposition.DROP_GROUP)
            with m.Elif(c2.slot_bad):
                pre(Disposition.DROP_SLOT)
            with m.Elif(c2.route_bad):
                pre(Disposition.DROP_ROUTE)
            with m.Else():
                m.d.comb += pre_pass.eq(1)
        p.share(pre_disp=pre_disp, pre_action=pre_action, pre_pass=pre_pass, len_pending=len_pending)

    def _classify_slot(self, p):
        """C3, second half: the slot-table comparisons against the entry read (or forwarded) in I2."""
        m, W, c2, c3, commit_entry = p.m, self.data_width, p.c2, p.c3, p.commit_entry
        forward = p.stale & (p.commit_slot == c2.slot[:self.slot_bits])
        meta_valid = (c2.slot_seen | forward) & ~c2.slot_bad

        def compare(entry):
            """The frame against one candidate entry; both candidates are compared, then one is chosen."""
            round_delta = Signal(32)
            m.d.comb += round_delta.eq(c2.round - entry.round)
            length = entry.count * ELEMENT_BYTES + (FRAME_HEADER_BYTES + RESULT_TRAILER_BYTES)
            same_job = entry.job == c2.job
            # The model's `is_older`: an earlier round (serial order), or the same round and clique and an
            # earlier chunk.
            earlier_chunk = (entry.round == c2.round) & (entry.clique == c2.clique) & (c2.chunk < entry.chunk)
            return {
                "key_match": ((entry.job == c2.job) & (entry.round == c2.round) & (entry.clique == c2.clique)
                              & (entry.chunk == c2.chunk)),
                "shape_match": ((entry.fanin == c2.fanin) & (entry.group == c2.group) & (entry.count == c2.count)
                                & (entry.exponent == c2.exponent) & (entry.level == c2.level)),
                "duplicate": self._overlaps(entry.bitmap, c2),
                "newer": same_job & (round_delta != 0) & ~round_delta[31],
                "older": same_job & ((round_delta[31] & (round_delta[:31] != 0)) | earlier_chunk),
                "last_member": (entry.bitmap | c2.members) == c2.level,
                "idle": (c2.now - entry.stamp)[:TIME_BITS],
                "len_meta": length,
                "beats_meta": (entry.count * ELEMENT_BYTES
                               + (FRAME_HEADER_BYTES + RESULT_TRAILER_BYTES + W - 1)) >> p.shift,
            }

        read, forwarded = compare(p.meta_rd.data), compare(commit_entry)
        checks = {name: Mux(forward, forwarded[name], read[name]) for name in read}
        key_match = meta_valid & checks.pop("key_match")
        with m.If(p.adv & p.i2.hdr_end):
            m.d.sync += [
                c3.eq(c2), c3.pre_disp.eq(p.pre_disp), c3.pre_action.eq(p.pre_action), c3.pre_pass.eq(p.pre_pass),
                c3.len_pending.eq(p.len_pending), c3.meta_valid.eq(meta_valid), c3.key_match.eq(key_match),
                *(getattr(c3, name).eq(value) for name, value in checks.items()),
                p.meta3.eq(Mux(forward, commit_entry, p.meta_rd.data)),
            ]

    @staticmethod
    def _overlaps(bitmap, c2):
        """Whether a slot entry's `bitmap` already holds one of the frame's members (DROP_DUPLICATE): any
        overlap, so that a member's elements are summed at most once per slot, whichever frames carry it."""
        return (bitmap & c2.members) != 0

    def _answer(self, p):
        """The answer's fields. A stored output is the slot's: a result request need not repeat its fan-in,
        group, count or exponent. The frame that causes the output says where it goes: a partial to its
        `hop1` (hops moved up one level) when that is set, else the result to the group. Where the frame is
        dropped these fields are not used."""
        m, W, shift, c3, meta3, ans = p.m, self.data_width, p.shift, p.c3, p.meta3, p.ans
        stored = c3.key_match & meta3.complete
        result_group = Mux(stored, meta3.group, c3.group)
        up = c3.partial_out
        stats_len = FRAME_HEADER_BYTES + ELEMENT_BYTES * STATS_COUNT
        # Member sets summed into a slot are disjoint (an overlap is DROP_DUPLICATE): counts add up.
        result_fields = {
            "opcode": Mux(up, Opcode.PARTIAL, Opcode.RESULT), "fanin": Mux(stored, meta3.fanin, c3.fanin),
            "exponent": Mux(stored, meta3.exponent, c3.exponent),
            "contributors": Mux(c3.key_match, meta3.contributors + Mux(meta3.complete, 0, c3.member_count),
                                c3.member_count),
            "round": c3.round, "clique": c3.clique, "chunk": c3.chunk,
            "count": Mux(stored, meta3.count, c3.count), "group": result_group,
            "bitmap": Mux(c3.key_match, meta3.bitmap | Mux(meta3.complete, 0, c3.members), c3.members),
            "hdr_slot": c3.slot, "slot": c3.slot,
            "dst_mac": Mux(up, self.config.gateway_mac, multicast_mac(0) | result_group[:23]),
            "dst_ip": Mux(up, c3.hop1, result_group), "dst_port": self.config.port,
            "out_len": Mux(stored, c3.len_meta, c3.len_hdr), "out_beats": Mux(stored, c3.beats_meta, c3.beats_hdr),
            "expect": Mux(up, c3.out_expect, 0), "hop1": Mux(up, c3.out_hop1, 0),
            "hop1_expect": Mux(up, c3.out_hop1_expect, 0),
        }
        stats_fields = {"opcode": Opcode.STATS_REPLY, "count": STATS_COUNT, "dst_mac": c3.eth_src,
                        "dst_ip": c3.ip_src, "dst_port": c3.udp_sport, "out_len": stats_len,
                        "out_beats": (stats_len + W - 1) >> shift}
        m.d.comb += [ans.rbank.eq(meta3.cur), ans.sender.eq(c3.sender), ans.job.eq(c3.job), ans.v1.eq(c3.v1),
                     ans.carry_in.eq(c3.partial)]
        for name, value in result_fields.items():
            m.d.comb += getattr(ans, name).eq(Mux(c3.stats_req, stats_fields.get(name, 0), value))

    def _decide(self, p):
        """I3: the disposition of the frame whose header ends here."""
        m, c3, meta3 = p.m, p.c3, p.meta3
        disp = Signal(Disposition)
        action = Signal(Action)
        fresh, reclaim, expire = Signal(), Signal(), Signal()
        lease = self.config.lease
        expired = Const(0) if lease == 0 else c3.idle >= lease
        complete = Mux(c3.key_match, c3.last_member, c3.members_full)
        summed = Mux(complete, Action.SUM_RESULT, Action.SUM_SILENT)

        def decide(disposition, what=Action.DROP):
            m.d.comb += [disp.eq(disposition), action.eq(what)]

        with m.If(~c3.pre_pass):
            decide(c3.pre_disp, c3.pre_action)
        with m.Elif(~c3.summed):
            with m.If(c3.key_match & meta3.complete):
                decide(Disposition.ANSWERED, Action.STORED)
            with m.Else():
                decide(Disposition.DROP_NO_RESULT)
        with m.Elif(c3.key_match):
            with m.If(~c3.shape_match):
                decide(Disposition.DROP_MISMATCH)
            with m.Elif(meta3.complete):
                decide(Disposition.ANSWERED, Action.STORED)
            with m.Elif(c3.duplicate):
                decide(Disposition.DROP_DUPLICATE)
            with m.Else():
                decide(Disposition.ACCUMULATED, summed)
        with m.Elif(~c3.meta_valid):
            m.d.comb += fresh.eq(1)
            decide(Disposition.ACCUMULATED, summed)
        with m.Elif(c3.older & ~expired):
            # A delayed copy never evicts its job's newer owner, finished or not, while the lease runs.
            decide(Disposition.DROP_STALE)
        with m.Elif(meta3.complete):
            m.d.comb += fresh.eq(1)
            decide(Disposition.ACCUMULATED, summed)
        with m.Elif(c3.newer):
            m.d.comb += [fresh.eq(1), reclaim.eq(1)]
            decide(Disposition.ACCUMULATED, summed)
        with m.Elif(expired):
            m.d.comb += [fresh.eq(1), expire.eq(1)]
            decide(Disposition.ACCUMULATED, summed)
        with m.Else():
            decide(Disposition.DROP_COLLISION)
        p.share(disp=disp, action=action, fresh=fresh, reclaim=reclaim, expire=expire, complete=complete)

    def _commit(self, p):
        """A contribution's or partial's frame length, checked on every beat from the header's end to tlast,
        and the slot entry it commits at a good tlast."""
        m, i3, c3, ans = p.m, p.i3, p.c3, p.ans
        commit, commit_q, commit_slot, commit_entry = p.commit, p.commit_q, p.commit_slot, p.commit_entry
        # C3 holds the frame of the last header end that reached I3.
        fire = p.adv & i3.valid
        f_bad, f_sum = Signal(), Signal()
        last_at, tail_at = c3.expected_last, c3.expected_tail
        bad = Signal()
        m.d.comb += bad.eq((~i3.hdr_end & f_bad) | (c3.len_pending & (
            ((i3.idx == last_at) & (~i3.last | (i3.bytes != tail_at))) | (i3.last & (i3.idx < last_at)))))
        with m.If(fire):
            m.d.sync += f_bad.eq(bad & ~i3.last)
            with m.If(i3.hdr_end):
                m.d.sync += f_sum.eq((p.action == Action.SUM_SILENT) | (p.action == Action.SUM_RESULT))
        # A summing contribution has at least one element, so its header end is never its good tlast.
        # The entry is registered here and written into the table (and its valid bit set) one cycle later.
        m.d.comb += commit.eq(fire & i3.last & ~i3.hdr_end & ~bad & f_sum)
        m.d.sync += commit_q.eq(commit)
        with m.If(commit):
            m.d.sync += [
                commit_slot.eq(ans.slot),
                commit_entry.job.eq(ans.job), commit_entry.round.eq(ans.round),
                commit_entry.clique.eq(ans.clique), commit_entry.chunk.eq(ans.chunk),
                commit_entry.fanin.eq(ans.fanin), commit_entry.group.eq(ans.group),
                commit_entry.count.eq(ans.count), commit_entry.exponent.eq(ans.exponent),
                commit_entry.level.eq(c3.level),
                commit_entry.bitmap.eq(ans.bitmap), commit_entry.contributors.eq(ans.contributors),
                commit_entry.complete.eq(p.complete), commit_entry.cur.eq(~p.meta3.cur),
                commit_entry.stamp.eq(c3.now),
            ]
        with m.If(commit_q):
            m.d.sync += p.slot_valid.bit_select(commit_slot, 1).eq(1)
        m.d.comb += [p.meta_wr.en.eq(commit_q), p.meta_wr.addr.eq(commit_slot), p.meta_wr.data.eq(commit_entry)]
        p.share(fire=fire, bad=bad)

    def _enqueue(self, p):
        """I3 writes the beat FIFO, and the context FIFO for a frame whose header ends."""
        m, i3, fire, ans = p.m, p.i3, p.fire, p.ans
        beat_in = Signal(p.beat_layout)
        m.d.comb += [
            beat_in.data.eq(i3.data), beat_in.keep.eq(i3.keep), beat_in.last.eq(i3.last),
            beat_in.first.eq(i3.first), beat_in.bad.eq(p.bad),
            p.beats.w_data.eq(beat_in), p.beats.w_en.eq(fire),
        ]

        # The context goes into its FIFO one cycle after the header's last beat enters the beat FIFO (the
        # output side waits for it); that cycle finishes the answer's IPv4 checksum.
        ctx_q = Signal(p.ctx_layout)
        ctx_q_valid = Signal()
        csum_sum = Signal(19)
        ip = self.config.ip
        csum_base = ((IP_VER_IHL << 8) + IP_FLAG_DF + ((RESULT_TTL << 8) | IP_PROTO_UDP)
                     + (ip >> 16) + (ip & 0xFFFF) - ETHERNET_BYTES)
        with m.If(fire & i3.hdr_end):
            m.d.sync += [
                ctx_q.eq(ans), ctx_q.action.eq(p.action), ctx_q.disp.eq(p.disp), ctx_q.fresh.eq(p.fresh),
                ctx_q.reclaim.eq(p.reclaim), ctx_q.expire.eq(p.expire),
                csum_sum.eq((ans.out_len + csum_base) + (ans.dst_ip[16:] + ans.dst_ip[:16])),
            ]
        m.d.sync += ctx_q_valid.eq((fire & i3.hdr_end) | (ctx_q_valid & ~p.contexts.w_rdy))
        ctx_in = Signal(p.ctx_layout)
        m.d.comb += [
            ctx_in.eq(ctx_q), ctx_in.ip_csum.eq(~fold16(csum_sum)),
            ctx_in.rd_first.eq((ctx_q.slot * 2 + ctx_q.rbank) * self.bank_words - self.header_beats),
            p.contexts.w_data.eq(ctx_in), p.contexts.w_en.eq(ctx_q_valid),
        ]

    def _output_control(self, p):
        """The output side's handshake, the frame being sent (`ctx`) and the position in it, and whether the
        next beat R loads is popped from the beat FIFO or inserted (`extend`)."""
        m, beats, contexts = p.m, p.beats, p.contexts
        advance = Signal()
        b_valid = Signal()
        m.d.comb += [advance.eq(~b_valid | self.m_axis_tready), self.m_axis_tvalid.eq(b_valid)]

        head = Signal(p.beat_layout)
        m.d.comb += head.eq(beats.r_data)
        ctx = Signal(p.ctx_layout)
        cur = Signal(p.ctx_layout)
        j_next = Signal(self.beat_bits)
        in_done = Signal(init=1)
        aborted = Signal()

        # `remaining` is ctx.out_beats - j_next (stuck once negative); `j_lt` and `j1_lt` are registered
        # `j_next < ctx.out_beats` and `j_next + 1 < ctx.out_beats`, which keeps adders and comparators
        # out of the beat-loading decision.
        remaining = Signal(signed(self.beat_bits + 2))
        j_lt, j1_lt = Signal(), Signal()
        first_ctx = data.View(p.ctx_layout, contexts.r_data)
        # The sum memory address of beat j_next of the frame in ctx, kept alongside j_next; a frame's
        # first beat reads at `rd_first`, computed with its context.
        rd_addr = Signal.like(p.sum_rd.addr)
        extend = Signal()
        m.d.comb += [
            extend.eq(in_done & ~aborted & answers(ctx) & j_lt),
            cur.eq(Mux(~extend & head.first, contexts.r_data, ctx)),
        ]
        can_pop = beats.r_rdy & (~head.first | contexts.r_rdy)
        pop = advance & ~extend & can_pop
        load_j = Signal(self.beat_bits)
        m.d.comb += [
            load_j.eq(Mux(extend, j_next, Mux(head.first, 0, j_next))),
            beats.r_en.eq(pop),
            contexts.r_en.eq(pop & head.first),
        ]
        p.share(advance=advance, b_valid=b_valid, head=head, ctx=ctx, cur=cur, j_next=j_next, in_done=in_done,
                aborted=aborted, remaining=remaining, j_lt=j_lt, j1_lt=j1_lt, first_ctx=first_ctx, rd_addr=rd_addr,
                extend=extend, can_pop=can_pop, load_j=load_j)

    def _stage_r(self, p):
        """Stage R loads a beat, popped or inserted, and reads its word of the sum memory."""
        m, W, head, cur, extend, load_j = p.m, self.data_width, p.head, p.cur, p.extend, p.load_j
        j_next, j_lt, j1_lt, remaining, rd_addr = p.j_next, p.j_lt, p.j1_lt, p.remaining, p.rd_addr
        aborted, first_ctx = p.aborted, p.first_ctx
        r_valid, r_popped, r_emit, r_last, r_user, r_end, r_bad = (Signal(name=f"r_{n}") for n in (
            "valid", "popped", "emit", "last", "user", "end", "bad"))
        r_j = Signal(self.beat_bits)
        r_data, r_keep = Signal(8 * W), Signal(W)
        first_beats = first_ctx.out_beats
        was_aborted = ~head.first & aborted
        in_window = Mux(head.first, first_beats > 0, j_lt)
        more_after = answers(cur) & ~head.bad & ~was_aborted & Mux(head.first, first_beats > 1, j1_lt)
        step = [remaining.eq(Mux(remaining < 0, remaining, remaining - 1)), j_lt.eq(j1_lt), j1_lt.eq(remaining > 2),
                rd_addr.eq(rd_addr + 1)]

        with m.If(p.advance):
            m.d.sync += [r_valid.eq(0), r_popped.eq(0)]
            with m.If(extend):
                m.d.sync += [
                    r_valid.eq(1), r_j.eq(j_next), r_emit.eq(1), r_user.eq(0), r_bad.eq(0),
                    r_last.eq(j_lt & ~j1_lt), r_end.eq(j_lt & ~j1_lt),
                    r_data.eq(0), r_keep.eq(0), j_next.eq(j_next + 1), *step,
                ]
            with m.Elif(p.can_pop):
                m.d.sync += [
                    r_valid.eq(1), r_popped.eq(1), r_j.eq(load_j), r_data.eq(head.data),
                    r_keep.eq(head.keep), r_bad.eq(head.bad), r_end.eq(head.last & ~more_after),
                    r_user.eq(0), j_next.eq(Mux(load_j.all(), load_j, load_j + 1)), p.in_done.eq(head.last),
                ]
                with m.If(head.first):
                    m.d.sync += [p.ctx.eq(p.contexts.r_data), aborted.eq(0), remaining.eq(first_beats - 1),
                                 j_lt.eq(first_beats > 1), j1_lt.eq(first_beats > 2),
                                 rd_addr.eq(first_ctx.rd_first + 1)]
                with m.Else():
                    m.d.sync += step
                with m.If(cur.action == Action.FORWARD):
                    m.d.sync += [r_emit.eq(1), r_last.eq(head.last)]
                with m.Elif(answers(cur)):
                    m.d.sync += r_emit.eq(~was_aborted & in_window)
                    with m.If(head.bad):
                        m.d.sync += [r_last.eq(1), r_user.eq(1)]
                        with m.If(~was_aborted & in_window):
                            m.d.sync += aborted.eq(1)
                    with m.Else():
                        m.d.sync += r_last.eq(Mux(head.first, first_beats == 1, j_lt & ~j1_lt))
                with m.Else():
                    m.d.sync += r_emit.eq(0)

        m.d.comb += [
            p.sum_rd.en.eq(p.advance),
            p.sum_rd.addr.eq(Mux(~extend & head.first, first_ctx.rd_first, rd_addr)),
        ]
        p.share(r_valid=r_valid, r_popped=r_popped, r_emit=r_emit, r_last=r_last, r_user=r_user, r_end=r_end,
                r_bad=r_bad, r_j=r_j, r_data=r_data, r_keep=r_keep)

    def _stage_a(self, p):
        """Stage A: the beat loaded by R, its word of the sum memory and its frame's context, registered
        (the block RAM's clock-to-output stays out of the adder's path); the adder's inputs."""
        m, W, H = p.m, self.data_width, self.header_beats
        a_valid, a_popped, a_emit, a_last, a_user, a_end, a_bad = (Signal(name=f"a_{n}") for n in (
            "valid", "popped", "emit", "last", "user", "end", "bad"))
        a_j = Signal(self.beat_bits)
        a_data, a_keep, a_mem = Signal(8 * W), Signal(W), Signal(8 * W)
        actx = Signal(p.ctx_layout)
        with m.If(p.advance):
            m.d.sync += [
                a_valid.eq(p.r_valid), a_popped.eq(p.r_popped), a_emit.eq(p.r_emit), a_last.eq(p.r_last),
                a_user.eq(p.r_user), a_end.eq(p.r_end), a_bad.eq(p.r_bad), a_j.eq(p.r_j), a_data.eq(p.r_data),
                a_keep.eq(p.r_keep), a_mem.eq(p.sum_rd.data), actx.eq(p.ctx),
            ]

        m.d.comb += [p.adder.a.eq(a_mem), p.adder.b.eq(a_data), p.adder.base_zero.eq(actx.fresh)]
        p.share(a_valid=a_valid, a_popped=a_popped, a_emit=a_emit, a_last=a_last, a_user=a_user, a_end=a_end,
                a_bad=a_bad, a_j=a_j, a_data=a_data, a_keep=a_keep, a_mem=a_mem, actx=actx,
                payload_beat=a_j - H, is_payload=a_j >= H,
                summing=(actx.action == Action.SUM_RESULT) | (actx.action == Action.SUM_SILENT),
                with_trailer=(actx.action == Action.SUM_RESULT) | (actx.action == Action.STORED))

    def _result_header(self, p):
        """The header of an answer, as a register-sized value stage A picks its words from."""
        m, cfg, actx = p.m, self.config, p.actx
        rh = header_register("result_header")
        header_values = {
            "eth_dst": actx.dst_mac, "eth_src": cfg.mac, "eth_type": ETHERTYPE_IPV4,
            "ip_ver_ihl": IP_VER_IHL, "ip_len": actx.out_len - ETHERNET_BYTES, "ip_frag": IP_FLAG_DF,
            "ip_ttl": RESULT_TTL, "ip_proto": IP_PROTO_UDP, "ip_csum": actx.ip_csum,
            "ip_src": cfg.ip, "ip_dst": actx.dst_ip, "udp_sport": cfg.port, "udp_dport": actx.dst_port,
            "udp_len": actx.out_len - ETHERNET_BYTES - IPV4_BYTES, "magic": MAGIC,
            "version": Mux(actx.v1, 1, VERSION),
            "opcode": actx.opcode, "sender": actx.sender, "fanin": actx.fanin, "exponent": actx.exponent,
            "contributors": actx.contributors, "job": actx.job, "round": actx.round, "clique": actx.clique,
            "slot": actx.hdr_slot, "chunk": actx.chunk, "count": actx.count, "group": actx.group,
            "bitmap": actx.bitmap, "expect": actx.expect, "hop1": actx.hop1, "hop1_expect": actx.hop1_expect,
        }
        for name, value in header_values.items():
            if not isinstance(value, Value):
                value = Const(value, field_shape(name))
            m.d.comb += getattr(rh, name).as_value().eq(field_bytes(value, name))
        p.share(rh=rh)

    def _lane_sources(self, p):
        """Stage A's sources other than the adder, per lane: forwarded bytes, a word of the rewritten
        header, stored sums or counters; and which lanes hold elements or the status trailer, and where a
        partial's own trailer carries a set overflow flag."""
        m, W, H, lanes = p.m, self.data_width, self.header_beats, self.lanes
        actx, payload_beat = p.actx, p.payload_beat
        lane_elements = [payload_beat * lanes + lane for lane in range(lanes)]
        # Lane k of a stats reply only ever carries counters k, k + lanes, ...: one small multiplexer each.
        lane_counters = [Array(p.counters[lane::lanes]) for lane in range(lanes)]
        stats_beat = payload_beat[:max(1, ceil_log2(-(-STATS_COUNT // lanes)))]

        other, out_keep = Signal(8 * W), Signal(W)
        trailer_lanes, counted_lanes, carried_lanes = Signal(lanes), Signal(lanes), Signal(lanes)
        with m.If(actx.action == Action.FORWARD):
            m.d.comb += [other.eq(p.a_data), out_keep.eq(p.a_keep)]
        with m.Elif(~p.is_payload):
            m.d.comb += [other.eq(p.rh.as_value().word_select(p.a_j[:ceil_log2(H)], 8 * W)),
                         out_keep.eq(Const(-1, W))]
        with m.Else():
            for lane, element in enumerate(lane_elements):
                bits = slice(32 * lane, 32 * lane + 32)
                with m.If(actx.action == Action.STORED):
                    m.d.comb += other[bits].eq(p.a_mem[bits])
                with m.Else():
                    counter = Signal(32, name=f"counter{lane}")
                    m.d.comb += [counter.eq(lane_counters[lane][stats_beat]),
                                 other[bits].eq(lane_bytes(counter))]
                at_trailer = element == actx.count
                trailer = p.with_trailer & at_trailer
                m.d.comb += [
                    trailer_lanes[lane].eq(trailer),
                    # A partial's own trailer sits where the answer's goes: bit 0 of its status word (the
                    # lane's last byte) is a level below's overflow flag. It is never counted as an element.
                    carried_lanes[lane].eq(actx.carry_in & at_trailer & p.a_data[32 * lane + 24]),
                    counted_lanes[lane].eq(element < actx.count),
                    out_keep[4 * lane:4 * lane + 4].eq(Mux((element < actx.count) | trailer, 0xF, 0)),
                ]
        p.share(other=other, out_keep=out_keep, trailer_lanes=trailer_lanes, counted_lanes=counted_lanes,
                carried_lanes=carried_lanes)

    def _stage_s(self, p):
        """Stage S: the adder's result and the other sources registered; S writes the sums back and picks
        per lane between them and the status trailer."""
        m, W, lanes, actx, payload_beat = p.m, self.data_width, self.lanes, p.actx, p.payload_beat
        summing, is_payload, sum_wr = p.summing, p.is_payload, p.sum_wr
        s_valid, s_emit, s_last, s_user, s_end, s_bad, s_first, s_wen = (Signal(name=f"s_{n}") for n in (
            "valid", "emit", "last", "user", "end", "bad", "first", "wen"))
        s_sum, s_other, s_keep = Signal(8 * W), Signal(8 * W), Signal(W)
        s_saturated, s_trailer = Signal(lanes), Signal(lanes)
        s_carried, s_partial_out = Signal(), Signal()
        s_waddr = Signal.like(sum_wr.addr)
        s_use_sum, s_stored, s_summing, s_with_trailer, s_fresh, s_reclaim, s_expire = (
            Signal(name=f"s_{n}") for n in ("use_sum", "stored", "summing", "with_trailer", "fresh", "reclaim",
                                            "expire"))
        s_slot = Signal(self.slot_bits)
        s_disp = Signal(Disposition)
        with m.If(p.advance):
            m.d.sync += [
                s_valid.eq(p.a_valid), s_emit.eq(p.a_emit), s_last.eq(p.a_last), s_user.eq(p.a_user),
                s_end.eq(p.a_end), s_bad.eq(p.a_bad), s_first.eq(p.a_j == 0), s_sum.eq(p.adder.sum),
                s_other.eq(p.other), s_keep.eq(p.out_keep), s_trailer.eq(p.trailer_lanes),
                s_saturated.eq(Mux(p.a_popped & summing & is_payload, p.adder.saturated & p.counted_lanes, 0)),
                s_carried.eq(p.a_popped & summing & is_payload & p.carried_lanes.any()),
                s_partial_out.eq(actx.opcode == Opcode.PARTIAL),
                s_wen.eq(p.a_valid & p.a_popped & summing & is_payload & (payload_beat * lanes < actx.count)),
                s_waddr.eq((actx.slot * 2 + ~actx.rbank) * self.bank_words + payload_beat),
                s_use_sum.eq(summing & is_payload), s_stored.eq(actx.action == Action.STORED),
                s_summing.eq(summing), s_with_trailer.eq(p.with_trailer), s_fresh.eq(actx.fresh),
                s_reclaim.eq(actx.reclaim), s_expire.eq(actx.expire), s_slot.eq(actx.slot), s_disp.eq(actx.disp),
            ]
        # The 128/W ≥ 2 header beats of a later frame of the same slot put its first read of these words
        # (loading R) no earlier than the edge on which S writes the last of them: the read port is
        # transparent to this write.
        m.d.comb += [sum_wr.en.eq(s_wen), sum_wr.addr.eq(s_waddr), sum_wr.data.eq(s_sum)]

        overflow = Signal(self.config.slots)
        slot_overflow = overflow.bit_select(s_slot, 1)
        saturated_beat = Signal()
        saturated_acc = Signal()
        carried_acc = Signal()
        m.d.comb += saturated_beat.eq(s_saturated.any())
        # A carried flag sets the slot's overflow and the status, but `saturations` counts local ones only.
        overflowed = (~s_fresh & slot_overflow) | saturated_acc | saturated_beat | carried_acc | s_carried
        status = Signal(32)
        m.d.comb += status.eq(Mux(s_stored, slot_overflow, overflowed))
        out_data = Signal(8 * W)
        for lane in range(lanes):
            bits = slice(32 * lane, 32 * lane + 32)
            m.d.comb += out_data[bits].eq(Mux(s_trailer[lane], lane_bytes(status),
                                              Mux(s_use_sum, s_sum[bits], s_other[bits])))
        p.share(s_valid=s_valid, s_emit=s_emit, s_last=s_last, s_user=s_user, s_end=s_end, s_bad=s_bad,
                s_first=s_first, s_keep=s_keep, s_summing=s_summing, s_with_trailer=s_with_trailer,
                s_carried=s_carried, carried_acc=carried_acc, s_partial_out=s_partial_out,
                s_reclaim=s_reclaim, s_expire=s_expire, s_disp=s_disp, slot_overflow=slot_overflow,
                saturated_beat=saturated_beat, saturated_acc=saturated_acc, overflowed=overflowed, out_data=out_data)

    def _stage_b(self, p):
        """Stage B, the output register; the counters and the slot's overflow flag, updated as each frame's
        last beat leaves S, so a stats reply reads exactly the frames before its request."""
        m, W, counters = p.m, self.data_width, p.counters
        s_valid, s_end, s_bad = p.s_valid, p.s_end, p.s_bad
        saturated_acc, saturated_beat = p.saturated_acc, p.saturated_beat
        with m.If(p.advance):
            m.d.sync += [
                p.b_valid.eq(s_valid & p.s_emit),
                self.m_axis_tdata.eq(p.out_data),
                self.m_axis_tkeep.eq(Mux(p.s_user, Const(-1, W), p.s_keep)),
                self.m_axis_tlast.eq(p.s_last), self.m_axis_tuser.eq(p.s_user),
            ]
            with m.If(s_valid):
                m.d.sync += [saturated_acc.eq(Mux(p.s_first, 0, saturated_acc) | saturated_beat),
                             p.carried_acc.eq(Mux(p.s_first, 0, p.carried_acc) | p.s_carried)]
            with m.If(s_valid & s_end):
                good = ~s_bad
                final = Mux(s_bad, Disposition.DROP_LENGTH, p.s_disp)
                index = {name: i for i, name in enumerate(COUNTERS)}
                increments = {
                    "frames_in": 1,
                    "results_emitted": good & p.s_with_trailer & ~p.s_partial_out,
                    "partials_emitted": good & p.s_with_trailer & p.s_partial_out,
                    "slots_reclaimed": good & p.s_reclaim,
                    "saturations": good & p.s_summing & (saturated_acc | saturated_beat),
                    "leases_expired": good & p.s_expire,
                }
                for disposition in Disposition:
                    counter = counters[index[disposition.name.lower()]]
                    with m.If(final == disposition):
                        m.d.sync += counter.eq(counter + 1)
                for name, increment in increments.items():
                    counter = counters[index[name]]
                    m.d.sync += counter.eq(counter + increment)
                with m.If(good & p.s_summing):
                    m.d.sync += p.slot_overflow.eq(p.overflowed)


class LeaseTicker(wiring.Component):
    """One `tick` pulse every `cycles` clock cycles: the aggregator's `lease_tick` from the core clock."""

    def __init__(self, cycles):
        if cycles < 1:
            raise ValueError(f"a lease tick lasts at least one cycle, got {cycles}")
        self.cycles = cycles
        super().__init__({"tick": Out(1)})

    def elaborate(self, platform):
        m = Module()
        count = Signal(range(self.cycles))
        m.d.comb += self.tick.eq(count == self.cycles - 1)
        m.d.sync += count.eq(Mux(self.tick, 0, count + 1))
        return m


def drive_lease_ticks(m, core, clock_hz):
    """On a board top: the core's `lease_tick` once per `LEASE_TICK_S` of its `clock_hz` clock, the unit
    `inwire serve` counts in too. A core without leases (the pass-through) is left as it is."""
    if hasattr(core, "lease_tick"):
        m.submodules.lease_ticker = ticker = LeaseTicker(round(clock_hz * LEASE_TICK_S))
        m.d.comb += core.lease_tick.eq(ticker.tick)
