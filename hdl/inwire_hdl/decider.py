"""The decider, stage I3: each frame's disposition, its slot entry's commit and the streams into the FIFOs
(docs/gateware.md, Components)."""


from amaranth.hdl import Const, Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from inwire.protocol import (
    ELEMENT_BYTES,
    ETHERNET_BYTES,
    FRAME_HEADER_BYTES,
    IP_FLAG_DF,
    IP_PROTO_UDP,
    IP_VER_IHL,
    RESULT_TTL,
    Disposition,
    Opcode,
    multicast_mac,
)

from .blocks import fold16
from .signatures import STATS_COUNT, Action, access_signature, classified_signature, queued_beat_layout


class Decider(wiring.Component):
    """I3: the disposition and action of the frame whose header ends in the beat in I3 (from C3 and the slot
    table's `found`), the answer's fields, the frame length checked beat by beat up to tlast, the slot entry
    committed at a good tlast (`access`), and the beat and context streams into the FIFOs. The input side
    moves (`classified.advance`) only when both streams are ready, so a beat is offered only then.
    """

    def __init__(self, config, data_width, beat_bits, ctx_layout, bank_words):
        self.config, self.data_width, self.beat_bits = config, data_width, beat_bits
        self.ctx_layout, self.bank_words = ctx_layout, bank_words
        # Ticks of idleness after which a slot's lease runs out (0: never): the configuration's, or another a
        # subclass or a broken aggregator (inwire_hdl.mutants) sets before elaboration.
        self.lease = config.lease
        self.header_beats = FRAME_HEADER_BYTES // data_width
        self.slot_bits = max(1, ceil_log2(config.slots))
        jobs = config.limits.jobs if config.registered else 1
        self.routes = config.limits.routes if config.registered else 0
        super().__init__({
            "classified": In(classified_signature(data_width, beat_bits, jobs, self.routes,
                                                 config.limits.children if config.registered else 0)),
            "access": In(access_signature(self.slot_bits, beat_bits)),
            "beats": Out(stream.Signature(queued_beat_layout(data_width))),
            "contexts": Out(stream.Signature(ctx_layout)),
        })
        # The decision for the frame in C3 (`action` is also the answer's): kept here so that a broken
        # decider (inwire_hdl.mutants) can use it.
        self.decision = Signal(data.StructLayout({"disp": Disposition, "action": Action, "fresh": 1, "reclaim": 1,
                                                  "expire": 1, "complete": 1}))
        # With routes, per slot: its owner's result came down from the parent (the model's `Slot.final`). Set
        # by a relay's commit, cleared by any other: a slot is claimed anew only by a commit.
        self.final = Signal(config.slots) if self.routes else None

    def final_now(self):
        """Whether the slot of the frame in C3 holds its owner's result from the parent (with routes)."""
        return self.final.bit_select(self.classified.frame.slot[:self.slot_bits], 1)

    def elaborate(self, platform):
        m = Module()
        m.d.comb += self.classified.advance.eq(self.beats.ready & self.contexts.ready)
        answer = self._answer(m)
        self.decide(m, self.access.found)
        bad = self._commit(m, answer)
        self._enqueue(m, answer, bad)
        return m

    def _answer(self, m):
        """The answer's fields. A stored output is the slot's: a result request need not repeat its fan-in,
        group, count or exponent. A version 1 or 2 frame that causes the output says where it goes: a partial
        to its `hop1` (hops moved up one level) when that is set, else the result to the group. A version 3
        frame was checked against its job's tables, so its group is its job's: a completion's result goes
        there, a stored result (a retransmission or a result request) to the member that asked alone; with a
        route to a parent (`partial_out`) the level's partial goes to the parent's endpoint instead, and a
        retransmission to a complete slot sends it there again (the model's `_answer`). Where the frame is
        dropped these fields are not used."""
        W, c3, found = self.data_width, self.classified.frame, self.access.found
        meta3 = found.entry
        ans = Signal(self.ctx_layout)
        stored = found.key_match & meta3.complete
        result_group = Mux(stored, meta3.group, c3.group)
        up = c3.partial_out
        to_source = c3.v3 & stored
        dst_port = Mux(to_source, c3.udp_sport, self.config.port)
        bitmap = Mux(found.key_match, meta3.bitmap | Mux(meta3.complete, 0, c3.members), c3.members)
        contributors = Mux(found.key_match, meta3.contributors + Mux(meta3.complete, 0, c3.member_count),
                           c3.member_count)
        carry_in = c3.partial
        if self.routes:
            # A result from the parent (`v3_result`: relayed when not dropped) goes down to the group with its
            # own members and overflow flag; once it came down, the slot answers with it, not the partial.
            relay = c3.v3_result
            up = c3.partial_out & ~relay & ~(stored & self.final_now())
            to_source = c3.v3 & stored & ~up & ~relay
            dst_port = Mux(to_source, c3.udp_sport, Mux(c3.v3 & up, c3.parent_port, self.config.port))
            bitmap = Mux(relay, c3.members, bitmap)
            contributors = Mux(relay, c3.member_count, contributors)
            carry_in = c3.partial | relay
        stats_len = FRAME_HEADER_BYTES + ELEMENT_BYTES * STATS_COUNT
        # Member sets summed into a slot are disjoint (an overlap is DROP_DUPLICATE): counts add up.
        result_fields = {
            "opcode": Mux(up, Opcode.PARTIAL, Opcode.RESULT), "fanin": Mux(stored, meta3.fanin, c3.fanin),
            "exponent": Mux(stored, meta3.exponent, c3.exponent),
            "contributors": contributors,
            "round": c3.round, "clique": c3.clique, "chunk": c3.chunk,
            "count": Mux(stored, meta3.count, c3.count), "group": result_group,
            "bitmap": bitmap,
            "hdr_slot": c3.slot_rel, "slot": c3.slot,
            "dst_mac": Mux(up | to_source, self.config.gateway_mac, multicast_mac(0) | result_group[:23]),
            "dst_ip": Mux(up, c3.hop1, Mux(to_source, c3.ip_src, result_group)),
            "dst_port": dst_port, "token": Mux(c3.v3, c3.token, 0),
            "out_len": Mux(stored, found.len_meta, c3.len_hdr),
            "out_beats": Mux(stored, found.beats_meta, c3.beats_hdr),
            "expect": Mux(up, c3.out_expect, 0), "hop1": Mux(up, c3.out_hop1, 0),
            "hop1_expect": Mux(up, c3.out_hop1_expect, 0),
        }
        stats_fields = {"opcode": Opcode.STATS_REPLY, "count": STATS_COUNT, "dst_mac": c3.eth_src,
                        "dst_ip": c3.ip_src, "dst_port": c3.udp_sport, "out_len": stats_len,
                        "out_beats": (stats_len + W - 1) >> ceil_log2(W)}
        m.d.comb += [ans.rbank.eq(meta3.cur), ans.sender.eq(c3.sender), ans.job.eq(c3.job), ans.v1.eq(c3.v1),
                     ans.v3.eq(c3.v3), ans.carry_in.eq(carry_in)]
        for name, value in result_fields.items():
            m.d.comb += getattr(ans, name).eq(Mux(c3.stats_req, stats_fields.get(name, 0), value))
        return ans

    def decide(self, m, found):
        """The disposition of the frame whose header ends in I3 (`decision`), from C3 and `found`, the slot
        table's match (`slot_match_layout`). A subclass may decide on a match changed first
        (inwire_hdl.mutants)."""
        c3, decision = self.classified.frame, self.decision
        meta3 = found.entry
        expired = Const(0) if self.lease == 0 else found.idle >= self.lease
        complete = Mux(found.key_match, found.last_member, c3.members_full)
        summed = Mux(complete, Action.SUM_RESULT, Action.SUM_SILENT)
        m.d.comb += decision.complete.eq(complete)

        def outcome(disposition, what=Action.DROP, fresh=0, reclaim=0, expire=0):
            m.d.comb += [decision.disp.eq(disposition), decision.action.eq(what), decision.fresh.eq(fresh),
                         decision.reclaim.eq(reclaim), decision.expire.eq(expire)]

        with m.If(~c3.pre_pass):
            outcome(c3.pre_disp, c3.pre_action)
        with m.Elif(~c3.summed):
            answered = found.key_match & meta3.complete
            if self.routes:
                # Below the root a result request waits for the result from the parent (the model's
                # `_result_request`), which is taken once for the slot's complete level (`_relay`): it replaces
                # the sums (added to zero) and completes the slot as it stands.
                final = self.final_now()
                answered = answered & ~(c3.v3 & c3.partial_out & ~final)
                with m.If(c3.v3_result):
                    with m.If(~(found.key_match & meta3.complete)):
                        outcome(Disposition.DROP_NO_RESULT)
                    with m.Elif(~found.shape_match):
                        outcome(Disposition.DROP_MISMATCH)
                    with m.Elif(final):
                        outcome(Disposition.DROP_DUPLICATE)
                    with m.Else():
                        outcome(Disposition.RELAYED, Action.SUM_RESULT, fresh=1)
                        m.d.comb += decision.complete.eq(1)
                with m.Elif(answered):
                    outcome(Disposition.ANSWERED, Action.STORED)
                with m.Else():
                    outcome(Disposition.DROP_NO_RESULT)
            else:
                with m.If(answered):
                    outcome(Disposition.ANSWERED, Action.STORED)
                with m.Else():
                    outcome(Disposition.DROP_NO_RESULT)
        with m.Elif(found.key_match):
            with m.If(~found.shape_match):
                outcome(Disposition.DROP_MISMATCH)
            with m.Elif(meta3.complete):
                outcome(Disposition.ANSWERED, Action.STORED)
            with m.Elif(found.duplicate):
                outcome(Disposition.DROP_DUPLICATE)
            with m.Else():
                outcome(Disposition.ACCUMULATED, summed)
        with m.Elif(~found.meta_valid):
            outcome(Disposition.ACCUMULATED, summed, fresh=1)
        with m.Elif(found.older & ~expired):
            # A delayed copy never evicts its job's newer owner, finished or not, while the lease runs.
            outcome(Disposition.DROP_STALE)
        with m.Elif(meta3.complete):
            outcome(Disposition.ACCUMULATED, summed, fresh=1)
        with m.Elif(found.newer):
            outcome(Disposition.ACCUMULATED, summed, fresh=1, reclaim=1)
        with m.Elif(expired):
            outcome(Disposition.ACCUMULATED, summed, fresh=1, expire=1)
        with m.Else():
            outcome(Disposition.DROP_COLLISION)

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
        if self.routes:
            with m.If(access.commit):
                m.d.sync += self.final.bit_select(ans.slot[:self.slot_bits], 1).eq(c3.v3_result)
        m.d.comb += [
            access.commit.eq(fire & i3.last & ~i3.hdr_end & ~bad & f_sum),
            access.commit_slot.eq(ans.slot),
            *(getattr(entry, name).eq(value) for name, value in self.committed_entry(ans).items()),
        ]
        return bad

    def committed_entry(self, ans):
        """The slot entry a contribution or partial commits at its good tlast: {`META` field: its value}, from
        the answer's fields `ans`, C3 and the decision. A subclass may commit some otherwise
        (inwire_hdl.mutants)."""
        c3, decision = self.classified.frame, self.decision
        entry = {name: getattr(ans, name) for name in (
            "job", "round", "clique", "chunk", "fanin", "group", "count", "exponent", "bitmap", "contributors")}
        # A relayed result leaves the lease as it was (the model's `_relay` does not stamp the slot).
        stamp = Mux(c3.v3_result, self.access.found.entry.stamp, c3.now) if self.routes else c3.now
        return {**entry, "level": c3.level, "complete": decision.complete, "cur": ~self.access.found.entry.cur,
                "stamp": stamp}

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
