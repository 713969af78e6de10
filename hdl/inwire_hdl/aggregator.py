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

Components (docs/gateware.md, Components): `HeaderClassifier` (I0-I3, C1-C3) asks the `SlotTable` for the
frame's entry and hands beats and classification to the `Decider` (I3), which commits slot entries and
streams beats and contexts into the two FIFOs; the `OutputAssembler` (R, A, S, B, the sum memory and the
counters) empties them. `Aggregator` connects them.

Slot leases: a TIME_BITS-bit (16) timer counts pulses of `lease_tick`; a frame's time is the timer's value when
its header's last beat is accepted, and a contribution's commit stamps its slot entry with it. The idle
time (frame time minus stamp, modulo 2**TIME_BITS) is a subtraction in C3 and its comparison with the
lease a comparison with a constant in I3: one carry chain per stage.
"""

import enum
from types import SimpleNamespace

from amaranth.hdl import Array, Cat, Const, Module, Mux, Signal, Value, signed, unsigned
from amaranth.lib import data, stream, wiring
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
    """What the input side tells the output side about one frame: its action and disposition, and the
    answer's header fields."""
    return data.StructLayout({
        "action": Action, "disp": Disposition, "slot": slot_bits, "rbank": 1, "fresh": 1, "reclaim": 1,
        "expire": 1, "opcode": 8, "sender": 8, "fanin": 8, "exponent": 8, "contributors": 8,
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
"""One slot-table entry: the key and shape of the sum a slot holds, its members so far and its lease stamp."""

SLOT_KEY = data.StructLayout({
    "slot": 16, "slot_bad": 1, "job": 32, "round": 32, "clique": 16, "chunk": 32, "fanin": 8, "group": 32,
    "count": 16, "exponent": 8, "sender": 8, "level": 64, "members": 64, "now": TIME_BITS,
})
"""What the slot table compares a frame's entry with."""


def answers(context):
    """Whether the frame of `context` is answered: its output beats follow the context, not the input."""
    return ((context.action == Action.SUM_RESULT) | (context.action == Action.STORED)
            | (context.action == Action.STATS))


def input_beat_layout(data_width, beat_bits):
    """A beat in the input registers I0-I3; `hdr_end` marks the beat that ends its frame's header."""
    return data.StructLayout({"valid": 1, "data": 8 * data_width, "keep": data_width, "last": 1, "first": 1,
                              "hdr_end": 1, "idx": beat_bits, "bytes": range(data_width + 1)})


def queued_beat_layout(data_width):
    """A beat in the beat FIFO: `bad` when its frame's length is found wrong on it or before."""
    return data.StructLayout({"data": 8 * data_width, "keep": data_width, "last": 1, "first": 1, "bad": 1})


def frame_class_layout(data_width, beat_bits):
    """What the header classifier knows about the frame whose header ended (C1-C3): decoded flags and fields,
    partial checksums, and the first disposition, from the checks before the slot table."""
    return data.StructLayout({
        **{flag: 1 for flag in (
            "foreign", "bad_ver", "frag", "bad_magic", "summed", "partial", "v1", "partial_out",
            "level_outside", "members_full", "result_req", "stats_req",
            "lengths_bad", "fanin_bad", "sender_bad", "count_bad", "group_bad", "slot_bad",
            "runt", "header_short", "request_len_ok", "len_pending", "pre_pass", "route_bad")},
        "pre_disp": Disposition, "pre_action": Action, "csum_a": 18, "csum_b": 18, "csum_c": 17, "csum_total": 20,
        "slot": 16, "job": 32, "round": 32, "clique": 16, "chunk": 32, "fanin": 8, "group": 32,
        "count": 16, "exponent": 8, "sender": 8, "members": 64, "level": 64, "member_count": 7,
        "hop1": 32, "out_expect": 64, "out_hop1": 32, "out_hop1_expect": 64, "eth_src": 48, "ip_src": 32,
        "udp_sport": 16, "expected_last": beat_bits, "expected_tail": range(data_width + 1),
        "len_hdr": 19, "beats_hdr": beat_bits, "now": TIME_BITS,
    })


def slot_match_layout(beat_bits):
    """The slot table's answer for a frame, registered in C3's cycle: the entry (read, or forwarded from a
    commit still being written) and the frame compared with it."""
    return data.StructLayout({
        **{flag: 1 for flag in ("meta_valid", "key_match", "shape_match", "duplicate", "newer", "older",
                                "last_member")},
        "idle": TIME_BITS, "len_meta": 19, "beats_meta": beat_bits, "entry": META,
    })


def lookup_signature(slot_bits):
    """Classifier to slot table: read the entry of `addr` (C1's slot) when `read`; `load` on the edge that
    registers C2; compare `key` (C2's fields) with the entry on the edge `compare` that registers C3."""
    return wiring.Signature({"read": Out(1), "addr": Out(slot_bits), "load": Out(1), "key": Out(SLOT_KEY),
                             "compare": Out(1)})


def access_signature(slot_bits, beat_bits):
    """Slot table to decider: the slot-table match of the frame in C3 (`found`), and back the entry a
    contribution commits at its good tlast (`commit` for one cycle)."""
    return wiring.Signature({"found": Out(slot_match_layout(beat_bits)), "commit": In(1),
                             "commit_slot": In(slot_bits), "commit_entry": In(META)})


def classified_signature(data_width, beat_bits):
    """Classifier to decider: the beat in I3 and the classification of the last header that ended, in C3;
    back, `advance` moves the input registers (both FIFOs have room)."""
    return wiring.Signature({"beat": Out(input_beat_layout(data_width, beat_bits)),
                             "frame": Out(frame_class_layout(data_width, beat_bits)), "advance": In(1)})


class HeaderClassifier(wiring.Component):
    """Input side, I0-I3 and C1-C3: registers each accepted beat, captures the header from the beats entering
    I0, and classifies the frame whose header ends in a beat while that beat travels to I3. Entering I1 the
    header's decoded flags, fields and partial checksums are registered (C1); entering I2 the frame-length
    checks and the checksum total (C2), while the slot table is read (`lookup`); entering I3 the checks
    before the slot table and the first disposition (C3, `classified.frame`).
    """

    def __init__(self, config, data_width, beat_bits):
        self.config, self.data_width, self.beat_bits = config, data_width, beat_bits
        self.header_beats = FRAME_HEADER_BYTES // data_width
        self.slot_bits = max(1, ceil_log2(config.slots))
        super().__init__({
            "s_axis_tdata": In(8 * data_width), "s_axis_tkeep": In(data_width), "s_axis_tlast": In(1),
            "s_axis_tvalid": In(1), "s_axis_tready": Out(1), "lease_tick": In(1),
            "lookup": Out(lookup_signature(self.slot_bits)),
            "classified": Out(classified_signature(data_width, beat_bits)),
        })
        # Kept here, not in `elaborate`, so that a broken classifier (inwire_hdl.mutants) can override C1.
        stage = input_beat_layout(data_width, beat_bits)
        self.i0, self.i1, self.i2 = (Signal(stage, name=f"i{n}") for n in range(3))
        self.header = header_register("hdr")
        self.header_time = Signal(TIME_BITS)
        cls = frame_class_layout(data_width, beat_bits)
        self.c1, self.c2 = Signal(cls, name="c1"), Signal(cls, name="c2")

    def elaborate(self, platform):
        m = Module()
        self._input(m)
        self._classify_header(m)
        self._classify_lengths(m)
        self._classify_checks(m)
        return m

    def _input(self, m):
        """I0-I3 in lockstep, and the header register filled from the beats entering I0."""
        H, W = self.header_beats, self.data_width
        i0, i1, i2, i3 = self.i0, self.i1, self.i2, self.classified.beat
        in_idx = Signal(self.beat_bits)
        timer = Signal(TIME_BITS)
        adv = self.classified.advance
        with m.If(self.lease_tick):
            m.d.sync += timer.eq(timer + 1)
        m.d.comb += self.s_axis_tready.eq(adv)
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
                    m.d.sync += [
                        self.header.as_value().word_select(in_idx[:ceil_log2(H)], 8 * W).eq(self.s_axis_tdata),
                        self.header_time.eq(timer),
                    ]

    def _classify_header(self, m):
        """C1: everything that needs only the header."""
        cfg, W, c1 = self.config, self.data_width, self.c1
        shift = ceil_log2(W)

        def f(name):
            return field_value(self.header, name)

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
        words = ipv4_words(self.header)
        contribution_lengths_ok = ((f("ip_len") == frame_payload + (FRAME_HEADER_BYTES - ETHERNET_BYTES))
                                   & (f("udp_len") == frame_payload + (FRAME_HEADER_BYTES - ETHERNET_BYTES
                                                                       - IPV4_BYTES)))
        request_lengths_ok = ((f("ip_len") == FRAME_HEADER_BYTES - ETHERNET_BYTES)
                              & (f("udp_len") == FRAME_HEADER_BYTES - ETHERNET_BYTES - IPV4_BYTES))
        contribution_end = frame_payload + (FRAME_HEADER_BYTES - 1)
        result_len_hdr = payload_bytes + (FRAME_HEADER_BYTES + RESULT_TRAILER_BYTES)
        with m.If(self.classified.advance & self.i0.hdr_end):
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
                c1.now.eq(self.header_time),
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

    def _classify_lengths(self, m):
        """C2: the frame length so far, the checksum total, the member checks (outside the level, the whole
        level, how many); the slot table reads C1's slot on the same edge."""
        i1, c1, c2, adv = self.i1, self.c1, self.c2, self.classified.advance
        frame_len = (i1.idx << ceil_log2(self.data_width)) + i1.bytes
        with m.If(adv & i1.hdr_end):
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
            ]
        lookup = self.lookup
        m.d.comb += [lookup.read.eq(adv), lookup.addr.eq(c1.slot[:self.slot_bits]), lookup.load.eq(adv & i1.hdr_end),
                     lookup.compare.eq(adv & self.i2.hdr_end)]
        m.d.comb += [getattr(lookup.key, name).eq(getattr(c2, name)) for name in SLOT_KEY.members]

    def _classify_checks(self, m):
        """C3: the checks in the model's order up to the slot table, registered with C2."""
        c2, c3 = self.c2, self.classified.frame
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
        with m.If(self.classified.advance & self.i2.hdr_end):
            m.d.sync += [c3.eq(c2), c3.pre_disp.eq(pre_disp), c3.pre_action.eq(pre_action), c3.pre_pass.eq(pre_pass),
                         c3.len_pending.eq(len_pending)]


class SlotTable(wiring.Component):
    """The slot table: one `META` entry per slot and a valid bit. `lookup` reads the entry of the frame in C1
    and compares it with the frame's key in C2; the answer is `access.found` in C3's cycle. An entry
    committed through `access` is registered, then written (and its valid bit set) one cycle later.
    """

    def __init__(self, config, data_width, beat_bits):
        self.config, self.data_width, self.beat_bits = config, data_width, beat_bits
        self.slot_bits = max(1, ceil_log2(config.slots))
        super().__init__({"lookup": In(lookup_signature(self.slot_bits)),
                          "access": Out(access_signature(self.slot_bits, beat_bits))})

    def elaborate(self, platform):
        m = Module()
        W, lookup, access, slot_bits = self.data_width, self.lookup, self.access, self.slot_bits
        m.submodules.meta = meta_mem = Memory(shape=META, depth=self.config.slots, init=[])
        meta_wr = meta_mem.write_port()
        meta_rd = meta_mem.read_port(transparent_for=(meta_wr,))
        slot_valid = Signal(self.config.slots)
        m.d.comb += [meta_rd.en.eq(lookup.read), meta_rd.addr.eq(lookup.addr)]

        # A frame that commits an entry has its tlast at least 128/W ≥ 2 beats ahead of the next frame's
        # header end, so its commit is registered on the `load` edge or earlier and written on the next edge
        # or earlier: the transparent read port passes a write on the `load` edge through, and a write on the
        # next one (`stale`) is forwarded in `compare`.
        commit_q, stale, seen = Signal(), Signal(), Signal()
        commit_slot = Signal(slot_bits)
        commit_entry = Signal(META)
        with m.If(lookup.load):
            m.d.sync += [seen.eq(slot_valid.bit_select(lookup.addr, 1) | (commit_q & (commit_slot == lookup.addr))),
                         stale.eq(access.commit)]
        with m.If(access.commit):
            m.d.sync += [commit_slot.eq(access.commit_slot), commit_entry.eq(access.commit_entry)]
        m.d.sync += commit_q.eq(access.commit)
        with m.If(commit_q):
            m.d.sync += slot_valid.bit_select(commit_slot, 1).eq(1)
        m.d.comb += [meta_wr.en.eq(commit_q), meta_wr.addr.eq(commit_slot), meta_wr.data.eq(commit_entry)]

        key, found = lookup.key, access.found
        forward = stale & (commit_slot == key.slot[:slot_bits])
        meta_valid = (seen | forward) & ~key.slot_bad

        def compare(entry):
            """The frame against one candidate entry; both candidates are compared, then one is chosen."""
            round_delta = Signal(32)
            m.d.comb += round_delta.eq(key.round - entry.round)
            length = entry.count * ELEMENT_BYTES + (FRAME_HEADER_BYTES + RESULT_TRAILER_BYTES)
            same_job = entry.job == key.job
            # The model's `is_older`: an earlier round (serial order), or the same round and clique and an
            # earlier chunk.
            earlier_chunk = (entry.round == key.round) & (entry.clique == key.clique) & (key.chunk < entry.chunk)
            return {
                "key_match": ((entry.job == key.job) & (entry.round == key.round) & (entry.clique == key.clique)
                              & (entry.chunk == key.chunk)),
                "shape_match": ((entry.fanin == key.fanin) & (entry.group == key.group)
                                & (entry.count == key.count) & (entry.exponent == key.exponent)
                                & (entry.level == key.level)),
                "duplicate": self._overlaps(entry.bitmap, key),
                "newer": same_job & (round_delta != 0) & ~round_delta[31],
                "older": same_job & ((round_delta[31] & (round_delta[:31] != 0)) | earlier_chunk),
                "last_member": (entry.bitmap | key.members) == key.level,
                "idle": (key.now - entry.stamp)[:TIME_BITS],
                "len_meta": length,
                "beats_meta": (entry.count * ELEMENT_BYTES
                               + (FRAME_HEADER_BYTES + RESULT_TRAILER_BYTES + W - 1)) >> ceil_log2(W),
            }

        read, forwarded = compare(meta_rd.data), compare(commit_entry)
        checks = {name: Mux(forward, forwarded[name], read[name]) for name in read}
        key_match = meta_valid & checks.pop("key_match")
        with m.If(lookup.compare):
            m.d.sync += [
                found.meta_valid.eq(meta_valid), found.key_match.eq(key_match),
                *(getattr(found, name).eq(value) for name, value in checks.items()),
                found.entry.eq(Mux(forward, commit_entry, meta_rd.data)),
            ]
        return m

    @staticmethod
    def _overlaps(bitmap, key):
        """Whether a slot entry's `bitmap` already holds one of the frame's members (DROP_DUPLICATE): any
        overlap, so that a member's elements are summed at most once per slot, whichever frames carry it."""
        return (bitmap & key.members) != 0


class Decider(wiring.Component):
    """I3: the disposition and action of the frame whose header ends in the beat in I3 (from C3 and the slot
    table's `found`), the answer's fields, the frame length checked beat by beat up to tlast, the slot entry
    committed at a good tlast (`access`), and the beat and context streams into the FIFOs. The input side
    moves (`classified.advance`) only when both streams are ready, so a beat is offered only then.
    """

    def __init__(self, config, data_width, beat_bits, ctx_layout, bank_words):
        self.config, self.data_width, self.beat_bits = config, data_width, beat_bits
        self.ctx_layout, self.bank_words = ctx_layout, bank_words
        self.lease = config.lease
        self.header_beats = FRAME_HEADER_BYTES // data_width
        self.slot_bits = max(1, ceil_log2(config.slots))
        super().__init__({
            "classified": In(classified_signature(data_width, beat_bits)),
            "access": In(access_signature(self.slot_bits, beat_bits)),
            "beats": Out(stream.Signature(queued_beat_layout(data_width))),
            "contexts": Out(stream.Signature(ctx_layout)),
        })
        # The decision for the frame in C3 (`action` is also the answer's): kept here so that a broken
        # decider (inwire_hdl.mutants) can use it.
        self.decision = Signal(data.StructLayout({"disp": Disposition, "action": Action, "fresh": 1, "reclaim": 1,
                                                  "expire": 1, "complete": 1}))

    def elaborate(self, platform):
        m = Module()
        m.d.comb += self.classified.advance.eq(self.beats.ready & self.contexts.ready)
        answer = self._answer(m)
        self._decide(m, self.access.found)
        bad = self._commit(m, answer)
        self._enqueue(m, answer, bad)
        return m

    def _answer(self, m):
        """The answer's fields. A stored output is the slot's: a result request need not repeat its fan-in,
        group, count or exponent. The frame that causes the output says where it goes: a partial to its
        `hop1` (hops moved up one level) when that is set, else the result to the group. Where the frame is
        dropped these fields are not used."""
        W, c3, found = self.data_width, self.classified.frame, self.access.found
        meta3 = found.entry
        ans = Signal(self.ctx_layout)
        stored = found.key_match & meta3.complete
        result_group = Mux(stored, meta3.group, c3.group)
        up = c3.partial_out
        stats_len = FRAME_HEADER_BYTES + ELEMENT_BYTES * STATS_COUNT
        # Member sets summed into a slot are disjoint (an overlap is DROP_DUPLICATE): counts add up.
        result_fields = {
            "opcode": Mux(up, Opcode.PARTIAL, Opcode.RESULT), "fanin": Mux(stored, meta3.fanin, c3.fanin),
            "exponent": Mux(stored, meta3.exponent, c3.exponent),
            "contributors": Mux(found.key_match, meta3.contributors + Mux(meta3.complete, 0, c3.member_count),
                                c3.member_count),
            "round": c3.round, "clique": c3.clique, "chunk": c3.chunk,
            "count": Mux(stored, meta3.count, c3.count), "group": result_group,
            "bitmap": Mux(found.key_match, meta3.bitmap | Mux(meta3.complete, 0, c3.members), c3.members),
            "hdr_slot": c3.slot, "slot": c3.slot,
            "dst_mac": Mux(up, self.config.gateway_mac, multicast_mac(0) | result_group[:23]),
            "dst_ip": Mux(up, c3.hop1, result_group), "dst_port": self.config.port,
            "out_len": Mux(stored, found.len_meta, c3.len_hdr),
            "out_beats": Mux(stored, found.beats_meta, c3.beats_hdr),
            "expect": Mux(up, c3.out_expect, 0), "hop1": Mux(up, c3.out_hop1, 0),
            "hop1_expect": Mux(up, c3.out_hop1_expect, 0),
        }
        stats_fields = {"opcode": Opcode.STATS_REPLY, "count": STATS_COUNT, "dst_mac": c3.eth_src,
                        "dst_ip": c3.ip_src, "dst_port": c3.udp_sport, "out_len": stats_len,
                        "out_beats": (stats_len + W - 1) >> ceil_log2(W)}
        m.d.comb += [ans.rbank.eq(meta3.cur), ans.sender.eq(c3.sender), ans.job.eq(c3.job), ans.v1.eq(c3.v1),
                     ans.carry_in.eq(c3.partial)]
        for name, value in result_fields.items():
            m.d.comb += getattr(ans, name).eq(Mux(c3.stats_req, stats_fields.get(name, 0), value))
        return ans

    def _decide(self, m, found):
        """The disposition of the frame whose header ends in I3, from C3 and the slot table's `found`."""
        c3, decision = self.classified.frame, self.decision
        meta3 = found.entry
        expired = Const(0) if self.lease == 0 else found.idle >= self.lease
        complete = Mux(found.key_match, found.last_member, c3.members_full)
        summed = Mux(complete, Action.SUM_RESULT, Action.SUM_SILENT)
        m.d.comb += decision.complete.eq(complete)

        def decide(disposition, what=Action.DROP, fresh=0, reclaim=0, expire=0):
            m.d.comb += [decision.disp.eq(disposition), decision.action.eq(what), decision.fresh.eq(fresh),
                         decision.reclaim.eq(reclaim), decision.expire.eq(expire)]

        with m.If(~c3.pre_pass):
            decide(c3.pre_disp, c3.pre_action)
        with m.Elif(~c3.summed):
            with m.If(found.key_match & meta3.complete):
                decide(Disposition.ANSWERED, Action.STORED)
            with m.Else():
                decide(Disposition.DROP_NO_RESULT)
        with m.Elif(found.key_match):
            with m.If(~found.shape_match):
                decide(Disposition.DROP_MISMATCH)
            with m.Elif(meta3.complete):
                decide(Disposition.ANSWERED, Action.STORED)
            with m.Elif(found.duplicate):
                decide(Disposition.DROP_DUPLICATE)
            with m.Else():
                decide(Disposition.ACCUMULATED, summed)
        with m.Elif(~found.meta_valid):
            decide(Disposition.ACCUMULATED, summed, fresh=1)
        with m.Elif(found.older & ~expired):
            # A delayed copy never evicts its job's newer owner, finished or not, while the lease runs.
            decide(Disposition.DROP_STALE)
        with m.Elif(meta3.complete):
            decide(Disposition.ACCUMULATED, summed, fresh=1)
        with m.Elif(found.newer):
            decide(Disposition.ACCUMULATED, summed, fresh=1, reclaim=1)
        with m.Elif(expired):
            decide(Disposition.ACCUMULATED, summed, fresh=1, expire=1)
        with m.Else():
            decide(Disposition.DROP_COLLISION)

    def _commit(self, m, ans):
        """A contribution's or partial's frame length, checked on every beat from the header's end to tlast,
        and the slot entry it commits at a good tlast. Returns whether the beat in I3 is bad."""
        i3, c3, access, decision = self.classified.beat, self.classified.frame, self.access, self.decision
        # C3 holds the frame of the last header end that reached I3.
        fire = self.classified.advance & i3.valid
        f_bad, f_sum = Signal(), Signal()
        last_at, tail_at = c3.expected_last, c3.expected_tail
        bad = Signal()
        m.d.comb += bad.eq((~i3.hdr_end & f_bad) | (c3.len_pending & (
            ((i3.idx == last_at) & (~i3.last | (i3.bytes != tail_at))) | (i3.last & (i3.idx < last_at)))))
        with m.If(fire):
            m.d.sync += f_bad.eq(bad & ~i3.last)
            with m.If(i3.hdr_end):
                m.d.sync += f_sum.eq((decision.action == Action.SUM_SILENT) | (decision.action == Action.SUM_RESULT))
        # A summing contribution has at least one element, so its header end is never its good tlast.
        entry = access.commit_entry
        m.d.comb += [
            access.commit.eq(fire & i3.last & ~i3.hdr_end & ~bad & f_sum),
            access.commit_slot.eq(ans.slot),
            *(getattr(entry, name).eq(getattr(ans, name)) for name in (
                "job", "round", "clique", "chunk", "fanin", "group", "count", "exponent", "bitmap", "contributors")),
            entry.level.eq(c3.level), entry.complete.eq(decision.complete), entry.cur.eq(~access.found.entry.cur),
            entry.stamp.eq(c3.now),
        ]
        return bad

    def _enqueue(self, m, ans, bad):
        """I3 offers the beat, and the context of a frame whose header ends."""
        i3, decision = self.classified.beat, self.decision
        fire = self.classified.advance & i3.valid
        beat_in = self.beats.payload
        m.d.comb += [
            beat_in.data.eq(i3.data), beat_in.keep.eq(i3.keep), beat_in.last.eq(i3.last),
            beat_in.first.eq(i3.first), beat_in.bad.eq(bad), self.beats.valid.eq(fire),
        ]

        # The context is offered one cycle after the header's last beat (the output side waits for it);
        # that cycle finishes the answer's IPv4 checksum.
        ctx_q = Signal(self.ctx_layout)
        ctx_q_valid = Signal()
        csum_sum = Signal(19)
        ip = self.config.ip
        csum_base = ((IP_VER_IHL << 8) + IP_FLAG_DF + ((RESULT_TTL << 8) | IP_PROTO_UDP)
                     + (ip >> 16) + (ip & 0xFFFF) - ETHERNET_BYTES)
        with m.If(fire & i3.hdr_end):
            m.d.sync += [
                ctx_q.eq(ans), ctx_q.action.eq(decision.action), ctx_q.disp.eq(decision.disp),
                ctx_q.fresh.eq(decision.fresh), ctx_q.reclaim.eq(decision.reclaim), ctx_q.expire.eq(decision.expire),
                csum_sum.eq((ans.out_len + csum_base) + (ans.dst_ip[16:] + ans.dst_ip[:16])),
            ]
        m.d.sync += ctx_q_valid.eq((fire & i3.hdr_end) | (ctx_q_valid & ~self.contexts.ready))
        ctx_in = self.contexts.payload
        m.d.comb += [
            ctx_in.eq(ctx_q), ctx_in.ip_csum.eq(~fold16(csum_sum)),
            ctx_in.rd_first.eq((ctx_q.slot * 2 + ctx_q.rbank) * self.bank_words - self.header_beats),
            self.contexts.valid.eq(ctx_q_valid),
        ]


def output_beat_layout(data_width, beat_bits):
    """A beat in stage R or A of the output side: `j` is its place in the output frame, `popped` whether it
    came from the beat FIFO (not inserted), `end` whether it ends its frame on the output side."""
    return data.StructLayout({**{flag: 1 for flag in ("valid", "popped", "emit", "last", "user", "end", "bad")},
                              "j": beat_bits, "data": 8 * data_width, "keep": data_width})


class OutputAssembler(wiring.Component):
    """Output side: pops the beats in order; a frame starts only when its context is there. Stage R loads a
    beat (popped, or inserted where the answer is longer than its frame) and reads the slot's sum memory;
    stage A adds with saturation and prepares the beat's other sources; stage S picks per lane, adds the
    status trailer and writes the sums to the slot's other bank; stage B is the output register. Counters and
    the per-slot overflow flags are updated as each frame's last beat leaves S (`counters`, in `COUNTERS`
    order), so a stats reply reads exactly the frames before its request.
    """

    def __init__(self, config, data_width, beat_bits, ctx_layout, bank_words):
        self.config, self.data_width, self.beat_bits = config, data_width, beat_bits
        self.ctx_layout, self.bank_words = ctx_layout, bank_words
        self.header_beats = FRAME_HEADER_BYTES // data_width
        self.lanes = data_width // ELEMENT_BYTES
        self.slot_bits = max(1, ceil_log2(config.slots))
        super().__init__({
            "beats": In(stream.Signature(queued_beat_layout(data_width))),
            "contexts": In(stream.Signature(ctx_layout)),
            "m_axis_tdata": Out(8 * data_width), "m_axis_tkeep": Out(data_width), "m_axis_tlast": Out(1),
            "m_axis_tvalid": Out(1), "m_axis_tready": In(1), "m_axis_tuser": Out(1),
            "counters": Out(data.ArrayLayout(32, STATS_COUNT)),
        })

    def elaborate(self, platform):
        m = Module()
        sum_depth = self.config.slots * 2 * self.bank_words
        m.submodules.sums = sum_mem = Memory(shape=unsigned(8 * self.data_width), depth=sum_depth, init=[])
        sum_wr = sum_mem.write_port()
        sum_rd = sum_mem.read_port(transparent_for=(sum_wr,))
        m.submodules.adder = adder = SaturatingAdder(self.lanes)
        counters = [Signal(32, name=f"count_{name}") for name in COUNTERS]
        m.d.comb += [self.counters[index].eq(counter) for index, counter in enumerate(counters)]

        advance, b_valid = Signal(), Signal()
        m.d.comb += [advance.eq(~b_valid | self.m_axis_tready), self.m_axis_tvalid.eq(b_valid)]
        r, ctx = self._stage_r(m, advance, sum_rd)
        a = self._stage_a(m, advance, r, ctx, sum_rd, adder)
        sources = self._lane_sources(m, a, self._result_header(m, a.ctx), counters)
        s = self._stage_s(m, advance, a, adder, sources, sum_wr)
        self._stage_b(m, advance, b_valid, s, counters)
        return m

    def _stage_r(self, m, advance, sum_rd):
        """Stage R loads a beat, popped or inserted, and reads its word of the sum memory. Returns R and the
        context of the frame R's beat belongs to."""
        beats, contexts = self.beats, self.contexts
        head = beats.payload
        ctx = Signal(self.ctx_layout)
        cur = Signal(self.ctx_layout)
        j_next = Signal(self.beat_bits)
        in_done = Signal(init=1)
        aborted = Signal()
        r = Signal(output_beat_layout(self.data_width, self.beat_bits), name="r")

        # `remaining` is ctx.out_beats - j_next (stuck once negative); `j_lt` and `j1_lt` are registered
        # `j_next < ctx.out_beats` and `j_next + 1 < ctx.out_beats`, which keeps adders and comparators
        # out of the beat-loading decision.
        remaining = Signal(signed(self.beat_bits + 2))
        j_lt, j1_lt = Signal(), Signal()
        first_ctx = contexts.payload
        # The sum memory address of beat j_next of the frame in ctx, kept alongside j_next; a frame's
        # first beat reads at `rd_first`, computed with its context.
        rd_addr = Signal.like(sum_rd.addr)
        extend = Signal()
        m.d.comb += [
            extend.eq(in_done & ~aborted & answers(ctx) & j_lt),
            cur.eq(Mux(~extend & head.first, first_ctx.as_value(), ctx.as_value())),
        ]
        can_pop = beats.valid & (~head.first | contexts.valid)
        pop = advance & ~extend & can_pop
        load_j = Signal(self.beat_bits)
        m.d.comb += [
            load_j.eq(Mux(extend, j_next, Mux(head.first, 0, j_next))),
            beats.ready.eq(pop),
            contexts.ready.eq(pop & head.first),
        ]

        first_beats = first_ctx.out_beats
        was_aborted = ~head.first & aborted
        in_window = Mux(head.first, first_beats > 0, j_lt)
        more_after = answers(cur) & ~head.bad & ~was_aborted & Mux(head.first, first_beats > 1, j1_lt)
        step = [remaining.eq(Mux(remaining < 0, remaining, remaining - 1)), j_lt.eq(j1_lt), j1_lt.eq(remaining > 2),
                rd_addr.eq(rd_addr + 1)]

        with m.If(advance):
            m.d.sync += [r.valid.eq(0), r.popped.eq(0)]
            with m.If(extend):
                m.d.sync += [
                    r.valid.eq(1), r.j.eq(j_next), r.emit.eq(1), r.user.eq(0), r.bad.eq(0),
                    r.last.eq(j_lt & ~j1_lt), r.end.eq(j_lt & ~j1_lt),
                    r.data.eq(0), r.keep.eq(0), j_next.eq(j_next + 1), *step,
                ]
            with m.Elif(can_pop):
                m.d.sync += [
                    r.valid.eq(1), r.popped.eq(1), r.j.eq(load_j), r.data.eq(head.data),
                    r.keep.eq(head.keep), r.bad.eq(head.bad), r.end.eq(head.last & ~more_after),
                    r.user.eq(0), j_next.eq(Mux(load_j.all(), load_j, load_j + 1)), in_done.eq(head.last),
                ]
                with m.If(head.first):
                    m.d.sync += [ctx.eq(first_ctx), aborted.eq(0), remaining.eq(first_beats - 1),
                                 j_lt.eq(first_beats > 1), j1_lt.eq(first_beats > 2),
                                 rd_addr.eq(first_ctx.rd_first + 1)]
                with m.Else():
                    m.d.sync += step
                with m.If(cur.action == Action.FORWARD):
                    m.d.sync += [r.emit.eq(1), r.last.eq(head.last)]
                with m.Elif(answers(cur)):
                    m.d.sync += r.emit.eq(~was_aborted & in_window)
                    with m.If(head.bad):
                        m.d.sync += [r.last.eq(1), r.user.eq(1)]
                        with m.If(~was_aborted & in_window):
                            m.d.sync += aborted.eq(1)
                    with m.Else():
                        m.d.sync += r.last.eq(Mux(head.first, first_beats == 1, j_lt & ~j1_lt))
                with m.Else():
                    m.d.sync += r.emit.eq(0)

        m.d.comb += [
            sum_rd.en.eq(advance),
            sum_rd.addr.eq(Mux(~extend & head.first, first_ctx.rd_first, rd_addr)),
        ]
        return r, ctx

    def _stage_a(self, m, advance, r, ctx, sum_rd, adder):
        """Stage A: the beat loaded by R, its word of the sum memory and its frame's context, registered
        (the block RAM's clock-to-output stays out of the adder's path); the adder's inputs."""
        a = Signal(data.StructLayout({"beat": output_beat_layout(self.data_width, self.beat_bits),
                                      "mem": 8 * self.data_width, "ctx": self.ctx_layout}), name="a")
        with m.If(advance):
            m.d.sync += [a.beat.eq(r), a.mem.eq(sum_rd.data), a.ctx.eq(ctx)]
        m.d.comb += [adder.a.eq(a.mem), adder.b.eq(a.beat.data), adder.base_zero.eq(a.ctx.fresh)]
        return a

    def _result_header(self, m, actx):
        """The header of an answer, as a register-sized value stage A picks its words from."""
        cfg = self.config
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
        return rh

    def _lane_sources(self, m, a, result_header, counters):
        """Stage A's sources other than the adder, per lane: forwarded bytes, a word of the rewritten header,
        stored sums or counters; and which lanes hold elements or the status trailer, and where a partial's
        own trailer carries a set overflow flag."""
        W, H, lanes, actx, beat = self.data_width, self.header_beats, self.lanes, a.ctx, a.beat
        payload_beat = beat.j - H
        lane_elements = [payload_beat * lanes + lane for lane in range(lanes)]
        # Lane k of a stats reply only ever carries counters k, k + lanes, ...: one small multiplexer each.
        lane_counters = [Array(counters[lane::lanes]) for lane in range(lanes)]
        stats_beat = payload_beat[:max(1, ceil_log2(-(-STATS_COUNT // lanes)))]
        sources = Signal(data.StructLayout({"other": 8 * W, "keep": W, "trailer": lanes, "counted": lanes,
                                            "carried": lanes}), name="sources")
        with_trailer = (actx.action == Action.SUM_RESULT) | (actx.action == Action.STORED)
        with m.If(actx.action == Action.FORWARD):
            m.d.comb += [sources.other.eq(beat.data), sources.keep.eq(beat.keep)]
        with m.Elif(beat.j < H):
            m.d.comb += [sources.other.eq(result_header.as_value().word_select(beat.j[:ceil_log2(H)], 8 * W)),
                         sources.keep.eq(Const(-1, W))]
        with m.Else():
            for lane, element in enumerate(lane_elements):
                bits = slice(32 * lane, 32 * lane + 32)
                with m.If(actx.action == Action.STORED):
                    m.d.comb += sources.other[bits].eq(a.mem[bits])
                with m.Else():
                    counter = Signal(32, name=f"counter{lane}")
                    m.d.comb += [counter.eq(lane_counters[lane][stats_beat]),
                                 sources.other[bits].eq(lane_bytes(counter))]
                at_trailer = element == actx.count
                trailer = with_trailer & at_trailer
                m.d.comb += [
                    sources.trailer[lane].eq(trailer),
                    # A partial's own trailer sits where the answer's goes: bit 0 of its status word (the
                    # lane's last byte) is a level below's overflow flag. It is never counted as an element.
                    sources.carried[lane].eq(actx.carry_in & at_trailer & beat.data[32 * lane + 24]),
                    sources.counted[lane].eq(element < actx.count),
                    sources.keep[4 * lane:4 * lane + 4].eq(Mux((element < actx.count) | trailer, 0xF, 0)),
                ]
        return sources

    def _stage_s(self, m, advance, a, adder, sources, sum_wr):
        """Stage S: the adder's result and the other sources registered; S writes the sums back and picks
        per lane between them and the status trailer. Returns S's register and what S computes from it."""
        W, H, lanes, actx, beat = self.data_width, self.header_beats, self.lanes, a.ctx, a.beat
        payload_beat, is_payload = beat.j - H, beat.j >= H
        summing = (actx.action == Action.SUM_RESULT) | (actx.action == Action.SUM_SILENT)
        s = Signal(data.StructLayout({
            **{flag: 1 for flag in ("valid", "emit", "last", "user", "end", "bad", "first", "wen", "use_sum",
                                    "stored", "summing", "with_trailer", "fresh", "reclaim", "expire",
                                    "carried", "partial_out")},
            "sum": 8 * W, "other": 8 * W, "keep": W, "saturated": lanes, "trailer": lanes,
            "waddr": len(sum_wr.addr), "slot": self.slot_bits, "disp": Disposition,
        }), name="s")
        with m.If(advance):
            m.d.sync += [
                s.valid.eq(beat.valid), s.emit.eq(beat.emit), s.last.eq(beat.last), s.user.eq(beat.user),
                s.end.eq(beat.end), s.bad.eq(beat.bad), s.first.eq(beat.j == 0), s.sum.eq(adder.sum),
                s.other.eq(sources.other), s.keep.eq(sources.keep), s.trailer.eq(sources.trailer),
                s.saturated.eq(Mux(beat.popped & summing & is_payload, adder.saturated & sources.counted, 0)),
                s.carried.eq(beat.popped & summing & is_payload & sources.carried.any()),
                s.partial_out.eq(actx.opcode == Opcode.PARTIAL),
                s.wen.eq(beat.valid & beat.popped & summing & is_payload & (payload_beat * lanes < actx.count)),
                s.waddr.eq((actx.slot * 2 + ~actx.rbank) * self.bank_words + payload_beat),
                s.use_sum.eq(summing & is_payload), s.stored.eq(actx.action == Action.STORED),
                s.summing.eq(summing),
                s.with_trailer.eq((actx.action == Action.SUM_RESULT) | (actx.action == Action.STORED)),
                s.fresh.eq(actx.fresh), s.reclaim.eq(actx.reclaim), s.expire.eq(actx.expire), s.slot.eq(actx.slot),
                s.disp.eq(actx.disp),
            ]
        # The 128/W ≥ 2 header beats of a later frame of the same slot put its first read of these words
        # (loading R) no earlier than the edge on which S writes the last of them: the read port is
        # transparent to this write.
        m.d.comb += [sum_wr.en.eq(s.wen), sum_wr.addr.eq(s.waddr), sum_wr.data.eq(s.sum)]

        overflow = Signal(self.config.slots)
        done = SimpleNamespace(s=s, advance=advance, slot_overflow=overflow.bit_select(s.slot, 1),
                               saturated_beat=Signal(), saturated_acc=Signal(), carried_acc=Signal(),
                               overflowed=Signal(), out_data=Signal(8 * W))
        m.d.comb += done.saturated_beat.eq(s.saturated.any())
        # A carried flag sets the slot's overflow and the status, but `saturations` counts local ones only.
        m.d.comb += done.overflowed.eq((~s.fresh & done.slot_overflow) | done.saturated_acc | done.saturated_beat
                                       | done.carried_acc | s.carried)
        status = Signal(32)
        m.d.comb += status.eq(Mux(s.stored, done.slot_overflow, done.overflowed))
        for lane in range(lanes):
            bits = slice(32 * lane, 32 * lane + 32)
            m.d.comb += done.out_data[bits].eq(Mux(s.trailer[lane], lane_bytes(status),
                                                   Mux(s.use_sum, s.sum[bits], s.other[bits])))
        return done

    def _stage_b(self, m, advance, b_valid, done, counters):
        """Stage B, the output register; the counters and the slot's overflow flag, updated as each frame's
        last beat leaves S, so a stats reply reads exactly the frames before its request."""
        W, s = self.data_width, done.s
        with m.If(advance):
            m.d.sync += [
                b_valid.eq(s.valid & s.emit),
                self.m_axis_tdata.eq(done.out_data),
                self.m_axis_tkeep.eq(Mux(s.user, Const(-1, W), s.keep)),
                self.m_axis_tlast.eq(s.last), self.m_axis_tuser.eq(s.user),
            ]
            with m.If(s.valid):
                m.d.sync += [done.saturated_acc.eq(Mux(s.first, 0, done.saturated_acc) | done.saturated_beat),
                             done.carried_acc.eq(Mux(s.first, 0, done.carried_acc) | s.carried)]
            with m.If(s.valid & s.end):
                good = ~s.bad
                final = Mux(s.bad, Disposition.DROP_LENGTH, s.disp)
                index = {name: i for i, name in enumerate(COUNTERS)}
                increments = {
                    "frames_in": 1,
                    "results_emitted": good & s.with_trailer & ~s.partial_out,
                    "partials_emitted": good & s.with_trailer & s.partial_out,
                    "slots_reclaimed": good & s.reclaim,
                    "saturations": good & s.summing & (done.saturated_acc | done.saturated_beat),
                    "leases_expired": good & s.expire,
                }
                for disposition in Disposition:
                    counter = counters[index[disposition.name.lower()]]
                    with m.If(final == disposition):
                        m.d.sync += counter.eq(counter + 1)
                for name, increment in increments.items():
                    counter = counters[index[name]]
                    m.d.sync += counter.eq(counter + increment)
                with m.If(good & s.summing):
                    m.d.sync += done.slot_overflow.eq(done.overflowed)


class Aggregator(wiring.Component):
    """Aggregator gateware for `config` (an `inwire.model.AggregatorConfig`), `data_width` bytes per beat.

    Ports: `s_axis_t{data,keep,last,valid,ready}` in, `m_axis_t{data,keep,last,valid,ready,user}` out
    (tuser on a last beat marks an aborted frame), one 32-bit `stat_<name>` per `COUNTERS` name, and
    `lease_tick`, one pulse per tick of the lease timer (`LeaseTicker` makes them from the clock).
    `buffer_beats` is the depth of the beat FIFO (at least the header's beats plus slack).

    Inside: `classifier` (HeaderClassifier) → `decider` (Decider), with the `slot_table` (SlotTable) beside
    them, feed the beat and context FIFOs; the `assembler` (OutputAssembler) empties them. A subclass may
    build any of them from a subclass of its own (the `*_type` attributes; inwire_hdl.mutants does).
    """

    classifier_type = HeaderClassifier
    slot_table_type = SlotTable
    decider_type = Decider
    assembler_type = OutputAssembler

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
        sum_depth = config.slots * 2 * self.bank_words
        self.ctx_layout = context_layout(self.slot_bits, self.beat_bits, ceil_log2(sum_depth))
        self.classifier = self.classifier_type(config, data_width, self.beat_bits)
        self.slot_table = self.slot_table_type(config, data_width, self.beat_bits)
        self.decider = self.decider_type(config, data_width, self.beat_bits, self.ctx_layout, self.bank_words)
        self.assembler = self.assembler_type(config, data_width, self.beat_bits, self.ctx_layout, self.bank_words)

    def elaborate(self, platform):
        m = Module()
        m.submodules.classifier = classifier = self.classifier
        m.submodules.slot_table = slot_table = self.slot_table
        m.submodules.decider = decider = self.decider
        m.submodules.assembler = assembler = self.assembler
        m.submodules.beats = beats = RegisteredFIFO(queued_beat_layout(self.data_width), self.buffer_beats)
        m.submodules.contexts = contexts = RegisteredFIFO(self.ctx_layout, self.buffer_beats)

        m.d.comb += [
            classifier.s_axis_tdata.eq(self.s_axis_tdata), classifier.s_axis_tkeep.eq(self.s_axis_tkeep),
            classifier.s_axis_tlast.eq(self.s_axis_tlast), classifier.s_axis_tvalid.eq(self.s_axis_tvalid),
            self.s_axis_tready.eq(classifier.s_axis_tready), classifier.lease_tick.eq(self.lease_tick),
        ]
        wiring.connect(m, classifier.lookup, slot_table.lookup)
        wiring.connect(m, classifier.classified, decider.classified)
        wiring.connect(m, slot_table.access, decider.access)
        wiring.connect(m, decider.beats, beats.w_stream)
        wiring.connect(m, decider.contexts, contexts.w_stream)
        wiring.connect(m, beats.r_stream, assembler.beats)
        wiring.connect(m, contexts.r_stream, assembler.contexts)
        m.d.comb += [
            self.m_axis_tdata.eq(assembler.m_axis_tdata), self.m_axis_tkeep.eq(assembler.m_axis_tkeep),
            self.m_axis_tlast.eq(assembler.m_axis_tlast), self.m_axis_tvalid.eq(assembler.m_axis_tvalid),
            self.m_axis_tuser.eq(assembler.m_axis_tuser), assembler.m_axis_tready.eq(self.m_axis_tready),
            *(getattr(self, f"stat_{name}").eq(assembler.counters[index]) for index, name in enumerate(COUNTERS)),
        ]
        return m


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
