"""Vectorized building and parsing of aggregation frames with numpy: the host's fast path.

Frames are rows of a uint8 matrix; headers are records of `FRAME_HEADER_DTYPE`, so a whole round of
packets is built or parsed with a handful of array operations and no per-packet Python work.
"""

import numpy as np

from .protocol import (
    ELEMENT_BYTES,
    ELEMENT_DTYPE,
    ETHERNET_BYTES,
    ETHERTYPE_IPV4,
    FRAME_HEADER_BYTES,
    FRAME_HEADER_DTYPE,
    FRAME_OFFSETS,
    INT32_MAX,
    INT32_MIN,
    INWIRE_PORT,
    IP_FLAG_DF,
    IP_PROTO_UDP,
    IP_VER_IHL,
    IPV4_BYTES,
    MAGIC,
    RESULT_TRAILER_BYTES,
    RESULT_TTL,
    VERSION,
    Opcode,
    multicast_mac,
)

IP_OFFSET = FRAME_OFFSETS["ip_ver_ihl"]

HEADER_DEFAULTS = {
    "eth_type": ETHERTYPE_IPV4,
    "ip_ver_ihl": IP_VER_IHL,
    "ip_frag": IP_FLAG_DF,
    "ip_ttl": RESULT_TTL,
    "ip_proto": IP_PROTO_UDP,
    "udp_sport": INWIRE_PORT,
    "udp_dport": INWIRE_PORT,
    "magic": MAGIC,
    "version": VERSION,
    "opcode": Opcode.CONTRIBUTION,
}
"""Values every aggregation frame carries unless the caller says otherwise."""

DERIVED_FIELDS = ("ip_len", "ip_csum", "udp_len", "count")
"""Fields computed from the frame itself; `build_frames` refuses them as input."""


def mac_bytes(mac):
    """A MAC address given as an int, 'aa:bb:..' string, 6 bytes or 6 uint8s, as a uint8 array of 6."""
    if isinstance(mac, str):
        parts = mac.split(":")
        if len(parts) != 6:
            raise ValueError(f"MAC address {mac!r} is not six colon-separated bytes")
        return np.array([int(part, 16) for part in parts], dtype=np.uint8)
    if isinstance(mac, np.ndarray) and mac.dtype == np.uint8 and mac.shape == (6,):
        return mac.copy()
    if isinstance(mac, (bytes, bytearray)):
        if len(mac) != 6:
            raise ValueError(f"MAC address {mac!r} is not 6 bytes")
        return np.frombuffer(bytes(mac), dtype=np.uint8).copy()
    if isinstance(mac, (int, np.integer)) and 0 <= mac < 1 << 48:
        return np.frombuffer(int(mac).to_bytes(6, "big"), dtype=np.uint8).copy()
    raise ValueError(f"MAC address {mac!r} is neither a 48-bit int, a string nor 6 bytes")


def mac_int(mac_array):
    return int.from_bytes(bytes(np.asarray(mac_array, dtype=np.uint8)), "big")


def ones_complement_checksum(words):
    """Internet checksum over the last axis of an array of big-endian 16-bit words."""
    total = np.asarray(words, dtype=np.uint64).sum(axis=-1)
    if np.any(total >> 32):
        raise ValueError("more than 65536 words for a 16-bit ones' complement checksum")
    for _ in range(2):
        total = (total & 0xFFFF) + (total >> 16)
    return (~total & 0xFFFF).astype(np.uint16)


def ipv4_header_valid(frame):
    """Whether one frame's IPv4 header checksum is right (the frame must hold the whole header)."""
    header = np.frombuffer(bytes(frame[IP_OFFSET:IP_OFFSET + IPV4_BYTES]), dtype=">u2")
    return ones_complement_checksum(header) == 0


def ipv4_checksums(frames):
    """IPv4 header checksum of each frame row, computed as if its checksum field were zero."""
    header = np.array(frames[:, IP_OFFSET:IP_OFFSET + IPV4_BYTES], dtype=np.uint16)
    csum = FRAME_OFFSETS["ip_csum"] - IP_OFFSET
    header[:, csum:csum + 2] = 0
    words = (header[:, 0::2] << 8) | header[:, 1::2]
    return ones_complement_checksum(words)


