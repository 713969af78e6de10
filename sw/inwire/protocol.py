"""The inwire wire format, defined once.

Every frame the aggregator acts on starts with a fixed 128-byte header: Ethernet II (14 bytes), IPv4
without options (20), UDP (8) and the aggregation header (86). 128 is a multiple of every data width
from 8 to 64 bytes, so the int32 elements that follow start on a beat boundary at every width.

The tables below are the single source of truth. The scapy layer (`inwire.layers`), the numpy codec
(`inwire.packets`), the golden model (`inwire.model`), the gateware layout (`inwire_hdl.layout`) and the
protocol table in docs/protocol.md are all derived from them.
"""

from collections.abc import Iterable
from dataclasses import dataclass
from enum import IntEnum

import numpy as np


@dataclass(frozen=True)
class Field:
    name: str
    nbytes: int
    meaning: str
    signed: bool = False

    @property
    def bits(self) -> int:
        return 8 * self.nbytes


ETHERNET_FIELDS = (
    Field("eth_dst", 6, "destination MAC"),
    Field("eth_src", 6, "source MAC"),
    Field("eth_type", 2, "EtherType, 0x0800 for IPv4"),
)

IPV4_FIELDS = (
    Field("ip_ver_ihl", 1, "version (high nibble, 4) and header length in words (low nibble, 5)"),
    Field("ip_tos", 1, "DSCP and ECN"),
    Field("ip_len", 2, "total length of the IPv4 packet in bytes"),
    Field("ip_id", 2, "identification"),
    Field("ip_frag", 2, "flags (3 bits) and fragment offset (13 bits)"),
    Field("ip_ttl", 1, "time to live"),
    Field("ip_proto", 1, "protocol, 17 for UDP"),
    Field("ip_csum", 2, "header checksum"),
    Field("ip_src", 4, "source address"),
    Field("ip_dst", 4, "destination address"),
)

UDP_FIELDS = (
    Field("udp_sport", 2, "source port"),
    Field("udp_dport", 2, "destination port, INWIRE_PORT for aggregation traffic"),
    Field("udp_len", 2, "UDP header and payload length in bytes"),
    Field("udp_csum", 2, "checksum, 0 (none) in frames the aggregator sends"),
)

ROUTE_HOPS = 2
"""Aggregators above the receiving one that a frame names (hop1, hop2): trees of up to three levels."""

AGGREGATION_FIELDS = (
    Field("magic", 2, "0x4957 ('IW'): marks an inwire header"),
    Field("version", 1, "protocol version: 3 for a registered job's frames; 1 and 2 only where an aggregator "
                        "takes unregistered frames (see Versions)"),
    Field("opcode", 1, "contribution, partial, result, result request, stats request or stats reply"),
    Field("sender", 1, "sender's index within its clique, below fanin; in an answer, whose frame caused it"),
    Field("fanin", 1, "number of members in the clique, 1 to the aggregator's maximum"),
    Field("exponent", 1, "block exponent e: an element q stands for q * 2**e", signed=True),
    Field("contributors", 1, "in a result: number of members summed (bits set in bitmap)"),
    Field("job", 4, "training job identifier"),
    Field("round", 4, "round number; a newer round of the same job may reclaim an unfinished slot"),
    Field("clique", 2, "clique index within the round"),
    Field("slot", 2, "aggregator slot chosen by the host (hosts alternate two pools of slots)"),
    Field("chunk", 4, "offset of the first element within the vector"),
    Field("count", 2, "number of int32 elements after the header"),
    Field("reserved0", 2, "zero"),
    Field("group", 4, "IPv4 multicast group (239.0.0.0/8) that receives the result"),
    Field("bitmap", 8, "bit i set for member i: in a contribution or partial, the members it holds (0: its "
                       "sender alone); in a result, the members summed"),
    Field("expect", 8, "members the receiving aggregator sums before it sends on, its level (0: the whole clique)"),
    Field("hop1", 4, "next aggregator up the reduction tree (IPv4 address), where this level's partial goes; "
                     "0: this level is the root, its result goes to the group"),
    Field("hop1_expect", 8, "hop1's level, as `expect`"),
    Field("hop2", 4, "the aggregator above hop1 (0: hop1 is the root); a partial moves hop2 to hop1"),
    Field("hop2_expect", 8, "hop2's level, as `expect`"),
    Field("reserved", 6, "zero; pads the frame header to 128 bytes"),
    Field("token", 8, "version 3: the job's secret token, which the aggregator compares with its tables; a "
                      "result carries it back to the members (0 in versions 1 and 2)"),
)

