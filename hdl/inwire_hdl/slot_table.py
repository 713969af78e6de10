"""The slot table: one entry per slot, read and compared with each frame's key (docs/gateware.md, Components)."""


from amaranth.hdl import Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from inwire.model import TIME_BITS
from inwire.protocol import (
    ELEMENT_BYTES,
    FRAME_HEADER_BYTES,
    RESULT_TRAILER_BYTES,
)

from .job_table import clear_signature
from .signatures import META, access_signature, lookup_signature


class SlotTable(wiring.Component):
    """The slot table: one `META` entry per slot and a valid bit. `lookup` reads the entry of the frame in C1
    and compares it with the frame's key in C2; the answer is `access.found` in C3's cycle. An entry
    committed through `access` is registered, then written (and its valid bit set) one cycle later. `clear`
    (the job tables, when a job is installed or torn down) empties a slot: its valid bit goes.
    """

    def __init__(self, config, data_width, beat_bits):
        self.config, self.data_width, self.beat_bits = config, data_width, beat_bits
        self.slot_bits = max(1, ceil_log2(config.slots))
        super().__init__({"lookup": In(lookup_signature(self.slot_bits)),
                          "access": Out(access_signature(self.slot_bits, beat_bits)),
                          "clear": In(clear_signature(self.slot_bits))})

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
        with m.If(self.clear.valid):
            m.d.sync += slot_valid.bit_select(self.clear.slot, 1).eq(0)
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
                "duplicate": self.overlaps(entry.bitmap, key),
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
    def overlaps(bitmap, key):
        """Whether a slot entry's `bitmap` already holds one of the frame's members (DROP_DUPLICATE): any
        overlap, so that a member's elements are summed at most once per slot, whichever frames carry it."""
        return (bitmap & key.members) != 0
