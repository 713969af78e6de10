"""Frames as plain dicts, for `inwire decode` and for people reading captures.

Decoding is passive: it needs no aggregator address. Any UDP datagram to or from INWIRE_PORT is taken as
aggregation traffic and is "malformed" when its header or lengths do not hold together; everything else
is "other". Nothing a frame holds can make decoding raise.
"""

import ipaddress

import numpy as np

from .packets import frame_field, ipv4_header_valid, parse_header
from .protocol import (
    COUNTERS,
    ELEMENT_DTYPE,
    ETHERNET_BYTES,
    ETHERTYPE_IPV4,
    FRAME_HEADER_BYTES,
    FRAME_OFFSETS,
    INWIRE_PORT,
    IP_PROTO_UDP,
    IP_VER_IHL,
    IPV4_BYTES,
    MAGIC,
    REQUEST_OPCODES,
    RESULT_TRAILER_BYTES,
    STATUS_OVERFLOW,
    TRAILER_OPCODES,
    VERSIONS,
    Opcode,
    frame_bytes,
)

HEADER_KEYS = ("version", "job", "round", "clique", "slot", "chunk", "sender", "fanin", "exponent", "count")
RESULT_KEYS = ("bitmap", "contributors")
"""Of a result or partial: the members summed; a partial and a result also end with the status trailer."""
TREE_KEYS = ("bitmap", "expect", "hop1", "hop1_expect", "hop2", "hop2_expect")
"""Of a version 2 contribution, partial or result request: the members it holds and its route. A version 1
frame has none (an aggregator ignores those bytes), so they are not shown."""
TREE_OPCODES = (Opcode.CONTRIBUTION, Opcode.PARTIAL, Opcode.RESULT_REQUEST)
ADDRESS_KEYS = ("group", "hop1", "hop2")
UDP_PORTS_END = FRAME_OFFSETS["udp_dport"] + 2
"""A frame must reach this far for its UDP ports to be read."""


def describe_frame(frame):
    """A JSON-ready dict: `kind` and, for aggregation frames, the header fields and elements."""
    frame = bytes(frame)
    if not _is_aggregation_traffic(frame):
        return {"kind": "other", "length": len(frame)}
    problem = _malformation(frame)
    if problem:
        return {"kind": "malformed", "length": len(frame), "reason": problem}
    header = parse_header(frame)
    opcode = Opcode(int(header["opcode"]))
    # A request's count names the slot's vector; the request itself is the bare header.
    count = 0 if opcode in REQUEST_OPCODES else int(header["count"])
    elements = np.frombuffer(frame, dtype=ELEMENT_DTYPE, count=count, offset=FRAME_HEADER_BYTES)
    described = {"kind": opcode.name.lower(), "length": len(frame)}
    described.update({key: int(header[key]) for key in HEADER_KEYS})
    described["group"] = int(header["group"])
    if opcode in TREE_OPCODES and described["version"] != VERSIONS[0]:
        described.update({key: int(header[key]) for key in TREE_KEYS})
    if opcode in TRAILER_OPCODES:
        described.update({key: int(header[key]) for key in RESULT_KEYS})
        status = int.from_bytes(frame[-RESULT_TRAILER_BYTES:], "big")
        described["overflow"] = bool(status & STATUS_OVERFLOW)
    for key in ADDRESS_KEYS:
        if key in described:
            described[key] = str(ipaddress.IPv4Address(described[key]))
    if opcode == Opcode.STATS_REPLY:
        described["counters"] = dict(zip(COUNTERS, elements.astype(np.uint32).tolist(), strict=False))
    else:
        described["elements"] = elements.tolist()
    return described


def _is_aggregation_traffic(frame):
    if len(frame) < UDP_PORTS_END:
        return False
    ports = (frame_field(frame, "udp_sport"), frame_field(frame, "udp_dport"))
    return (frame_field(frame, "eth_type") == ETHERTYPE_IPV4 and frame_field(frame, "ip_proto") == IP_PROTO_UDP
            and INWIRE_PORT in ports)


def _malformation(frame):
    if frame[FRAME_OFFSETS["ip_ver_ihl"]] != IP_VER_IHL:
        return "IPv4 version or header length"
    if not ipv4_header_valid(frame):
        return "IPv4 checksum"
    if len(frame) < FRAME_HEADER_BYTES:
        return f"{len(frame)} bytes is shorter than the {FRAME_HEADER_BYTES}-byte header"
    header = parse_header(frame)
    if header["magic"] != MAGIC or header["version"] not in VERSIONS:
        return "magic or version"
    if header["opcode"] not in set(Opcode):
        return f"opcode {int(header['opcode'])}"
    expected = frame_bytes(int(header["count"]), Opcode(int(header["opcode"])))
    if len(frame) != expected:
        return f"{len(frame)} bytes where the header implies {expected}"
    if header["ip_len"] != expected - ETHERNET_BYTES or header["udp_len"] != expected - ETHERNET_BYTES - IPV4_BYTES:
        return "IPv4 or UDP length"
    return None
