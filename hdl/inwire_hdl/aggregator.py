"""The in-line aggregator: AXI4-Stream in, AXI4-Stream out, cut-through.

Input side (one frame at a time, in order): each accepted beat is registered in stage I0 while its
bytes of the first 128 are captured into a FRAME_HEADER register. On the beat that ends the header (beat
128/W - 1, or tlast if earlier) the frame is classified combinationally against the slot table, and a
context (what to do, the result header fields) is pushed into the context FIFO. Every beat goes into the
beat FIFO tagged with `first` and `bad` (the frame length is found wrong on this beat or before). At a
good tlast a contribution commits its slot entry (bitmap, completion, which sum bank is current).

Output side: pops beats in order; a frame starts only when its context is there, which is what makes the
beat FIFO the header delay line. Stage A reads the slot's sum memory (one word per beat), adds with
saturation, writes the sum to the slot's other bank, and builds the output beat (forwarded bytes, the
rewritten header, sums, stored sums or counters, the status trailer); stage B is the output register.
Frames that need more output beats than input beats (trailer beat, answers to 128-byte requests) insert
beats at stage A while the input keeps filling the beat FIFO. Counters and the per-slot overflow flags
are updated as each frame's last beat leaves stage A, so a stats reply reads exactly the frames before
its request.
"""

import enum

from amaranth.hdl import Array, Cat, Const, Module, Mux, Signal, Value, unsigned
from amaranth.lib import data, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from inwire.model import AggregatorConfig
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

from .blocks import IPv4Checksum, SaturatingAdder, lane_bytes, popcount
from .layout import FRAME_HEADER, field_bytes, field_shape, field_value

DATA_WIDTHS = (8, 16, 32, 64)
STATS_COUNT = len(COUNTERS)


class Action(enum.IntEnum):
    DROP = 0
    FORWARD = 1
    SUM_SILENT = 2
    SUM_RESULT = 3
    STORED = 4
    STATS = 5


def context_layout(slot_bits, beat_bits):
    return data.StructLayout({
        "action": 3, "disp": 5, "slot": slot_bits, "rbank": 1, "fresh": 1, "reclaim": 1,
        "opcode": 8, "sender": 8, "fanin": 8, "exponent": 8, "contributors": 8,
        "job": 32, "round": 32, "clique": 16, "chunk": 32, "count": 16, "group": 32, "bitmap": 64,
        "hdr_slot": 16, "dst_mac": 48, "dst_ip": 32, "dst_port": 16, "out_len": 16, "out_beats": beat_bits,
    })


def header_register(name):
    """A 128-byte header as a FRAME_HEADER view over a plain signal: a signal declared with the layout
    would carry one named wire per header byte into the Verilog, which slows Icarus down a lot."""
    return data.View(FRAME_HEADER, Signal(FRAME_HEADER.size, name=name))


META = data.StructLayout({
    "job": 32, "round": 32, "clique": 16, "chunk": 32,
    "fanin": 8, "group": 32, "count": 16, "exponent": 8,
    "bitmap": 64, "complete": 1, "cur": 1,
})