RESULT_TRAILER_FIELDS = (
    Field("status", 4, "bit 0: a sum saturated at the int32 limits (overflow)"),
)
"""A result or partial ends with this trailer after its elements: a cut-through aggregator knows whether
the completing contribution saturated only once its last element has gone by, long after the header."""

FRAME_FIELDS = ETHERNET_FIELDS + IPV4_FIELDS + UDP_FIELDS + AGGREGATION_FIELDS


def _offsets(fields: Iterable[Field]) -> tuple[dict[str, int], int]:
    offsets: dict[str, int] = {}
    position = 0
    for field in fields:
        offsets[field.name] = position
        position += field.nbytes
    return offsets, position


FRAME_OFFSETS, FRAME_HEADER_BYTES = _offsets(FRAME_FIELDS)
AGGREGATION_HEADER_BYTES = sum(field.nbytes for field in AGGREGATION_FIELDS)
ETHERNET_BYTES = sum(field.nbytes for field in ETHERNET_FIELDS)
IPV4_BYTES = sum(field.nbytes for field in IPV4_FIELDS)
UDP_BYTES = sum(field.nbytes for field in UDP_FIELDS)
FIELDS_BY_NAME = {field.name: field for field in FRAME_FIELDS}
assert FRAME_HEADER_BYTES == 128, FRAME_HEADER_BYTES

INWIRE_PORT = 0x4957
DEFAULT_SLOTS = 256
"""Slots of `inwire serve` unless told (--slots), which members and trainers size their runs against. A run
needs 4 x cliques x window slots (`client.slots_needed`): 256 holds the host benchmark's window of 64 in one
clique. The gateware's default (`AggregatorConfig.slots`, 16) is what a board's block RAM holds."""
MAGIC = 0x4957
VERSION = 2
"""Version 2 adds reduction trees (member bitmaps, levels, hops, partials). A version 1 frame still works:
it is read as a version 2 frame whose `bitmap`, `expect` and hop fields are 0 (a one-member contribution
to a flat clique's root), and its answer carries version 1."""
OPEN_VERSIONS = (1, VERSION)
"""Versions whose frames configure their slot and route themselves (fan-in, group, level and hops in the
header): only an aggregator in unregistered mode (captures, the lab) takes them."""
JOB_VERSION = 3
"""Version 3: a registered job's frame. Its token, source and slot are checked against the job's tables,
which say where its outputs go; its `expect` and hop fields are 0 (docs/protocol.md, Trust)."""
VERSIONS = (*OPEN_VERSIONS, JOB_VERSION)
ELEMENT_BYTES = 4
INT32_MIN, INT32_MAX = -2**31, 2**31 - 1
"""Limits of an element; sums saturate at them."""
ETHERTYPE_IPV4 = 0x0800
IP_PROTO_UDP = 17
IP_VER_IHL = 0x45
IP_FLAG_DF = 0x4000
IP_FRAGMENT_MASK = 0x3FFF
"""More-fragments flag and fragment offset: a frame with any of them set is a fragment."""
RESULT_TTL = 64
STATUS_OVERFLOW = 0x01
RESULT_TRAILER_BYTES = sum(field.nbytes for field in RESULT_TRAILER_FIELDS)
MAX_FANIN = 64
MIN_FRAME_BYTES = 60
"""Shortest Ethernet frame without its FCS; anything shorter is a runt."""
WIRE_OVERHEAD_BYTES = 24
"""Preamble and SFD (8), FCS (4) and the minimum inter-frame gap (12) that every frame costs."""
MTU_BYTES = 2048
"""The IPv4 MTU that DoubleZero asks of its contributors."""
MAX_ELEMENTS_PER_FRAME = (MTU_BYTES - IPV4_BYTES - UDP_BYTES - AGGREGATION_HEADER_BYTES
                          - RESULT_TRAILER_BYTES) // ELEMENT_BYTES
