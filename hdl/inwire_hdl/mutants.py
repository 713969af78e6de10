"""Broken aggregators: each formal check must fail on the mutant it is meant to catch.

Most mutants wrap the real `Aggregator` and change what crosses its ports, so they need nothing from the
inside and stay valid however the inside changes. The others replace one of the aggregator's components
(`Aggregator.*_type`) with a subclass that breaks one thing through a public point of that component (a
public method or attribute, documented there), never a private stage method a rename would silently skip:
`stale_memory` builds the output assembler with a sum adder (`OutputAssembler.adder_type`) that ignores
`base_zero`, so a slot's first contribution is added to whatever the sum memory held before (which is zero
in simulation, and arbitrary in the formal harness); `no_lease` and `lease_early` give the decider another
lease than the configuration's (`Decider.lease`: none, one tick less), which no port-level wrapper can do;
`sender_overlap` replaces the slot table's member-overlap test (`SlotTable.overlaps`) with a test of the
sender's bit alone; `no_route` and `hops_kept` change what the classifier's C1 registers about the frame's
route (`HeaderClassifier.header_class`); `stale_claims` hides from the decider (`Decider.decide`) that a
stale frame's slot is complete, as if the stale check came after the completed-slot claim.

More inside mutants of the same kind, each a small bug a real edit could make: `lease_unwrapped`
(`Decider.decide`) and `stamp_at_claim` (`Decider.committed_entry`) in the lease, `carry_lost`
(`OutputAssembler.carries_flag`), `carry_counted` and `partials_resend_uncounted`
(`OutputAssembler.counter_increments`), `hop2_expect_lost` and `members_low32` in the tree, `source_route` in
the route check (`HeaderClassifier.header_class`), `token_unchecked` (`HeaderClassifier.header_class`) and
`source_unchecked` (`HeaderClassifier.source_bad`) in the job tables' checks; `partial_to_group`
(`HeaderClassifier.header_class`) and `relay_twice` (`Decider.final_now`) in a registered tree, which only a
gateware whose tables hold routes has (tests/test_gateware_tree.py and formal's `tree_partial_to_parent` run
them; the cocotb suite's gateware holds none, so there they are the real one). tests/test_gateware_mutants.py
checks that each inside mutant changes the component it replaces and only it. `make mutate`
(tb/mutation/gateware.py) runs every mutant against the cocotb suite and the formal rows that name it.

`MUTANTS` maps a name to a one-line description; `build(name, config, data_width, buffer_beats)` returns the
gateware.
"""

from amaranth.hdl import Const, Module, Mux, Signal
from amaranth.lib import wiring

from inwire.protocol import FRAME_HEADER_BYTES, FRAME_OFFSETS, JOB_VERSION, Opcode

from .aggregator import Aggregator
from .assembler import OutputAssembler
from .blocks import SaturatingAdder
from .classifier import HeaderClassifier
from .decider import Decider
from .layout import field_value
from .signatures import Action
from .slot_table import SlotTable