class Aggregator(wiring.Component):
    """Aggregator gateware for `config` (an `inwire.model.AggregatorConfig`), `data_width` bytes per beat.

    Ports: `s_axis_t{data,keep,last,valid,ready}` in, `m_axis_t{data,keep,last,valid,ready,user}` out
    (tuser on a last beat marks an aborted frame), and one 32-bit `stat_<name>` per `COUNTERS` name.
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
            "m_axis_tvalid": Out(1), "m_axis_tready": In(1), "m_axis_tuser": Out(1),
        }
        ports.update({f"stat_{name}": Out(32) for name in COUNTERS})
        super().__init__(ports)

    def elaborate(self, platform):
        m = Module()
        cfg, W, H = self.config, self.data_width, self.header_beats
        ctx_layout = context_layout(self.slot_bits, self.beat_bits)
        beat_layout = data.StructLayout({"data": 8 * W, "keep": W, "last": 1, "first": 1, "bad": 1})

        m.submodules.beats = beats = SyncFIFOBuffered(width=beat_layout.size, depth=self.buffer_beats)
        m.submodules.contexts = contexts = SyncFIFOBuffered(width=ctx_layout.size, depth=self.buffer_beats)
        m.submodules.meta = meta_mem = Memory(shape=META, depth=cfg.slots, init=[])
        meta_rd = meta_mem.read_port(domain="comb")
        meta_wr = meta_mem.write_port()
        m.submodules.sums = sum_mem = Memory(shape=unsigned(8 * W), depth=cfg.slots * 2 * self.bank_words,
                                             init=[])
        sum_wr = sum_mem.write_port()
        sum_rd = sum_mem.read_port(transparent_for=(sum_wr,))
        m.submodules.ip_check = ip_check = IPv4Checksum()
        m.submodules.ip_make = ip_make = IPv4Checksum()
        m.submodules.adder = adder = SaturatingAdder(self.lanes)

        counters = [Signal(32, name=f"count_{name}") for name in COUNTERS]
        for name, counter in zip(COUNTERS, counters, strict=True):
            m.d.comb += getattr(self, f"stat_{name}").eq(counter)

        # ---- input side -------------------------------------------------------------------------
        i0_valid = Signal()
        i0_data, i0_keep, i0_last = Signal(8 * W), Signal(W), Signal()
        i0_idx = Signal(self.beat_bits)
        in_idx = Signal(self.beat_bits)
        hdr = header_register("hdr")

        i0_fire = Signal()
        m.d.comb += [
            i0_fire.eq(i0_valid & beats.w_rdy & contexts.w_rdy),
            self.s_axis_tready.eq(~i0_valid | i0_fire),
        ]
        accept = self.s_axis_tvalid & self.s_axis_tready
        with m.If(accept):
            m.d.sync += [
                i0_valid.eq(1), i0_data.eq(self.s_axis_tdata), i0_keep.eq(self.s_axis_tkeep),
                i0_last.eq(self.s_axis_tlast), i0_idx.eq(in_idx),
                in_idx.eq(Mux(self.s_axis_tlast, 0, Mux(in_idx.all(), in_idx, in_idx + 1))),
            ]
            with m.If(in_idx < H):
                m.d.sync += hdr.as_value().word_select(in_idx[:ceil_log2(H)], 8 * W).eq(self.s_axis_tdata)
        with m.Elif(i0_fire):
            m.d.sync += i0_valid.eq(0)

        def f(name):
            return field_value(hdr, name)

        beat_bytes = popcount(i0_keep)
        shift = ceil_log2(W)
        frame_len = (i0_idx << shift) + beat_bytes
        hdr_end = Signal()
        m.d.comb += hdr_end.eq(i0_valid & (i0_idx < H) & (i0_last | (i0_idx == H - 1)))
        m.d.comb += [ip_check.header.eq(hdr.as_value()), meta_rd.addr.eq(f("slot"))]
        meta = meta_rd.data
        slot_valid = Signal(cfg.slots)
        slot_in_range = f("slot") < cfg.slots
        meta_valid = slot_valid.bit_select(f("slot")[:self.slot_bits], 1) & slot_in_range

        opcode, count, fanin, sender = f("opcode"), f("count"), f("fanin"), f("sender")
        is_contribution = opcode == Opcode.CONTRIBUTION
        expected_len = FRAME_HEADER_BYTES + Mux(is_contribution, count * ELEMENT_BYTES, 0)
        lengths_ok = ((f("ip_len") == expected_len - ETHERNET_BYTES)
                      & (f("udp_len") == expected_len - ETHERNET_BYTES - IPV4_BYTES))
        sender_bit = Signal(64)
        m.d.comb += sender_bit.eq(Const(1, 64) << sender[:6])
        key_match = (meta_valid & (meta.job == f("job")) & (meta.round == f("round"))
                     & (meta.clique == f("clique")) & (meta.chunk == f("chunk")))
        shape_match = ((meta.fanin == fanin) & (meta.group == f("group")) & (meta.count == count)
                       & (meta.exponent == f("exponent").as_unsigned()))
        round_delta = Signal(32)
        m.d.comb += round_delta.eq(f("round") - meta.round)
        round_newer = (round_delta != 0) & ~round_delta[31]

        # The classification of the frame whose header ends in I0 (valid while hdr_end).
        disp = Signal(5)
        action = Signal(Action)
        len_pending = Signal()
        fresh, reclaim = Signal(), Signal()
        base_bitmap = Signal(64)
        stored = Signal()
        new_bitmap = Signal(64)
        contributors = Signal(8)
        complete = Signal()
        m.d.comb += [
            new_bitmap.eq(Mux(stored, meta.bitmap, base_bitmap | sender_bit)),
            contributors.eq(popcount(new_bitmap)),
            complete.eq(contributors == fanin),
        ]

        def drop(reason):
            m.d.comb += [disp.eq(reason), action.eq(Action.DROP)]

        header_short = i0_last & (frame_len < FRAME_HEADER_BYTES)
        request_len_ok = i0_last & (frame_len == FRAME_HEADER_BYTES)
        with m.If(i0_last & (frame_len < MIN_FRAME_BYTES)):
            drop(Disposition.DROP_RUNT)
        with m.Elif(~((f("eth_type") == ETHERTYPE_IPV4) & (f("ip_proto") == IP_PROTO_UDP)
                      & (f("ip_dst") == cfg.ip) & (f("udp_dport") == cfg.port))):
            m.d.comb += [disp.eq(Disposition.FORWARDED), action.eq(Action.FORWARD)]
        with m.Elif(f("ip_ver_ihl") != IP_VER_IHL):
            drop(Disposition.DROP_IP_HEADER)
        with m.Elif(f("ip_frag")[:14] != 0):
            drop(Disposition.DROP_IP_FRAGMENT)
        with m.Elif(~ip_check.valid):
            drop(Disposition.DROP_IP_CHECKSUM)
        with m.Elif(header_short):
            drop(Disposition.DROP_LENGTH)
        with m.Elif((f("magic") != MAGIC) | (f("version") != VERSION)):
            drop(Disposition.DROP_VERSION)
        with m.Elif(~is_contribution & (opcode != Opcode.RESULT_REQUEST) & (opcode != Opcode.STATS_REQUEST)):
            drop(Disposition.DROP_OPCODE)
        with m.Elif(~lengths_ok | (~is_contribution & ~request_len_ok)):
            drop(Disposition.DROP_LENGTH)
        with m.Else():
            # From here on a contribution's frame length is still to be checked beat by beat.
            m.d.comb += len_pending.eq(is_contribution)
            with m.If(opcode == Opcode.STATS_REQUEST):
                m.d.comb += [disp.eq(Disposition.ANSWERED), action.eq(Action.STATS)]
            with m.Elif((fanin == 0) | (fanin > cfg.max_fanin)):
                drop(Disposition.DROP_FANIN)
            with m.Elif(sender >= fanin):
                drop(Disposition.DROP_SENDER)
            with m.Elif((count == 0) | (count > cfg.max_elements)):
                drop(Disposition.DROP_COUNT)
            with m.Elif((f("group") & MULTICAST_MASK) != MULTICAST_PREFIX):
                drop(Disposition.DROP_GROUP)
            with m.Elif(~slot_in_range):
                drop(Disposition.DROP_SLOT)
            with m.Elif(~is_contribution):
                with m.If(key_match & meta.complete):
                    m.d.comb += [disp.eq(Disposition.ANSWERED), action.eq(Action.STORED), stored.eq(1)]
                with m.Else():
                    drop(Disposition.DROP_NO_RESULT)
            with m.Elif(key_match):
                with m.If(~shape_match):
                    drop(Disposition.DROP_MISMATCH)
                with m.Elif(meta.complete):
                    m.d.comb += [disp.eq(Disposition.ANSWERED), action.eq(Action.STORED), stored.eq(1)]
                with m.Elif((meta.bitmap & sender_bit) != 0):
                    drop(Disposition.DROP_DUPLICATE)
                with m.Else():
                    m.d.comb += base_bitmap.eq(meta.bitmap)
                    m.d.comb += [disp.eq(Disposition.ACCUMULATED),
                                 action.eq(Mux(complete, Action.SUM_RESULT, Action.SUM_SILENT))]
            with m.Elif(~meta_valid | meta.complete):
                m.d.comb += [fresh.eq(1), disp.eq(Disposition.ACCUMULATED),
                             action.eq(Mux(complete, Action.SUM_RESULT, Action.SUM_SILENT))]
            with m.Elif((f("job") == meta.job) & round_newer):
                m.d.comb += [fresh.eq(1), reclaim.eq(1), disp.eq(Disposition.ACCUMULATED),
                             action.eq(Mux(complete, Action.SUM_RESULT, Action.SUM_SILENT))]
            with m.Else():
                drop(Disposition.DROP_COLLISION)

        # Frame length checks of a contribution, on every beat from the header's end to tlast.
        expected_last = Signal(self.beat_bits)
        expected_tail = Signal(range(W + 1))
        m.d.comb += [
            expected_last.eq((expected_len - 1) >> shift),
            expected_tail.eq(((expected_len - 1) & (W - 1)) + 1),
        ]
        f_len_pending, f_bad = Signal(), Signal()
        f_action = Signal(Action)
        f_last, f_tail = Signal(self.beat_bits), Signal(range(W + 1))
        f_bitmap, f_complete, f_wbank = Signal(64), Signal(), Signal()
        pending = Mux(hdr_end, len_pending, f_len_pending)
        last_at = Mux(hdr_end, expected_last, f_last)
        tail_at = Mux(hdr_end, expected_tail, f_tail)
        bad_before = ~hdr_end & f_bad
        bad = Signal()
        m.d.comb += bad.eq(bad_before | (pending & (
            ((i0_idx == last_at) & (~i0_last | (beat_bytes != tail_at))) | (i0_last & (i0_idx < last_at)))))

        with m.If(i0_fire):
            m.d.sync += f_bad.eq(bad & ~i0_last)
            with m.If(hdr_end):
                m.d.sync += [f_len_pending.eq(len_pending), f_action.eq(action), f_last.eq(expected_last),
                             f_tail.eq(expected_tail), f_bitmap.eq(new_bitmap), f_complete.eq(complete),
                             f_wbank.eq(~meta.cur)]
        commit_action = Mux(hdr_end, action, f_action)
        commit = i0_fire & i0_last & ~bad & ((commit_action == Action.SUM_SILENT)
                                             | (commit_action == Action.SUM_RESULT))
        with m.If(commit):
            m.d.sync += slot_valid.bit_select(f("slot")[:self.slot_bits], 1).eq(1)
        m.d.comb += [
            meta_wr.en.eq(commit),
            meta_wr.addr.eq(f("slot")),
            meta_wr.data.job.eq(f("job")), meta_wr.data.round.eq(f("round")),
            meta_wr.data.clique.eq(f("clique")), meta_wr.data.chunk.eq(f("chunk")),
            meta_wr.data.fanin.eq(fanin), meta_wr.data.group.eq(f("group")), meta_wr.data.count.eq(count),
            meta_wr.data.exponent.eq(f("exponent")),
            meta_wr.data.bitmap.eq(Mux(hdr_end, new_bitmap, f_bitmap)),
            meta_wr.data.complete.eq(Mux(hdr_end, complete, f_complete)),
            meta_wr.data.cur.eq(Mux(hdr_end, ~meta.cur, f_wbank)),
        ]

        beat_in = Signal(beat_layout)
        m.d.comb += [
            beat_in.data.eq(i0_data), beat_in.keep.eq(i0_keep), beat_in.last.eq(i0_last),
            beat_in.first.eq(i0_idx == 0), beat_in.bad.eq(bad),
            beats.w_data.eq(beat_in), beats.w_en.eq(i0_fire),
        ]

        # The context of the frame: what to do, and the fields of the header it answers with.
        ctx_in = Signal(ctx_layout)
        is_stats = action == Action.STATS
        # A stored result is the slot's: a result request need not repeat its fan-in, group, count or exponent.
        result_count = Mux(stored, meta.count, count)
        result_group = Mux(stored, meta.group, f("group"))
        result_len = FRAME_HEADER_BYTES + ELEMENT_BYTES * result_count + RESULT_TRAILER_BYTES
        stats_len = FRAME_HEADER_BYTES + ELEMENT_BYTES * STATS_COUNT
        out_len = Mux(is_stats, stats_len, result_len)
        result_fields = {
            "opcode": Opcode.RESULT, "fanin": Mux(stored, meta.fanin, fanin),
            "exponent": Mux(stored, meta.exponent, f("exponent").as_unsigned()), "contributors": contributors,
            "round": f("round"), "clique": f("clique"), "chunk": f("chunk"), "count": result_count,
            "group": result_group, "bitmap": new_bitmap, "hdr_slot": f("slot"), "slot": f("slot"),
            "dst_mac": multicast_mac(0) | result_group[:23], "dst_ip": result_group, "dst_port": cfg.port,
        }
        stats_fields = {"opcode": Opcode.STATS_REPLY, "count": STATS_COUNT, "dst_mac": f("eth_src"),
                        "dst_ip": f("ip_src"), "dst_port": f("udp_sport")}
        for name, value in result_fields.items():
            m.d.comb += getattr(ctx_in, name).eq(Mux(is_stats, stats_fields.get(name, 0), value))
        m.d.comb += [
            ctx_in.action.eq(action), ctx_in.disp.eq(disp), ctx_in.rbank.eq(meta.cur),
            ctx_in.fresh.eq(fresh), ctx_in.reclaim.eq(reclaim), ctx_in.sender.eq(sender),
            ctx_in.job.eq(f("job")), ctx_in.out_len.eq(out_len),
            ctx_in.out_beats.eq((out_len + W - 1) >> shift),
            contexts.w_data.eq(ctx_in), contexts.w_en.eq(i0_fire & hdr_end),
        ]

        # ---- output side ------------------------------------------------------------------------
        advance = Signal()
        b_valid = Signal()
        m.d.comb += [advance.eq(~b_valid | self.m_axis_tready), self.m_axis_tvalid.eq(b_valid)]

        head = Signal(beat_layout)
        m.d.comb += head.eq(beats.r_data)
        ctx = Signal(ctx_layout)
        cur = Signal(ctx_layout)
        j_next = Signal(self.beat_bits)
        in_done = Signal(init=1)
        aborted = Signal()

        def answers(context):
            return ((context.action == Action.SUM_RESULT) | (context.action == Action.STORED)
                    | (context.action == Action.STATS))

        a_valid, a_popped, a_emit, a_last, a_user, a_end, a_bad = (Signal(name=f"a_{n}") for n in (
            "valid", "popped", "emit", "last", "user", "end", "bad"))
        a_j = Signal(self.beat_bits)
        a_data, a_keep = Signal(8 * W), Signal(W)

        extend = Signal()
        m.d.comb += [
            extend.eq(in_done & ~aborted & answers(ctx) & (j_next < ctx.out_beats)),
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
        was_aborted = ~head.first & aborted
        in_window = load_j < cur.out_beats
        more_after = answers(cur) & ~head.bad & ~was_aborted & (load_j + 1 < cur.out_beats)

        with m.If(advance):
            m.d.sync += [a_valid.eq(0), a_popped.eq(0)]
            with m.If(extend):
                m.d.sync += [
                    a_valid.eq(1), a_j.eq(j_next), a_emit.eq(1), a_user.eq(0), a_bad.eq(0),
                    a_last.eq(j_next == ctx.out_beats - 1), a_end.eq(j_next == ctx.out_beats - 1),
                    a_data.eq(0), a_keep.eq(0), j_next.eq(j_next + 1),
                ]
            with m.Elif(can_pop):
                m.d.sync += [
                    a_valid.eq(1), a_popped.eq(1), a_j.eq(load_j), a_data.eq(head.data), a_keep.eq(head.keep),
                    a_bad.eq(head.bad), a_end.eq(head.last & ~more_after), a_user.eq(0),
                    j_next.eq(Mux(load_j.all(), load_j, load_j + 1)), in_done.eq(head.last),
                ]
                with m.If(head.first):
                    m.d.sync += [ctx.eq(contexts.r_data), aborted.eq(0)]
                with m.If(cur.action == Action.FORWARD):
                    m.d.sync += [a_emit.eq(1), a_last.eq(head.last)]
                with m.Elif(answers(cur)):
                    m.d.sync += a_emit.eq(~was_aborted & in_window)
                    with m.If(head.bad):
                        m.d.sync += [a_last.eq(1), a_user.eq(1)]
                        with m.If(~was_aborted & in_window):
                            m.d.sync += aborted.eq(1)
                    with m.Else():
                        m.d.sync += a_last.eq(load_j == cur.out_beats - 1)
                with m.Else():
                    m.d.sync += a_emit.eq(0)

        bank_base = (cur.slot * 2 + cur.rbank) * self.bank_words
        m.d.comb += [
            sum_rd.en.eq(advance),
            sum_rd.addr.eq(bank_base + load_j - H),
        ]

        # Stage A: the output beat.
        payload_beat = a_j - H
        is_payload = a_j >= H
        summing = (ctx.action == Action.SUM_RESULT) | (ctx.action == Action.SUM_SILENT)
        with_trailer = (ctx.action == Action.SUM_RESULT) | (ctx.action == Action.STORED)
        m.d.comb += [adder.a.eq(sum_rd.data), adder.b.eq(a_data), adder.base_zero.eq(ctx.fresh)]
        m.d.comb += [
            sum_wr.en.eq(advance & a_valid & a_popped & summing & is_payload
                         & (payload_beat * self.lanes < ctx.count)),
            sum_wr.addr.eq((ctx.slot * 2 + ~ctx.rbank) * self.bank_words + payload_beat),
            sum_wr.data.eq(adder.sum),
        ]
        overflow = Signal(cfg.slots)
        slot_overflow = overflow.bit_select(ctx.slot, 1)
        saturated_beat = Signal()
        saturated_acc = Signal()
        lane_elements = [payload_beat * self.lanes + lane for lane in range(self.lanes)]
        m.d.comb += saturated_beat.eq(a_popped & summing & is_payload & Cat(*(
            adder.saturated[lane] & (element < ctx.count) for lane, element in enumerate(lane_elements))).any())
        overflowed = (~ctx.fresh & slot_overflow) | saturated_acc | saturated_beat
        status = Signal(32)
        m.d.comb += status.eq(Mux(ctx.action == Action.STORED, slot_overflow, overflowed))
        counter_array = Array(counters)

        rh = header_register("result_header")
        header_values = {
            "eth_dst": ctx.dst_mac, "eth_src": cfg.mac, "eth_type": ETHERTYPE_IPV4,
            "ip_ver_ihl": IP_VER_IHL, "ip_len": ctx.out_len - ETHERNET_BYTES, "ip_frag": IP_FLAG_DF,
            "ip_ttl": RESULT_TTL, "ip_proto": IP_PROTO_UDP, "ip_csum": ip_make.checksum,
            "ip_src": cfg.ip, "ip_dst": ctx.dst_ip, "udp_sport": cfg.port, "udp_dport": ctx.dst_port,
            "udp_len": ctx.out_len - ETHERNET_BYTES - IPV4_BYTES, "magic": MAGIC, "version": VERSION,
            "opcode": ctx.opcode, "sender": ctx.sender, "fanin": ctx.fanin, "exponent": ctx.exponent,
            "contributors": ctx.contributors, "job": ctx.job, "round": ctx.round, "clique": ctx.clique,
            "slot": ctx.hdr_slot, "chunk": ctx.chunk, "count": ctx.count, "group": ctx.group,
            "bitmap": ctx.bitmap,
        }
        unsummed = header_register("result_header_unsummed")
        for name, value in header_values.items():
            if not isinstance(value, Value):
                value = Const(value, field_shape(name))
            m.d.comb += getattr(rh, name).as_value().eq(field_bytes(value, name))
            if name != "ip_csum":
                m.d.comb += getattr(unsummed, name).as_value().eq(field_bytes(value, name))
        m.d.comb += ip_make.header.eq(unsummed.as_value())

        out_data, out_keep = Signal(8 * W), Signal(W)
        with m.If(ctx.action == Action.FORWARD):
            m.d.comb += [out_data.eq(a_data), out_keep.eq(a_keep)]
        with m.Elif(~is_payload):
            m.d.comb += [out_data.eq(rh.as_value().word_select(a_j[:ceil_log2(H)], 8 * W)),
                         out_keep.eq(Const(-1, W))]
        with m.Else():
            for lane, element in enumerate(lane_elements):
                bits = slice(32 * lane, 32 * lane + 32)
                value = Signal(32, name=f"lane{lane}")
                with m.If(summing):
                    m.d.comb += value.eq(adder.sum[bits])
                with m.Elif(ctx.action == Action.STORED):
                    m.d.comb += value.eq(sum_rd.data[bits])
                with m.Else():
                    counter = Signal(32, name=f"counter{lane}")
                    m.d.comb += [counter.eq(counter_array[element[:ceil_log2(STATS_COUNT)]]),
                                 value.eq(lane_bytes(counter))]
                trailer = with_trailer & (element == ctx.count)
                m.d.comb += [
                    out_data[bits].eq(Mux(trailer, lane_bytes(status), value)),
                    out_keep[4 * lane:4 * lane + 4].eq(Mux((element < ctx.count) | trailer, 0xF, 0)),
                ]

        with m.If(advance):
            m.d.sync += [
                b_valid.eq(a_valid & a_emit),
                self.m_axis_tdata.eq(out_data),
                self.m_axis_tkeep.eq(Mux(a_user, Const(-1, W), out_keep)),
                self.m_axis_tlast.eq(a_last), self.m_axis_tuser.eq(a_user),
            ]
            with m.If(a_valid):
                m.d.sync += saturated_acc.eq(Mux(a_j == 0, 0, saturated_acc) | saturated_beat)
            with m.If(a_valid & a_end):
                good = ~a_bad
                final = Mux(a_bad, Disposition.DROP_LENGTH, ctx.disp)
                index = {name: i for i, name in enumerate(COUNTERS)}
                increments = {
                    "frames_in": 1,
                    "results_emitted": good & with_trailer,
                    "slots_reclaimed": good & ctx.reclaim,
                    "saturations": good & summing & (saturated_acc | saturated_beat),
                }
                for disposition in Disposition:
                    counter = counters[index[disposition.name.lower()]]
                    with m.If(final == disposition):
                        m.d.sync += counter.eq(counter + 1)
                for name, increment in increments.items():
                    counter = counters[index[name]]
                    m.d.sync += counter.eq(counter + increment)
                with m.If(good & summing):
                    m.d.sync += slot_overflow.eq(overflowed)
        return m
