"""The golden model of the aggregator: frame in, frames out, bit for bit what the gateware does.

It is also the software aggregator (`inwire serve`). Every input frame gets exactly one disposition
(`protocol.Disposition`) and produces at most one output frame:

- forwarded: the frame itself, unchanged;
- accumulated: nothing, or the result when it completed its slot;
- answered: the stored result (retransmitted contribution, result request) or a stats reply;
- dropped: nothing.

A frame acts atomically: a frame dropped for any reason leaves every slot as it was.
"""

from dataclasses import dataclass, field

import numpy as np

from .packets import build_frames, frame_field, ipv4_header_valid, mac_bytes, parse_header
from .protocol import (
    COUNTERS,
    ELEMENT_DTYPE,
    ETHERNET_BYTES,
    ETHERTYPE_IPV4,
    FRAME_HEADER_BYTES,
    INT32_MAX,
    INT32_MIN,
    INWIRE_PORT,
    IP_FRAGMENT_MASK,
    IP_PROTO_UDP,
    IP_VER_IHL,
    IPV4_BYTES,
    MAGIC,
    MAX_FANIN,
    MIN_FRAME_BYTES,
    STATUS_OVERFLOW,
    VERSION,
    Disposition,
    Opcode,
    frame_bytes,
    is_multicast_group,
    multicast_mac,
)

ACCEPTED_OPCODES = (Opcode.CONTRIBUTION, Opcode.RESULT_REQUEST, Opcode.STATS_REQUEST)


@dataclass(frozen=True)
class AggregatorConfig:
    """What an aggregator is: its addresses and its sizes (the gateware's parameters)."""
    mac: int = 0x02_49_57_00_00_01
    ip: int = 0x0A_49_57_01
    port: int = INWIRE_PORT
    slots: int = 16
    max_elements: int = 256
    max_fanin: int = MAX_FANIN

    def __post_init__(self):
        mac_bytes(self.mac)
        checks = {"ip": (self.ip, 0, 2**32 - 1), "port": (self.port, 1, 2**16 - 1),
                  "slots": (self.slots, 1, 2**16), "max_elements": (self.max_elements, 1, 2**16 - 1),
                  "max_fanin": (self.max_fanin, 1, MAX_FANIN)}
        for name, (value, low, high) in checks.items():
            if not isinstance(value, (int, np.integer)) or isinstance(value, bool):
                raise TypeError(f"aggregator {name} must be an integer, got {value!r}")
            if not low <= value <= high:
                raise ValueError(f"aggregator {name} must lie in [{low}, {high}], got {value}")


@dataclass
class Slot:
    key: tuple = None
    """(job, round, clique, chunk) of the slot's owner; None while the slot was never used."""
    fanin: int = 0
    group: int = 0
    count: int = 0
    exponent: int = 0
    bitmap: int = 0
    overflow: bool = False
    complete: bool = False
    sums: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))


def round_is_newer(candidate, current):
    """Serial-number comparison of 32-bit rounds, so that round numbers may wrap."""
    return 0 < ((candidate - current) & 0xFFFFFFFF) < 2**31


