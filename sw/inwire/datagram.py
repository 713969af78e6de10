"""The datagram layer: an aggregation header and its elements as the UDP payload a host sends and receives.

On the wire the payload starts at PAYLOAD_OFFSET (42: Ethernet + IPv4 + UDP), where the frame's `magic`
field is. Hosts with a kernel UDP stack see only the payload; the golden model and the gateware see whole
frames. `wrap` makes the frame that carries a payload; `parse_result`, `parse_stats_reply` and
`parse_payload_header` read payloads without padding them back into frames.
"""

import ipaddress
import os
import socket
import struct
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from .packets import HEADER_DEFAULTS, build_frames
from .protocol import (
    AGGREGATION_FIELDS,
    COUNTERS,
    ELEMENT_BYTES,
    ELEMENT_DTYPE,
    ETHERNET_BYTES,
    FRAME_HEADER_BYTES,
    FRAME_HEADER_DTYPE,
    FRAME_OFFSETS,
    IPV4_BYTES,
    MAGIC,
    RESULT_TRAILER_BYTES,
    STATUS_OVERFLOW,
    UDP_BYTES,
    VERSION,
    VERSIONS,
    Opcode,
)

PAYLOAD_OFFSET = FRAME_OFFSETS["magic"]
"""Where the UDP payload (the aggregation header) starts in a frame: Ethernet + IPv4 + UDP, 42 bytes."""
assert PAYLOAD_OFFSET == ETHERNET_BYTES + IPV4_BYTES + UDP_BYTES
PAYLOAD_HEADER_BYTES = FRAME_HEADER_BYTES - PAYLOAD_OFFSET
"""The aggregation header's length, where a payload's elements start."""
# A structured dtype always has its names and fields; numpy's stubs allow None for any dtype.
_FRAME_FIELDS: Mapping[str, tuple[Any, ...]] = FRAME_HEADER_DTYPE.fields or {}
_PAYLOAD_FIELDS = [name for name in FRAME_HEADER_DTYPE.names or () if _FRAME_FIELDS[name][1] >= PAYLOAD_OFFSET]
PAYLOAD_HEADER_DTYPE: np.dtype[np.void] = np.dtype({
    "names": _PAYLOAD_FIELDS,
    "formats": [_FRAME_FIELDS[name][0] for name in _PAYLOAD_FIELDS],
    "offsets": [_FRAME_FIELDS[name][1] - PAYLOAD_OFFSET for name in _PAYLOAD_FIELDS],
    "itemsize": PAYLOAD_HEADER_BYTES,
})
"""The aggregation header's fields, `magic` to `reserved`, at their offsets within a payload."""
_UNSIGNED_CODES = {1: "B", 2: "H", 4: "I", 8: "Q"}
_FIELD_NAMES = [field.name for field in AGGREGATION_FIELDS]


def header_struct(first: str, last: str) -> struct.Struct:
    """The aggregation header's fields `first` to `last` (included) as one big-endian struct."""
    fields = AGGREGATION_FIELDS[_FIELD_NAMES.index(first):_FIELD_NAMES.index(last) + 1]
    return struct.Struct("!" + "".join(_UNSIGNED_CODES[field.nbytes].lower() if field.signed
                                       else _UNSIGNED_CODES[field.nbytes] for field in fields))


def payload_at(name: str) -> int:
    """Where aggregation header field `name` starts within a payload."""
    return FRAME_OFFSETS[name] - PAYLOAD_OFFSET


HEADER = header_struct("magic", "bitmap")
"""The fields from `magic` to `bitmap`, in table order: an output's fields before its route (`expect` and the
hops), and all a host reads of a result (`inwire stream` does)."""
SENDER_AT = payload_at("sender")
MAX_DATAGRAM = 65535
Address = tuple[str, int]
"""A UDP endpoint as sockets take it: (dotted IPv4 address, port)."""
Payload = bytes | bytearray | memoryview
"""A UDP payload as it is read: its own bytes, or a view of a receive buffer."""
PEER_MAC = bytes.fromhex("020000000000")
"""Source MAC of wrapped datagrams whose sender's MAC is unknown (the kernel hides it; the model ignores it)."""

ISLAND_NETWORK = int(ipaddress.IPv4Address("10.73.1.0"))
"""Island i of a capture or of a segment (`pcap:`, `sim:`, `iface:`) has address 10.73.1.(i+1) ..."""
ISLAND_MAC_BASE = 0x02_49_57_01_00_00
"""... and MAC 02:49:57:01:00:i."""