MAX_RESULT_ELEMENTS = (0xFFFF - IPV4_BYTES - UDP_BYTES - AGGREGATION_HEADER_BYTES
                       - RESULT_TRAILER_BYTES) // ELEMENT_BYTES
"""Most elements a result can carry: its IPv4 total length (16 bits) bounds it, so an aggregator takes no
longer chunk, whose result it could not send."""
JUMBO_MTU_BYTES = 9000
"""The usual jumbo-frame MTU (loopback's is 65536)."""
JUMBO_ELEMENTS_PER_FRAME = 2048
"""8 KiB of elements: an 8282-byte result payload, an 8310-byte IPv4 packet, within a jumbo MTU. The
largest chunk `inwire stream` sends; above MAX_ELEMENTS_PER_FRAME it needs jumbo frames (or loopback)
end to end, since the aggregator drops IPv4 fragments."""
assert IPV4_BYTES + UDP_BYTES + AGGREGATION_HEADER_BYTES + 4 * JUMBO_ELEMENTS_PER_FRAME + 4 <= JUMBO_MTU_BYTES
MULTICAST_PREFIX = 239 << 24
MULTICAST_MASK = 0xFF000000


class Opcode(IntEnum):
    CONTRIBUTION = 1
    RESULT = 2
    RESULT_REQUEST = 3
    STATS_REQUEST = 4
    STATS_REPLY = 5
    PARTIAL = 6


OPCODE_MEANING = {
    Opcode.CONTRIBUTION: "a member's elements for a slot; summed into it",
    Opcode.RESULT: "the slot's sums and a status trailer, multicast to the group",
    Opcode.RESULT_REQUEST: "asks for a completed slot's stored result without contributing",
    Opcode.STATS_REQUEST: "asks the aggregator for its counters",
    Opcode.STATS_REPLY: "the counters, one uint32 each, as the elements, in COUNTERS order",
    Opcode.PARTIAL: "a level's sums for the next aggregator up the tree: a contribution that holds several "
                    "members, with a result's status trailer",
}