MUTANTS = {
    "unstable": "m_axis_tdata changes while the sink stalls",
    "ragged": "the top tkeep bit of every beat before tlast cleared (a partial beat in mid-frame)",
    "spurious": "one extra single-beat frame offered at reset, before any input",
    "early_count": "stat_frames_in counts a frame at its accepted tlast, before its disposition is counted",
    "stall_input": "s_axis_tready low for good once the first input frame's tlast is accepted",
    "stall_output": "the output goes silent for good once it first offers a beat (the frame never leaves)",
    "corrupt_first": "bit 0 of the first beat of every output frame flipped",
    "corrupt_tail": "bit 0 of every beat after the first of every output frame flipped",
    "drop_second": "the second output frame swallowed whole",
    "corrupt_sum": "bit 0 of a result's first element flipped",
    "corrupt_trailer": "a result's last byte (the status trailer's flags) flipped",
    "never_answer": "every output frame after the first result swallowed (no retransmission answered)",
    "stale_memory": "a slot's first contribution added to the sum memory's old contents",
    "no_lease": "(inside) leases never expire: an unfinished slot waits for its owner forever",
    "lease_early": "(inside) a lease expires one tick early: idle for lease - 1 ticks is enough",
    "sender_overlap": "(inside) a frame is a duplicate only when its sender's bit is summed, not any of its members",
    "no_route": "(inside) the route check removed: hops naming the aggregator, the source or an outsider accepted",
    "hops_kept": "(inside) a partial's hops not moved up: it carries the frame's own expect, hop1 and hop1_expect",
    "stale_claims": "(inside) an older chunk or round of the owner's job claims a completed slot inside the lease",
    "lease_unwrapped": "(inside) the idle time taken as now - stamp without the wrap: a slot stamped before the "
                       "timer wrapped looks idle for 0 ticks",
    "stamp_at_claim": "(inside) a slot keeps the time of its claim: later accepted contributions do not renew the "
                      "lease",
    "carry_lost": "(inside) a partial's carried overflow flag dropped when that partial completes its slot",
    "carry_counted": "(inside) a partial's carried overflow flag counted in saturations",
    "hop2_expect_lost": "(inside) a partial's hop1_expect not moved up from hop2_expect (sent as 0)",
    "members_low32": "(inside) a frame's members cut to bits 0-31: members 32-63 are lost",
    "partials_resend_uncounted": "(inside) a stored partial sent again is not counted in partials_emitted",
    "source_route": "(inside) the route check without the source: a hop1 equal to the frame's IPv4 source passes",
    "token_unchecked": "(inside) a version 3 frame's token not compared: any token of a registered job passes",
    "source_unchecked": "(inside) a version 3 frame's source not compared with its job's members: anyone passes",
    "partial_to_group": "(inside) a registered clique's route to its parent ignored: its level's sums go to the "
                        "job's group as a result instead of up to the parent",
    "relay_twice": "(inside) a slot never marked as holding the parent's result: each copy of it is relayed "
                   "down again",
}


class _ForgetfulAdder(SaturatingAdder):
    """The saturating adder with `base_zero` ignored: a fresh sum starts from what the memory holds."""

    def elaborate(self, platform):
        m = Module()
        m.submodules.adder = adder = SaturatingAdder(self.lanes)
        m.d.comb += [adder.a.eq(self.a), adder.b.eq(self.b), adder.base_zero.eq(0),
                     self.sum.eq(adder.sum), self.saturated.eq(adder.saturated)]
        return m


class _ForgetfulAssembler(OutputAssembler):
    adder_type = _ForgetfulAdder


class StaleMemory(Aggregator):
    assembler_type = _ForgetfulAssembler


class LeaseMutant(Aggregator):
    """The real aggregator with its disposition decided against `lease` ticks instead of the configuration's
    (the decider is the one component that reads the lease)."""

    def __init__(self, lease, config, data_width, buffer_beats):
        super().__init__(config, data_width, buffer_beats=buffer_beats)
        self.decider.lease = lease


class _SenderOverlapTable(SlotTable):
    @staticmethod
    def overlaps(bitmap, key):
        return (bitmap & (Const(1, 64) << key.sender[:6])) != 0


class SenderOverlap(Aggregator):
    """The real aggregator with the version 1 duplicate test: a frame holding several members is summed
    again when its sender alone is new."""

    slot_table_type = _SenderOverlapTable


class _ChangedC1(HeaderClassifier):
    """The real classifier with some of C1's fields registered otherwise: `_changes(field)` gives them
    ({field: value}), where `field(name)` is a header field's value."""

    def header_class(self):
        return {**super().header_class(), **self._changes(lambda name: field_value(self.header, name))}


class _NoRouteClassifier(_ChangedC1):
    def _changes(self, field):
        return {"route_bad": 0}


class NoRoute(Aggregator):
    """The real aggregator with every frame's route allowed."""

    classifier_type = _NoRouteClassifier


class _HopsKeptClassifier(_ChangedC1):
    def _changes(self, field):
        return {"out_expect": field("expect"), "out_hop1": field("hop1"), "out_hop1_expect": field("hop1_expect")}


class HopsKept(Aggregator):
    """The real aggregator whose partials name the level and hops of the frame that caused them."""

    classifier_type = _HopsKeptClassifier


class _Hop2ExpectLostClassifier(_ChangedC1):
    def _changes(self, field):
        return {"out_hop1_expect": 0}