class Aggregator:
    """The aggregator's state and behaviour; `process(frame)` returns the frames it sends."""

    def __init__(self, config=None):
        self.config = config or AggregatorConfig()
        self.slots = [Slot() for _ in range(self.config.slots)]
        self.counters = dict.fromkeys(COUNTERS, 0)

    def process(self, frame):
        """Feed one frame (bytes, without FCS); returns the list of frames sent in answer (0 or 1)."""
        if not isinstance(frame, (bytes, bytearray, memoryview)):
            raise TypeError(f"a frame is bytes, got {type(frame).__name__}")
        disposition, output = self._classify_and_act(bytes(frame))
        self.counters["frames_in"] += 1
        self.counters[disposition.name.lower()] += 1
        return output

    def stats(self):
        """Counters as a dict, in COUNTERS order."""
        return dict(self.counters)

    def _classify_and_act(self, frame):
        if len(frame) < MIN_FRAME_BYTES:
            return Disposition.DROP_RUNT, []
        if not self._addressed_to_me(frame):
            return Disposition.FORWARDED, [frame]
        reason = self._malformed(frame)
        if reason is not None:
            return reason, []
        header = parse_header(frame)
        opcode = int(header["opcode"])
        if opcode == Opcode.STATS_REQUEST:
            return Disposition.ANSWERED, [self._stats_reply(header)]
        reason = self._bad_fields(header)
        if reason is not None:
            return reason, []
        if opcode == Opcode.RESULT_REQUEST:
            return self._result_request(header)
        elements = np.frombuffer(frame, dtype=ELEMENT_DTYPE, offset=FRAME_HEADER_BYTES)
        return self._contribution(header, elements)

    def _addressed_to_me(self, frame):
        return (frame_field(frame, "eth_type") == ETHERTYPE_IPV4 and frame_field(frame, "ip_proto") == IP_PROTO_UDP
                and frame_field(frame, "ip_dst") == self.config.ip
                and frame_field(frame, "udp_dport") == self.config.port)

    def _malformed(self, frame):
        """Checks of the IPv4, UDP and aggregation headers and of the frame length, in order."""
        if frame_field(frame, "ip_ver_ihl") != IP_VER_IHL:
            return Disposition.DROP_IP_HEADER
        if frame_field(frame, "ip_frag") & IP_FRAGMENT_MASK:
            return Disposition.DROP_IP_FRAGMENT
        if not ipv4_header_valid(frame):
            return Disposition.DROP_IP_CHECKSUM
        if len(frame) < FRAME_HEADER_BYTES:
            return Disposition.DROP_LENGTH
        header = parse_header(frame)
        if header["magic"] != MAGIC or header["version"] != VERSION:
            return Disposition.DROP_VERSION
        if header["opcode"] not in ACCEPTED_OPCODES:
            return Disposition.DROP_OPCODE
        expected = frame_bytes(int(header["count"]), int(header["opcode"]))
        if (len(frame) != expected or header["ip_len"] != expected - ETHERNET_BYTES
                or header["udp_len"] != expected - ETHERNET_BYTES - IPV4_BYTES):
            return Disposition.DROP_LENGTH
        return None

    def _bad_fields(self, header):
        config = self.config
        fanin = int(header["fanin"])
        if not 1 <= fanin <= config.max_fanin:
            return Disposition.DROP_FANIN
        if header["sender"] >= fanin:
            return Disposition.DROP_SENDER
        if not 1 <= header["count"] <= config.max_elements:
            return Disposition.DROP_COUNT
        if not is_multicast_group(header["group"]):
            return Disposition.DROP_GROUP
        if header["slot"] >= config.slots:
            return Disposition.DROP_SLOT
        return None

    def _contribution(self, header, elements):
        slot = self.slots[int(header["slot"])]
        key = _key(header)
        if slot.key == key:
            if (slot.fanin, slot.group, slot.count, slot.exponent) != _shape(header):
                return Disposition.DROP_MISMATCH, []
            if slot.complete:
                return Disposition.ANSWERED, [self._result(header, slot)]
            if slot.bitmap >> int(header["sender"]) & 1:
                return Disposition.DROP_DUPLICATE, []
        elif slot.key is None or slot.complete:
            self._claim(slot, header)
        elif header["job"] == slot.key[0] and round_is_newer(int(header["round"]), slot.key[1]):
            self.counters["slots_reclaimed"] += 1
            self._claim(slot, header)
        else:
            return Disposition.DROP_COLLISION, []

        total = slot.sums + elements
        saturated = (total > INT32_MAX) | (total < INT32_MIN)
        if saturated.any():
            self.counters["saturations"] += 1
            slot.overflow = True
        slot.sums = np.clip(total, INT32_MIN, INT32_MAX)
        slot.bitmap |= 1 << int(header["sender"])
        if slot.bitmap.bit_count() < slot.fanin:
            return Disposition.ACCUMULATED, []
        slot.complete = True
        return Disposition.ACCUMULATED, [self._result(header, slot)]

    def _result_request(self, header):
        slot = self.slots[int(header["slot"])]
        if slot.complete and slot.key == _key(header):
            return Disposition.ANSWERED, [self._result(header, slot)]
        return Disposition.DROP_NO_RESULT, []

    def _claim(self, slot, header):
        slot.key = _key(header)
        slot.fanin, slot.group, slot.count, slot.exponent = _shape(header)
        slot.bitmap = 0
        slot.overflow = False
        slot.complete = False
        slot.sums = np.zeros(slot.count, dtype=np.int64)

    def _result(self, header, slot):
        """The slot's result, multicast to its group; `header` is the frame that asked for it."""
        self.counters["results_emitted"] += 1
        job, round_, clique, chunk = slot.key
        frame = build_frames(
            slot.sums.astype(np.int32),
            eth_dst=multicast_mac(slot.group), eth_src=self.config.mac,
            ip_src=self.config.ip, ip_dst=slot.group,
            udp_sport=self.config.port, udp_dport=self.config.port,
            opcode=Opcode.RESULT, sender=int(header["sender"]), fanin=slot.fanin, exponent=slot.exponent,
            contributors=slot.bitmap.bit_count(), job=job, round=round_, clique=clique,
            slot=int(header["slot"]), chunk=chunk, group=slot.group, bitmap=slot.bitmap,
            status=STATUS_OVERFLOW if slot.overflow else 0,
        )
        return bytes(frame[0])

    def _stats_reply(self, header):
        """Counters as uint32 elements, sent back to the requester; they count every frame before it."""
        snapshot = np.array([self.counters[name] & 0xFFFFFFFF for name in COUNTERS], dtype=np.uint32)
        frame = build_frames(
            snapshot.view(np.int32),
            eth_dst=header["eth_src"], eth_src=self.config.mac,
            ip_src=self.config.ip, ip_dst=int(header["ip_src"]),
            udp_sport=self.config.port, udp_dport=int(header["udp_sport"]),
            opcode=Opcode.STATS_REPLY, sender=int(header["sender"]), job=int(header["job"]),
        )
        return bytes(frame[0])


def _key(header):
    return (int(header["job"]), int(header["round"]), int(header["clique"]), int(header["chunk"]))


def _shape(header):
    return (int(header["fanin"]), int(header["group"]), int(header["count"]), int(header["exponent"]))