class Disposition(IntEnum):
    """What the aggregator did with one input frame: every frame gets exactly one. This is the table of
    dispositions; each member is (number, meaning, remedy, retransmission):

    - `meaning`: what the frame was (docs/protocol.md's table, and the diagnosis of a drop without a remedy);
    - `remedy`: what whoever runs `inwire stream` does about a drop of this kind, said by `inwire.diagnosis`,
      which fills in {chunk} (--chunk), {slots_needed} (the slots the run needs) and {where} (the failed
      chunk's slot, or the run's slots); empty: the diagnosis names the drop with its meaning;
    - `retransmission`: retransmissions cause this drop by themselves on a healthy run (a member summed
      already, a request for a result not there yet): serve's log, the stream's summary and the diagnosis
      count it apart from the drops that mean something is wrong.

    The number is the counter's place in a stats reply (`COUNTERS`) and the gateware's disposition code.
    """

    meaning: str
    remedy: str
    retransmission: bool

    def __new__(cls, value: int, meaning: str, remedy: str = "", retransmission: bool = False) -> "Disposition":
        member = int.__new__(cls, value)
        member._value_ = value
        member.meaning = meaning
        member.remedy = remedy
        member.retransmission = retransmission
        return member

    FORWARDED = 0, "not addressed to the aggregator: passed through byte for byte"
    ACCUMULATED = (1, "contribution or partial added to its slot (the one that completes its level also emits the "
                      "result, or the partial for the next level)")
    ANSWERED = (2, "retransmitted contribution or partial, or result request, for a completed slot (the stored "
                   "result, or partial for the next level), or stats request: answered with one frame")
    DROP_RUNT = 3, "shorter than 60 bytes"
    DROP_IP_HEADER = 4, "IPv4 version is not 4 or header length is not 5 words"
    DROP_IP_FRAGMENT = (5, "IPv4 fragment (MF set or offset not zero)",
                        "--chunk {chunk} needs a larger MTU on the path, or lower --chunk")
    DROP_IP_CHECKSUM = 6, "IPv4 header checksum wrong"
    DROP_LENGTH = 7, "frame, IPv4 and UDP lengths and element count disagree (requests carry no elements)"
    DROP_VERSION = (8, "magic or version unknown, or a version the aggregator does not take (3 without job "
                       "tables; 1 and 2 where only registered jobs count)",
                    "the aggregator takes registered jobs only: register the job (inwire job), or start inwire "
                    "serve with --unregistered for captures and the lab")
    DROP_OPCODE = (9, "opcode is not one an aggregator accepts (contribution, partial, result request, stats "
                      "request)")
    DROP_FANIN = (10, "fanin is 0 or above the aggregator's maximum",
                  "a clique of the schedule is larger than the aggregator's maximum fan-in")
    DROP_SENDER = (11, "sender index not below fanin, members outside the level, or a level member not below "
                       "fanin")
    DROP_COUNT = (12, "element count is 0 or above the aggregator's maximum",
                  "--chunk {chunk} is above its maximum elements per frame; lower --chunk, or start inwire serve "
                  "with --max-elements {chunk} (the gateware: --elements)")
    DROP_GROUP = 13, "group is not in 239.0.0.0/8, or (version 3) not its job's group"
    DROP_SLOT = (14, "slot index beyond the aggregator's slots, or (version 3) beyond its job's quota, or "
                     "(versions 1 and 2) a slot a registered job holds",
                 "the run needs {slots_needed} slots (4 x cliques x --window), more than it has; lower --window, "
                 "or start inwire serve with --slots {slots_needed}")
    DROP_DUPLICATE = 15, "holds a member already summed into this slot", "", True
    DROP_MISMATCH = 16, "fanin, group, count, exponent or level differ from the slot's first contribution"
    DROP_COLLISION = (17, "slot busy with another unfinished job, round, clique or chunk whose lease has not run "
                          "out",
                      "collision with another job on {where}, whose unfinished round holds it; run again once "
                      "that job has finished or been reclaimed, or use another aggregator")
    DROP_NO_RESULT = 18, "result request for a slot with no matching completed result", "", True
    DROP_ROUTE = (19, "its hops would send a partial where none may go: `hop1` is the aggregator itself, the "
                      "frame's source or outside its upstream prefix, or `hop2` is set without `hop1`, equals "
                      "`hop1` or is the aggregator itself; or it is version 3 and names a route (`expect` or a "
                      "hop not 0), which only its job's tables hold",
                  "the schedule's tree names a next aggregator that is this one, the sender, or outside its "
                  "upstream prefix; start inwire serve with --upstream covering the tree's aggregators")
    DROP_STALE = (20, "older than the slot's live owner of the same job (an earlier round, or an earlier chunk of "
                      "the same round and clique): a delayed copy, never allowed to evict a newer result",
                  "delayed or duplicated copies of earlier chunks or rounds that arrived after their slot had "
                  "moved on; they never evict a newer result, so they only cost bandwidth; a network that delays "
                  "datagrams this much may need a larger --timeout-ms")
    DROP_JOB = (21, "version 3 frame of a job the aggregator holds no tables for",
                "the job is not registered at this aggregator (or its registration expired): register it "
                "(inwire job register), and renew it while it runs")
    DROP_TOKEN = (22, "version 3 frame whose token is not its job's",
                  "a sender uses another token than the job registered: a stale job file, or someone outside "
                  "the job")
    DROP_MEMBER = (23, "version 3 frame from a source its job's tables do not name for it: a contribution or "
                       "result request not from a member, a partial not from a child aggregator of its clique "
                       "(or holding members beyond that child's), a result not from the clique's parent",
                   "a sender's address and port are not the job's: register each member's socket address, or "
                   "someone outside the job")
    RELAYED = (24, "version 3 result from the clique's parent for a slot waiting for it: stored and sent down "
                   "(to the slot's members and child aggregators; with a group, which the root sent it to, only to "
                   "those whose retransmission sent the partial up again, or to the group again by an aggregator "
                   "that sends one frame per result, as the gateware)")