def build_frames(elements, status=None, **fields):
    """Aggregation frames, one row per packet.

    `elements` is an (N, count) array of int32 values (or (count,) for one packet). Each keyword names
    a header field from the protocol table and gives a scalar or an array of N values; MAC fields take
    ints, strings or bytes. `status` (scalar or N values) appends a result's trailer. Lengths, element
    count and the IPv4 checksum are filled in; the UDP checksum is zero. Returns an (N, L) uint8 array,
    L = 128 + 4*count (+ 4 with a trailer).
    """
    elements = np.asarray(elements)
    if elements.ndim == 1:
        elements = elements[np.newaxis, :]
    if elements.ndim != 2:
        raise ValueError(f"elements must be a (packets, count) array, got shape {elements.shape}")
    if elements.dtype.kind not in "iu":
        raise TypeError(f"elements must be integers, got {elements.dtype}")
    if elements.size and (elements.min() < INT32_MIN or elements.max() > INT32_MAX):
        raise ValueError("elements must fit in int32")
    packets, count = elements.shape
    if count >= 1 << 16:
        raise ValueError(f"{count} elements do not fit the 16-bit count field")
    unknown = set(fields) - set(FRAME_HEADER_DTYPE.names)
    if unknown:
        raise ValueError(f"unknown header fields: {', '.join(sorted(unknown))}")
    derived = set(fields) & set(DERIVED_FIELDS)
    if derived:
        raise ValueError(f"fields computed from the frame cannot be given: {', '.join(sorted(derived))}")

    headers = np.zeros(packets, dtype=FRAME_HEADER_DTYPE)
    for name, value in {**HEADER_DEFAULTS, **fields}.items():
        if name in ("eth_dst", "eth_src"):
            value = _mac_column(value, packets)
        else:
            value = _integer_column(name, value, packets)
        headers[name] = value
    trailer = 0 if status is None else RESULT_TRAILER_BYTES
    frame_length = FRAME_HEADER_BYTES + ELEMENT_BYTES * count + trailer
    headers["ip_len"] = frame_length - ETHERNET_BYTES
    headers["udp_len"] = frame_length - ETHERNET_BYTES - IPV4_BYTES
    headers["count"] = count

    frames = np.empty((packets, frame_length), dtype=np.uint8)
    frames[:, :FRAME_HEADER_BYTES] = headers.view(np.uint8).reshape(packets, FRAME_HEADER_BYTES)
    element_end = frame_length - trailer
    frames[:, FRAME_HEADER_BYTES:element_end] = elements.astype(ELEMENT_DTYPE).view(np.uint8).reshape(packets, -1)
    if trailer:
        status = _integer_column("status", status, packets, np.dtype(">u4"))
        frames[:, element_end:] = np.broadcast_to(status, packets).astype(">u4").view(np.uint8).reshape(packets, -1)
    csum = FRAME_OFFSETS["ip_csum"]
    checksums = ipv4_checksums(frames)
    frames[:, csum] = checksums >> 8
    frames[:, csum + 1] = checksums & 0xFF
    return frames


def _mac_column(value, packets):
    if isinstance(value, np.ndarray) and value.ndim == 2:
        if value.shape != (packets, 6):
            raise ValueError(f"MAC array must have shape ({packets}, 6), got {value.shape}")
        return value.astype(np.uint8)
    if isinstance(value, (list, tuple)) or (isinstance(value, np.ndarray) and value.dtype != np.uint8):
        if len(value) != packets:
            raise ValueError(f"{len(value)} MAC addresses given for {packets} packets")
        return np.stack([mac_bytes(mac) for mac in value])
    return np.broadcast_to(mac_bytes(value), (packets, 6))


_FIELD_LIMITS = {name: np.iinfo(FRAME_HEADER_DTYPE[name].base) for name in FRAME_HEADER_DTYPE.names}


def _integer_column(name, value, packets, dtype=None):
    if dtype is None:
        dtype, info = FRAME_HEADER_DTYPE[name], _FIELD_LIMITS[name]
    else:
        info = np.iinfo(dtype.base)
    if isinstance(value, (int, np.integer)) and not dtype.shape:
        # The common scalar case, checked without building arrays: results are built one at a time.
        if not info.min <= value <= info.max:
            raise ValueError(f"header field {name} must lie in [{info.min}, {info.max}]")
        return value
    value = np.asarray(value)
    if value.dtype.kind not in "iub":
        raise TypeError(f"header field {name} must be an integer, got {value.dtype}")
    if dtype.shape:
        if value.shape[-1:] != dtype.shape:
            raise ValueError(f"header field {name} takes {dtype.shape[0]} bytes, got shape {value.shape}")
    elif value.ndim > 1 or (value.ndim == 1 and len(value) != packets):
        raise ValueError(f"header field {name} needs a scalar or {packets} values, got shape {value.shape}")
    if value.size and (value.min() < info.min or value.max() > info.max):
        raise ValueError(f"header field {name} must lie in [{info.min}, {info.max}]")
    return value


def parse_frames(frames):
    """Headers and elements of equal-length frames: ((N,) FRAME_HEADER_DTYPE records, (N, count) int32).

    The count comes from the frame length; checking it against the header is the caller's business.
    """
    frames = np.ascontiguousarray(frames, dtype=np.uint8)
    if frames.ndim == 1:
        frames = frames[np.newaxis, :]
    if frames.ndim != 2 or frames.shape[1] < FRAME_HEADER_BYTES:
        raise ValueError(f"frames must be an (N, L) byte array with L >= {FRAME_HEADER_BYTES}, "
                         f"got shape {frames.shape}")
    if (frames.shape[1] - FRAME_HEADER_BYTES) % ELEMENT_BYTES:
        raise ValueError(f"frame length {frames.shape[1]} leaves a partial element after the header")
    headers = frames[:, :FRAME_HEADER_BYTES].copy().view(FRAME_HEADER_DTYPE).reshape(-1)
    elements = frames[:, FRAME_HEADER_BYTES:].copy().view(ELEMENT_DTYPE).astype(np.int32)
    return headers, elements


def frame_field(frame, name):
    """Unsigned value of header field `name` read straight from a frame's bytes (which must reach it)."""
    offset = FRAME_OFFSETS[name]
    return int.from_bytes(frame[offset:offset + FRAME_HEADER_DTYPE[name].itemsize], "big")


def parse_header(frame):
    """The 128-byte header of one frame as a FRAME_HEADER_DTYPE record (frame must be long enough)."""
    return np.frombuffer(bytes(frame[:FRAME_HEADER_BYTES]), dtype=FRAME_HEADER_DTYPE)[0]


def group_macs(groups):
    """Multicast MACs of an array of IPv4 groups, as an (N, 6) uint8 array."""
    groups = np.atleast_1d(np.asarray(groups, dtype=np.uint64))
    macs = np.uint64(multicast_mac(0)) | (groups & np.uint64(0x7FFFFF))
    shifts = np.arange(40, -8, -8, dtype=np.uint64)
    return ((macs[:, np.newaxis] >> shifts) & np.uint64(0xFF)).astype(np.uint8)