def island_address(index: int) -> tuple[str, int]:
    """(dotted IPv4 address, MAC as an int) of island `index` on a capture or an Ethernet segment."""
    return ip_str(ISLAND_NETWORK + index + 1), ISLAND_MAC_BASE + index


def ip_int(address: str) -> int:
    return int(ipaddress.IPv4Address(address))


def ip_str(value: int) -> str:
    return str(ipaddress.IPv4Address(int(value)))


def parse_endpoint(text: object, what: str = "address") -> Address:
    """'HOST:PORT' as (dotted IPv4 address, port); the host may be a name that resolves to IPv4."""
    host, sep, port_text = str(text).rpartition(":")
    if not sep or not host:
        raise ValueError(f"{what} {text!r} is not HOST:PORT")
    if host.startswith("[") or ":" in host:
        raise ValueError(f"{what} {text!r}: IPv4 only (the protocol carries IPv4 addresses and groups); "
                         f"use an IPv4 address or a name that resolves to one")
    try:
        port = int(port_text)
    except ValueError:
        raise ValueError(f"{what} {text!r}: port {port_text!r} is not a number") from None
    if not 0 <= port <= 65535:
        raise ValueError(f"{what} {text!r}: port {port} is outside 0-65535")
    try:
        address = str(socket.getaddrinfo(host, port, socket.AF_INET, socket.SOCK_DGRAM)[0][4][0])
    except (socket.gaierror, UnicodeError) as error:
        raise ValueError(f"{what} {text!r}: cannot resolve {host!r} ({error})") from None
    return address, port


def set_receive_buffer(sock: socket.socket, size: int) -> int:
    """Ask for an SO_RCVBUF of `size` bytes (forced past net.core.rmem_max where the process may); returns
    what the kernel granted."""
    try:
        # Linux only (elsewhere the AttributeError below), and typeshed does not list it.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUFFORCE, size)  # type: ignore[attr-defined]
    except (OSError, AttributeError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, size)
    return sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)


_HEADER = struct.Struct("!6s6sHBBHHHBBH4s4sHHHH")


def wrap(payload: Payload, source: Address, destination: Address, dst_mac: bytes,
         src_mac: bytes = PEER_MAC) -> bytes:
    """The Ethernet frame that carries `payload` from `source` to `destination` ((ip, port) pairs), with the
    header values `packets.build_frames` uses too (IPv4 without options, don't-fragment, TTL 64)."""
    ip_len = IPV4_BYTES + UDP_BYTES + len(payload)
    src_ip = socket.inet_aton(source[0])
    dst_ip = socket.inet_aton(destination[0])
    fixed = HEADER_DEFAULTS
    header = bytearray(_HEADER.pack(dst_mac, src_mac, fixed["eth_type"], fixed["ip_ver_ihl"], 0, ip_len & 0xFFFF, 0,
                                    fixed["ip_frag"], fixed["ip_ttl"], fixed["ip_proto"], 0, src_ip, dst_ip,
                                    source[1], destination[1], (UDP_BYTES + len(payload)) & 0xFFFF, 0))
    total = sum(struct.unpack_from("!10H", header, ETHERNET_BYTES))
    total = (total & 0xFFFF) + (total >> 16)
    total = (total & 0xFFFF) + (total >> 16)
    struct.pack_into("!H", header, ETHERNET_BYTES + 10, ~total & 0xFFFF)
    return bytes(header) + bytes(payload)


def payload_of(frame: bytes | bytearray | memoryview | npt.NDArray[np.uint8]) -> bytes:
    """The UDP payload of a frame (from the aggregation header on)."""
    return bytes(frame[PAYLOAD_OFFSET:])


def payloads_of(frames: npt.ArrayLike) -> list[bytes]:
    """UDP payloads of the rows of a frame matrix (`packets.build_frames`), as bytes."""
    return [bytes(row) for row in np.asarray(frames)[:, PAYLOAD_OFFSET:]]


def opcode_of(payload: Payload) -> int | None:
    """The opcode byte of a payload, or None when it is too short to have one."""
    at = FRAME_OFFSETS["opcode"] - PAYLOAD_OFFSET
    return payload[at] if len(payload) > at else None