COUNTERS = tuple(disposition.name.lower() for disposition in Disposition) + (
    "frames_in", "results_emitted", "slots_reclaimed", "saturations", "leases_expired", "partials_emitted")
"""Counter names, in the order a stats reply carries them. `frames_in` equals the sum of the
dispositions; `results_emitted` counts result frames sent (completions and stored-result answers);
`leases_expired` counts unfinished slots claimed by another owner after their lease ran out;
`partials_emitted` counts partials sent up the tree (completions and stored-partial answers)."""

DROP_COUNTERS = tuple(d.name.lower() for d in Disposition if d.name.startswith("DROP_"))
RETRANSMISSION_DROP_COUNTERS = tuple(d.name.lower() for d in Disposition if d.retransmission)
"""Drops that retransmissions cause by themselves (`Disposition.retransmission`)."""
FAULT_DROP_COUNTERS = tuple(name for name in DROP_COUNTERS if name not in RETRANSMISSION_DROP_COUNTERS)
"""Drops that mean something is wrong: every other drop."""


def _numpy_field(field: Field) -> tuple[str, str] | tuple[str, str, tuple[int]]:
    if field.nbytes in (1, 2, 4, 8):
        kind = "i" if field.signed else "u"
        return (field.name, f">{kind}{field.nbytes}")
    return (field.name, "u1", (field.nbytes,))


FRAME_HEADER_DTYPE = np.dtype([_numpy_field(field) for field in FRAME_FIELDS])
"""numpy structured type of the 128-byte frame header, in network byte order."""
assert FRAME_HEADER_DTYPE.itemsize == FRAME_HEADER_BYTES

ELEMENT_DTYPE = np.dtype(">i4")


def multicast_mac(group: int) -> int:
    """Ethernet address of an IPv4 multicast group: 01:00:5e and the group's low 23 bits."""
    return 0x01005E000000 | (int(group) & 0x7FFFFF)


def is_multicast_group(group: int) -> bool:
    return (int(group) & MULTICAST_MASK) == MULTICAST_PREFIX


REQUEST_OPCODES = (Opcode.RESULT_REQUEST, Opcode.STATS_REQUEST)
"""Requests are the bare header: their count field describes the slot, not the frame."""
TRAILER_OPCODES = (Opcode.RESULT, Opcode.PARTIAL)
"""Frames whose elements are followed by the status trailer."""
SUMMED_OPCODES = (Opcode.CONTRIBUTION, Opcode.PARTIAL)
"""Frames whose elements an aggregator sums into a slot."""
GATEWAY_MAC = 0xFF_FF_FF_FF_FF_FF
"""Default destination MAC of a partial: an aggregator sends it to its next-hop router's MAC, which is
configuration (`AggregatorConfig.gateway_mac`); broadcast reaches the next aggregator over a direct link."""


def clique_mask(fanin: int) -> int:
    """The bitmap of a whole clique of `fanin` members."""
    return (1 << min(int(fanin), 64)) - 1


def frame_bytes(count: int, opcode: int = Opcode.CONTRIBUTION) -> int:
    """Length, without FCS, of an aggregation frame of kind `opcode` whose count field is `count`."""
    if opcode in REQUEST_OPCODES:
        return FRAME_HEADER_BYTES
    trailer = RESULT_TRAILER_BYTES if opcode in TRAILER_OPCODES else 0
    return FRAME_HEADER_BYTES + ELEMENT_BYTES * count + trailer


def wire_efficiency(count: int) -> float:
    """Element bytes of a contribution over all bytes it costs on the wire (preamble, FCS, gap)."""
    return ELEMENT_BYTES * count / (frame_bytes(count) + WIRE_OVERHEAD_BYTES)


def markdown_table(fields: Iterable[Field] = AGGREGATION_FIELDS) -> str:
    """The header as a Markdown table: offset within the frame, size, name and meaning."""
    lines = ["| offset | bytes | field | meaning |", "| ---: | ---: | --- | --- |"]
    for field in fields:
        signed = " (signed)" if field.signed else ""
        lines.append(f"| {FRAME_OFFSETS[field.name]} | {field.nbytes} | `{field.name}` | "
                     f"{field.meaning}{signed} |")
    return "\n".join(lines)