class Hop2ExpectLost(Aggregator):
    """The real aggregator moving hop2 up into a partial's hop1 but not hop2_expect into its hop1_expect."""

    classifier_type = _Hop2ExpectLostClassifier


class _MembersLow32Classifier(_ChangedC1):
    def _changes(self, field):
        bitmap, sender = field("bitmap"), field("sender")
        members = Mux((field("version") == 1) | (bitmap == 0), Const(1, 64) << sender[:6], bitmap)
        return {"members": members[:32]}


class MembersLow32(Aggregator):
    """The real aggregator holding a frame's members in 32 bits (its sender's bit or its bitmap)."""

    classifier_type = _MembersLow32Classifier


class _SourceRouteClassifier(_ChangedC1):
    def _changes(self, field):
        cfg = self.config
        hop1, hop2 = field("hop1"), field("hop2")
        network, length = cfg.upstream_prefix
        mask = (0xFFFFFFFF << (32 - length)) & 0xFFFFFFFF
        route_bad = (field("version") != 1) & Mux(
            hop1 == 0, hop2 != 0,
            (hop1 == cfg.ip) | ((hop1 & mask) != network) | (hop2 == hop1) | (hop2 == cfg.ip))
        return {"route_bad": route_bad}


class SourceRoute(Aggregator):
    """The real aggregator whose route check forgets the frame's source: a partial may go back where the
    frame came from."""

    classifier_type = _SourceRouteClassifier


class _TokenUncheckedClassifier(_ChangedC1):
    def _changes(self, field):
        return {"token_bad": (field("version") == JOB_VERSION) & ~self.jobs_query.hit.any()}


class TokenUnchecked(Aggregator):
    """The real aggregator taking a registered job's frames whatever token they carry."""

    classifier_type = _TokenUncheckedClassifier


class _SourceUncheckedClassifier(HeaderClassifier):
    def source_bad(self, c1):
        return c1.v3 & (c1.partial | c1.v3_result)


class SourceUnchecked(Aggregator):
    """The real aggregator taking a registered job's contributions and requests from any source."""

    classifier_type = _SourceUncheckedClassifier


class _PartialToGroupClassifier(HeaderClassifier):
    def header_class(self):
        fields = super().header_class()
        v3 = fields["v3"]
        return {**fields, "partial_out": fields["partial_out"] & ~v3, "hop1": Mux(v3, 0, fields["hop1"])}


class PartialToGroup(Aggregator):
    """The real aggregator treating every registered clique as rooted here, whatever its route says."""

    classifier_type = _PartialToGroupClassifier


class _RelayTwiceDecider(Decider):
    def final_now(self):
        return Const(0)


class RelayTwice(Aggregator):
    """The real aggregator forgetting that a slot's result came down: a copy of it is relayed again, and
    the slot answers with its partial as before the result came."""

    decider_type = _RelayTwiceDecider


class _DecideOnChangedMatch(Decider):
    """The real decider whose disposition sees the slot table's match with some fields changed:
    `_changes(changed, found)`."""

    def decide(self, m, found):
        changed = Signal(found.shape(), name=f"found_{type(self).__name__.lower()}")
        m.d.comb += [changed.eq(found), *self._changes(changed, found)]
        super().decide(m, changed)


class _StaleClaimsDecider(_DecideOnChangedMatch):
    def _changes(self, changed, found):
        return [changed.older.eq(found.older & ~found.entry.complete)]


class StaleClaims(Aggregator):
    """The real aggregator with the stale check applied to unfinished slots only: a completed slot is
    claimed by an older frame of its job, its stored result lost."""

    decider_type = _StaleClaimsDecider


class _LeaseUnwrappedDecider(_DecideOnChangedMatch):
    def _changes(self, changed, found):
        now = self.classified.frame.now
        return [changed.idle.eq(Mux(now >= found.entry.stamp, found.idle, 0))]


class LeaseUnwrapped(Aggregator):
    """The real aggregator comparing times as plain numbers: a frame time below the slot's stamp (the timer
    wrapped in between) is no idle time at all. Timers that start at 0 and run less than 2**16 ticks never
    show it."""

    decider_type = _LeaseUnwrappedDecider


class _StampAtClaimDecider(Decider):
    def committed_entry(self, ans):
        entry = super().committed_entry(ans)
        return {**entry, "stamp": Mux(self.decision.fresh, entry["stamp"], self.access.found.entry.stamp)}