def parse_payload_header(payload: Payload) -> np.void | None:
    """The aggregation header of a payload as a record of PAYLOAD_HEADER_DTYPE (the frame header's fields
    from `magic` on), or None when the payload is too short or lacks the inwire magic and a known version
    (1 or 2: an aggregator answers a version 1 frame in version 1)."""
    if len(payload) < PAYLOAD_HEADER_BYTES:
        return None
    header = np.frombuffer(bytes(payload[:PAYLOAD_HEADER_BYTES]), dtype=PAYLOAD_HEADER_DTYPE)[0]
    if header["magic"] != MAGIC or header["version"] not in VERSIONS:
        return None
    return header


@dataclass(frozen=True)
class Result:
    """A result payload read: its header record, the sums (int64) and the overflow flag of its status."""
    header: np.void
    elements: npt.NDArray[np.int64]
    overflow: bool


def parse_result(payload: Payload, opcode: int = Opcode.RESULT) -> Result | None:
    """A result payload (version 1 or 2) as a `Result`, or None when it is not a whole, well-formed result;
    with `opcode=Opcode.PARTIAL`, a partial the same way (it has a result's layout)."""
    header = parse_payload_header(payload)
    if header is None or header["opcode"] != opcode:
        return None
    count = int(header["count"])
    if len(payload) != PAYLOAD_HEADER_BYTES + ELEMENT_BYTES * count + RESULT_TRAILER_BYTES:
        return None
    elements = np.frombuffer(payload, dtype=ELEMENT_DTYPE, count=count, offset=PAYLOAD_HEADER_BYTES)
    status = int.from_bytes(payload[-RESULT_TRAILER_BYTES:], "big")
    return Result(header, elements.astype(np.int64), bool(status & STATUS_OVERFLOW))


def stats_request(job: int = 0, sender: int = 0, version: int = VERSION, token: int = 0) -> bytes:
    """The UDP payload of a stats request. A version 3 one is answered only with its job's `token`, from one
    of the job's members."""
    return payload_of(build_frames(np.zeros((1, 0), dtype=np.int32), opcode=Opcode.STATS_REQUEST, job=job,
                                   sender=sender, version=version, token=token)[0])


def parse_stats_reply(payload: Payload) -> dict[str, int] | None:
    """Counters of a stats reply payload as a dict, or None when it is not one."""
    header = parse_payload_header(payload)
    if (header is None or header["opcode"] != Opcode.STATS_REPLY
            or len(payload) != PAYLOAD_HEADER_BYTES + ELEMENT_BYTES * len(COUNTERS)):
        return None
    values = np.frombuffer(payload, dtype=">u4", offset=PAYLOAD_HEADER_BYTES)
    return dict(zip(COUNTERS, (int(v) for v in values), strict=True))


PROC_NET_UDP = "/proc/net/udp"
"""Linux lists every IPv4 UDP socket of the network namespace here, with the datagrams the kernel dropped
because the socket's receive buffer was full (its last column, `drops`)."""


def _udp_sockets() -> list[tuple[str, int, int, int]]:
    """(local address, port, inode, drops) of every IPv4 UDP socket in /proc/net/udp; empty where the OS
    does not give it."""
    try:
        with open(PROC_NET_UDP) as table:
            lines = table.read().splitlines()[1:]
    except OSError:
        return []
    sockets = []
    for line in lines:
        fields = line.split()
        if len(fields) < 13:
            continue
        address, _, port = fields[1].partition(":")
        # The address is the in-memory u32 of the kernel, printed in hex: little-endian on x86 and ARM.
        ip = socket.inet_ntoa(int(address, 16).to_bytes(4, sys.byteorder))
        sockets.append((ip, int(port, 16), int(fields[9]), int(fields[12])))
    return sockets


def socket_drops(sock: socket.socket) -> int | None:
    """Datagrams the kernel dropped for this socket (receive buffer full), or None where the OS does not
    say."""
    inode = os.fstat(sock.fileno()).st_ino
    return next((drops for _, _, node, drops in _udp_sockets() if node == inode), None)


def endpoint_drops(address: Address) -> int | None:
    """Datagrams dropped by the kernel for the UDP socket bound to `address` ((ip, port)) on this machine,
    or None when no such socket is visible here (another machine or namespace)."""
    ip, port = address
    found = [drops for bound, bound_port, _, drops in _udp_sockets()
             if bound_port == port and bound in (ip, "0.0.0.0")]
    return sum(found) if found else None
