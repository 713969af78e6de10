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
slot's lease runs out, whether the slot is complete or not. Registered jobs (version 3) take their level
and parent from the job tables' clique routes instead (`job_table`, with `limits.routes`): partials come
from the route's child aggregators alone, the level's partial goes to the parent, and the parent's result
is relayed to the group once.

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
counters) empties them. `Aggregator` connects them. Each has its file (classifier.py, slot_table.py,
decider.py, assembler.py); what they exchange is in signatures.py, the lease ticks in lease.py.

Slot leases: a TIME_BITS-bit (16) timer counts pulses of `lease_tick`; a frame's time is the timer's value when
its header's last beat is accepted, and a contribution's commit stamps its slot entry with it. The idle
time (frame time minus stamp, modulo 2**TIME_BITS) is a subtraction in C3 and its comparison with the
lease a comparison with a constant in I3: one carry chain per stage.
"""


from amaranth.hdl import Module
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from inwire.model import AggregatorConfig
from inwire.protocol import (
    COUNTERS,
    ELEMENT_BYTES,
    FRAME_HEADER_BYTES,
    RESULT_TRAILER_BYTES,
)
from inwire.simulators import DATA_WIDTHS

from .assembler import OutputAssembler
from .blocks import RegisteredFIFO
from .classifier import HeaderClassifier
from .decider import Decider
from .job_table import JobTables
from .signatures import context_layout, queued_beat_layout
from .slot_table import SlotTable


class Aggregator(wiring.Component):
    """Aggregator gateware for `config` (an `inwire.model.AggregatorConfig`), `data_width` bytes per beat.

    Ports: `s_axis_t{data,keep,last,valid,ready}` in, `m_axis_t{data,keep,last,valid,ready,user}` out
    (tuser on a last beat marks an aborted frame), one 32-bit `stat_<name>` per `COUNTERS` name, and
    `lease_tick`, one pulse per tick of the lease timer (`LeaseTicker` makes them from the clock). With job
    tables (`config.registered`, sized by `config.limits`): `ctl_we`, `ctl_addr` and `ctl_data`, the control
    interface that writes them (`job_table.ControlMap`).
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
        self.job_tables = JobTables(config) if config.registered else None
        if self.job_tables is not None:
            ports.update({"ctl_we": In(1), "ctl_addr": In(self.job_tables.map.address_bits), "ctl_data": In(32)})
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
        if self.job_tables is not None:
            m.submodules.job_tables = tables = self.job_tables
            wiring.connect(m, classifier.jobs_query, tables.query)
            wiring.connect(m, classifier.member_query, tables.member_query)
            wiring.connect(m, tables.clear, slot_table.clear)
            m.d.comb += [tables.control.we.eq(self.ctl_we), tables.control.addr.eq(self.ctl_addr),
                         tables.control.data.eq(self.ctl_data)]
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