class StampAtClaim(Aggregator):
    """The real aggregator stamping a slot only when it is claimed: a slot whose members keep coming
    expires `lease` ticks after its first contribution."""

    decider_type = _StampAtClaimDecider


class _CarryLostAssembler(OutputAssembler):
    def carries_flag(self, ctx):
        return super().carries_flag(ctx) & (ctx.action != Action.SUM_RESULT)


class CarryLost(Aggregator):
    """The real aggregator reading a partial's trailer flag only when the partial does not complete its slot."""

    assembler_type = _CarryLostAssembler


class _CarryCountedAssembler(OutputAssembler):
    def counter_increments(self, done):
        increments, s = super().counter_increments(done), done.s
        carried = ~s.bad & s.summing & (done.carried_acc | s.carried)
        return {**increments, "saturations": increments["saturations"] | carried}


class CarryCounted(Aggregator):
    """The real aggregator counting a summed partial whose trailer carries the overflow flag in saturations."""

    assembler_type = _CarryCountedAssembler


class _PartialsResendUncountedAssembler(OutputAssembler):
    def counter_increments(self, done):
        increments = super().counter_increments(done)
        # A stored output is sent with the trailer, not summed.
        return {**increments, "partials_emitted": increments["partials_emitted"] & done.s.summing}


class PartialsResendUncounted(Aggregator):
    """The real aggregator counting partials only as they complete a level, not a stored one sent again."""

    assembler_type = _PartialsResendUncountedAssembler


