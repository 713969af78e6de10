"""What the aggregator's components exchange: the action enum, the slot-table entry and key, the
context, beat and classification layouts, and the signatures of the ports between the components
(docs/gateware.md, Components). Kept apart from the components so that each imports them and none imports
another."""

import enum

from amaranth.hdl import Signal
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from inwire.model import TIME_BITS
from inwire.protocol import (
    COUNTERS,
    Disposition,
)

from .layout import FRAME_HEADER

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
        # A version 3 answer carries its job's token (0 in a stats reply).
        "v3": 1, "token": 64,
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


def frame_class_layout(data_width, beat_bits, jobs=1, routes=0, children=0):
    """What the header classifier knows about the frame whose header ended (C1-C3): decoded flags and fields,
    partial checksums, and the first disposition, from the checks before the slot table. `hit`: which of the
    `jobs` job-table entries holds a version 3 frame's job; `slot` is the aggregator's slot, `slot_rel` the
    frame's (they differ for version 3). With job tables that hold `routes`, a version 3 partial going up
    goes to `hop1` (the clique's parent) at `parent_port`; with `children`, `child_ok`: a partial's source
    is a child aggregator of its clique's route, its members within the child's."""
    with_routes = {"parent_port": 16} if routes else {}
    if children:
        with_routes["child_ok"] = 1
    return data.StructLayout({
        **with_routes,
        **{flag: 1 for flag in (
            "foreign", "bad_ver", "frag", "bad_magic", "summed", "partial", "v1", "v3", "v3_result", "payload",
            "job_bad", "token_bad", "member_bad", "partial_out",
            "level_outside", "members_full", "result_req", "stats_req",
            "lengths_bad", "fanin_bad", "sender_bad", "count_bad", "group_bad", "slot_bad",
            "runt", "header_short", "request_len_ok", "len_pending", "pre_pass", "route_bad")},
        "pre_disp": Disposition, "pre_action": Action, "csum_a": 18, "csum_b": 18, "csum_c": 17, "csum_total": 20,
        "hit": jobs, "token": 64, "slot_rel": 16,
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


def classified_signature(data_width, beat_bits, jobs=1, routes=0, children=0):
    """Classifier to decider: the beat in I3 and the classification of the last header that ended, in C3;
    back, `advance` moves the input registers (both FIFOs have room)."""
    return wiring.Signature({"beat": Out(input_beat_layout(data_width, beat_bits)),
                             "frame": Out(frame_class_layout(data_width, beat_bits, jobs, routes, children)),
                             "advance": In(1)})
