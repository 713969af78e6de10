"""The output assembler, stages R, A, S and B: the answers, the sums and the counters (docs/gateware.md,
Components)."""

from types import SimpleNamespace

from amaranth.hdl import Array, Const, Module, Mux, Signal, Value, signed, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from inwire.model import JOB_DISPOSITIONS
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
    JOB_VERSION,
    MAGIC,
    RESULT_TTL,
    VERSION,
    Disposition,
    Opcode,
)

from .blocks import SaturatingAdder, lane_bytes
from .layout import field_bytes, field_shape
from .signatures import STATS_COUNT, Action, answers, header_register, queued_beat_layout


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

    adder_type = SaturatingAdder
    """The lanes' saturating adder (a subclass may build another: inwire_hdl.mutants)."""

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
        m.submodules.adder = adder = self.adder_type(self.lanes)
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
            "version": Mux(actx.v1, 1, Mux(actx.v3, JOB_VERSION, VERSION)), "token": actx.token,
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
                    sources.carried[lane].eq(self.carries_flag(actx) & at_trailer & beat.data[32 * lane + 24]),
                    sources.counted[lane].eq(element < actx.count),
                    sources.keep[4 * lane:4 * lane + 4].eq(Mux((element < actx.count) | trailer, 0xF, 0)),
                ]
        return sources

    def carries_flag(self, ctx):
        """Whether the frame of context `ctx` carries an overflow flag in its trailer to pick up: a partial's
        does. A subclass may pick it up otherwise (inwire_hdl.mutants)."""
        return ctx.carry_in

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
                increments = self.counter_increments(done)
                # The job dispositions never occur without job tables, nor RELAYED without routes: their
                # counters stay 0, as the model's do for such an aggregator, and cost no logic.
                never = set(JOB_DISPOSITIONS) if not self.config.registered else {Disposition.RELAYED}
                if self.config.registered and self.config.limits.routes:
                    never = set()
                for disposition in (d for d in Disposition if d not in never):
                    counter = counters[index[disposition.name.lower()]]
                    with m.If(final == disposition):
                        m.d.sync += counter.eq(counter + 1)
                for name, increment in increments.items():
                    counter = counters[index[name]]
                    m.d.sync += counter.eq(counter + increment)
                with m.If(good & s.summing):
                    m.d.sync += done.slot_overflow.eq(done.overflowed)

    def counter_increments(self, done):
        """What a frame adds to each counter but its disposition's as its last beat leaves S: {counter name:
        increment}, from `done` (S's register `s` and the frame's flags gathered over its beats). A subclass
        may count otherwise (inwire_hdl.mutants)."""
        s = done.s
        good = ~s.bad
        return {
            "frames_in": 1,
            "results_emitted": good & s.with_trailer & ~s.partial_out,
            "partials_emitted": good & s.with_trailer & s.partial_out,
            "slots_reclaimed": good & s.reclaim,
            "saturations": good & s.summing & (done.saturated_acc | done.saturated_beat),
            "leases_expired": good & s.expire,
        }