class PortMutant(wiring.Component):
    """The real aggregator behind its own ports, with the fault `name` added between them."""

    def __init__(self, name, config, data_width, buffer_beats):
        if name not in MUTANTS:
            raise ValueError(f"unknown mutant {name!r}")
        self.name = name
        self.inner = Aggregator(config, data_width, buffer_beats=buffer_beats)
        self.config, self.data_width = config, data_width
        self.buffer_beats, self.header_beats = self.inner.buffer_beats, self.inner.header_beats
        super().__init__(dict(self.inner.signature.members))

    def elaborate(self, platform):
        m = Module()
        m.submodules.inner = inner = self.inner
        W = self.data_width
        for name, member in self.signature.members.items():
            if member.flow == wiring.In:
                m.d.comb += getattr(inner, name).eq(getattr(self, name))
            else:
                m.d.comb += getattr(self, name).eq(getattr(inner, name))

        # Where the inner output is: beat `beat` of output frame `frame` (counted from 0); whether the
        # frame being offered is a result (its opcode byte, once that beat has passed).
        take = inner.m_axis_tvalid & inner.m_axis_tready
        beat = Signal(16)
        frame = Signal(8)
        with m.If(take):
            m.d.sync += beat.eq(Mux(inner.m_axis_tlast, 0, beat + 1))
            with m.If(inner.m_axis_tlast & (frame != 0xFF)):
                m.d.sync += frame.eq(frame + 1)
        opcode_beat, opcode_lane = divmod(FRAME_OFFSETS["opcode"], W)
        opcode_now = inner.m_axis_tdata.word_select(opcode_lane, 8)
        opcode = Signal(8)
        with m.If(take & (beat == opcode_beat)):
            m.d.sync += opcode.eq(opcode_now)
        is_result = Mux(beat == opcode_beat, opcode_now, opcode) == Opcode.RESULT
        is_result = is_result & (beat >= opcode_beat)
        first_bit = Const(1, 8 * W)

        if self.name == "unstable":
            m.d.comb += self.m_axis_tdata.eq(inner.m_axis_tdata ^ ~inner.m_axis_tready)
        elif self.name == "ragged":
            m.d.comb += self.m_axis_tkeep.eq(Mux(inner.m_axis_tlast, inner.m_axis_tkeep,
                                                 inner.m_axis_tkeep & ((1 << (W - 1)) - 1)))
        elif self.name == "spurious":
            sent = Signal()
            with m.If(~sent):
                m.d.comb += [self.m_axis_tvalid.eq(1), self.m_axis_tdata.eq(0), self.m_axis_tkeep.eq((1 << W) - 1),
                             self.m_axis_tlast.eq(1), self.m_axis_tuser.eq(0), inner.m_axis_tready.eq(0)]
                with m.If(self.m_axis_tready):
                    m.d.sync += sent.eq(1)
        elif self.name == "early_count":
            ahead = Signal(32)
            with m.If(self.s_axis_tvalid & inner.s_axis_tready & self.s_axis_tlast):
                m.d.sync += ahead.eq(ahead + 1)
            m.d.comb += self.stat_frames_in.eq(ahead)
        elif self.name == "stall_input":
            stuck = Signal()
            with m.If(self.s_axis_tvalid & inner.s_axis_tready & self.s_axis_tlast):
                m.d.sync += stuck.eq(1)
            with m.If(stuck):
                m.d.comb += [self.s_axis_tready.eq(0), inner.s_axis_tvalid.eq(0)]
        elif self.name == "stall_output":
            stuck = Signal()
            with m.If(inner.m_axis_tvalid):
                m.d.sync += stuck.eq(1)
            with m.If(stuck | inner.m_axis_tvalid):
                m.d.comb += [self.m_axis_tvalid.eq(0), inner.m_axis_tready.eq(0)]
        elif self.name == "corrupt_first":
            m.d.comb += self.m_axis_tdata.eq(inner.m_axis_tdata ^ Mux(beat == 0, first_bit, 0))
        elif self.name == "corrupt_tail":
            m.d.comb += self.m_axis_tdata.eq(inner.m_axis_tdata ^ Mux(beat != 0, first_bit, 0))
        elif self.name == "drop_second":
            with m.If(frame == 1):
                m.d.comb += [self.m_axis_tvalid.eq(0), inner.m_axis_tready.eq(1)]
        elif self.name == "corrupt_sum":
            element_beat, element_lane = divmod(FRAME_HEADER_BYTES, W)
            flip = Const(1 << (8 * element_lane), 8 * W)
            m.d.comb += self.m_axis_tdata.eq(inner.m_axis_tdata ^ Mux(is_result & (beat == element_beat), flip, 0))
        elif self.name == "corrupt_trailer":
            keep = inner.m_axis_tkeep
            # The last kept byte: bit k of `top` is set where byte k is kept and byte k + 1 is not.
            top = keep & ~(keep >> 1)
            flip = Signal(8 * W)
            m.d.comb += flip.eq(sum(Mux(top[k], Const(0x80 << (8 * k), 8 * W), 0) for k in range(W)))
            m.d.comb += self.m_axis_tdata.eq(inner.m_axis_tdata ^ Mux(is_result & inner.m_axis_tlast, flip, 0))
        elif self.name == "never_answer":
            done = Signal()
            with m.If(take & inner.m_axis_tlast & is_result):
                m.d.sync += done.eq(1)
            with m.If(done):
                m.d.comb += [self.m_axis_tvalid.eq(0), inner.m_axis_tready.eq(1)]
        return m


def build(name, config, data_width, buffer_beats):
    if name == "stale_memory":
        return StaleMemory(config, data_width, buffer_beats=buffer_beats)
    if name == "sender_overlap":
        return SenderOverlap(config, data_width, buffer_beats=buffer_beats)
    inside = {"no_route": NoRoute, "hops_kept": HopsKept, "stale_claims": StaleClaims,
              "lease_unwrapped": LeaseUnwrapped, "stamp_at_claim": StampAtClaim, "carry_lost": CarryLost,
              "carry_counted": CarryCounted, "hop2_expect_lost": Hop2ExpectLost, "members_low32": MembersLow32,
              "partials_resend_uncounted": PartialsResendUncounted, "source_route": SourceRoute,
              "token_unchecked": TokenUnchecked, "source_unchecked": SourceUnchecked,
              "partial_to_group": PartialToGroup, "relay_twice": RelayTwice}
    if name in inside:
        return inside[name](config, data_width, buffer_beats=buffer_beats)
    if name == "no_lease":
        return LeaseMutant(0, config, data_width, buffer_beats)
    if name == "lease_early":
        if config.lease < 2:
            raise ValueError(f"lease_early needs a lease of at least 2 ticks (1 less is still a lease), got "
                             f"{config.lease}")
        return LeaseMutant(config.lease - 1, config, data_width, buffer_beats)
    return PortMutant(name, config, data_width, buffer_beats)
