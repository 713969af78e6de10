"""Reading and writing captures of Ethernet frames (pcap and pcapng) as raw bytes."""

import logging
import os
import struct

from scapy.error import Scapy_Exception
from scapy.utils import RawPcapReader, RawPcapWriter

from .errors import InwireError
from .inputs import open_regular

LINKTYPE_ETHERNET = 1
PCAP_MAGICS = {b"\xa1\xb2\xc3\xd4": ">", b"\xd4\xc3\xb2\xa1": "<", b"\xa1\xb2\x3c\x4d": ">",
               b"\x4d\x3c\xb2\xa1": "<"}
"""First four bytes of a classic pcap (microsecond or nanosecond timestamps) -> byte order."""
PCAPNG_SECTION = b"\x0a\x0d\x0d\x0a"


class CaptureError(InwireError):
    """A capture that cannot be read; the message names the file and the reason."""


MAX_RECORD_BYTES = 262144
"""The largest frame a record may hold: libpcap's largest snapshot length. A longer one is damage (or a sparse file's
garbage), not a frame, and would be read into memory whole."""


def read_frames(path):
    """Every frame of an Ethernet capture, as bytes, in order.

    The records or blocks are checked first, header by header, skipping over the frames: a capture is
    refused at its first bad one (a record header of zeros, a frame longer than MAX_RECORD_BYTES or cut
    short), so that a file of zeros behind a capture header (a sparse file of any size) is refused at once,
    not after a pass over hundreds of millions of empty records. An empty record with a time is a record:
    decode shows it, replay refuses it."""
    with open_regular(path, "capture", CaptureError, "a pcap or pcapng file") as handle:
        problem = _problem(handle, os.fstat(handle.fileno()).st_size)
    if problem:
        raise CaptureError(f"{path}: {problem}")
    try:
        reader = RawPcapReader(str(path))
    except (Scapy_Exception, OSError, EOFError, ValueError) as error:
        raise CaptureError(f"{path}: not a readable pcap or pcapng capture ({error})") from None
    with reader:
        linktype = getattr(reader, "linktype", LINKTYPE_ETHERNET)
        if linktype != LINKTYPE_ETHERNET:
            raise CaptureError(f"{path}: link type {linktype} is not Ethernet")
        # scapy logs a warning for a cut frame; _problem has refused those already.
        logger = logging.getLogger("scapy.runtime")
        level = logger.level
        logger.setLevel(logging.ERROR)
        try:
            return [bytes(frame) for frame, _metadata in reader]
        except (Scapy_Exception, OSError, EOFError, ValueError) as error:
            raise CaptureError(f"{path}: capture is damaged ({error})") from None
        finally:
            logger.setLevel(level)


PCAPNG_BLOCKS = {1: ("an interface description", 8), 6: ("an enhanced packet", 20), 3: ("a simple packet", 4),
                 2: ("a packet", 20)}
"""pcapng block type -> (its name, the bytes of its fixed fields), for the blocks checked below."""


def _problem(handle, size):
    """The first thing wrong with the capture open in `handle` (of `size` bytes), or None; what scapy reads
    past without an error, or takes a long time over: a pcap record header of 16 zero bytes (the zeros of a
    sparse file: as records, hundreds of millions of empty ones), a frame longer than MAX_RECORD_BYTES, a
    last record or block cut short (scapy hands back a cut frame), a pcapng packet block that names no
    described interface (scapy skips it) or is too short for its fields (scapy ends the capture there), an
    interface that is not Ethernet (scapy takes the first interface's link type for all). A file of neither
    format is left to scapy to refuse."""
    start = handle.read(12)
    order = PCAP_MAGICS.get(start[:4])
    if order is not None:
        return _pcap_problem(handle, size, order)
    if start[:4] == PCAPNG_SECTION and len(start) >= 12:
        return _pcapng_problem(handle, size)
    return None


def _pcap_problem(handle, size, order):
    at, record = 24, struct.Struct(order + "IIII")
    index = 0
    while at < size:
        handle.seek(at)
        header = handle.read(record.size)
        if len(header) < record.size:
            return f"capture is truncated (a record header of {len(header)} of {record.size} bytes at offset {at})"
        if header == bytes(record.size):
            return (f"record {index} (at offset {at}) is {record.size} zero bytes, no record header (no time, no "
                    f"frame): zeros past the end of the capture, as in a preallocated or sparse file")
        length = record.unpack(header)[2]
        if length > MAX_RECORD_BYTES:
            return (f"record {index} (at offset {at}) claims {length:,} bytes, more than the {MAX_RECORD_BYTES:,} "
                    f"of any capture's frame")
        if at + record.size + length > size:
            return f"capture is truncated (a frame of {size - at - record.size} of {length} bytes at offset {at})"
        at += record.size + length
        index += 1
    return None


def _pcapng_problem(handle, size):
    at, block, interfaces, order = 0, 0, [], "<"
    while at < size:
        handle.seek(at)
        # The fixed fields of every block checked, and the section header's byte-order magic.
        head = handle.read(28)
        if len(head) < 8:
            return f"capture is truncated (a block header of {len(head)} of 8 bytes at offset {at})"
        if head[:4] == PCAPNG_SECTION and len(head) >= 12:
            # Each section has its own byte order and numbers its own interfaces from 0.
            order = "<" if head[8:12] == b"\x4d\x3c\x2b\x1a" else ">"
            interfaces = []
        kind, length = struct.unpack_from(order + "II", head)
        if length < 12 or at + length > size:
            return f"capture is truncated (a block of {size - at} of {length} bytes at offset {at})"
        if kind in PCAPNG_BLOCKS:
            name, fields = PCAPNG_BLOCKS[kind]
            where = f"block {block} ({name} block at offset {at})"
            if length - 12 < fields:
                return f"{where} has {length - 12} bytes, fewer than the {fields} of its fields"
            if kind == 1:
                interfaces.append(struct.unpack_from(order + "H", head, 8)[0])
                if interfaces[-1] != LINKTYPE_ETHERNET:
                    return f"{where}: link type {interfaces[-1]} is not Ethernet"
            else:
                interface = 0 if kind == 3 else struct.unpack_from(order + ("H" if kind == 2 else "I"), head, 8)[0]
                if interface >= len(interfaces):
                    described = ("no interface" if not interfaces else "only interface 0" if len(interfaces) == 1
                                 else f"only interfaces 0 to {len(interfaces) - 1}")
                    return f"{where} names interface {interface}, but its section describes {described} before it"
                captured = struct.unpack_from(order + "I", head, 8 if kind == 3 else 20)[0]
                if captured > MAX_RECORD_BYTES:
                    return (f"{where} claims {captured:,} bytes, more than the {MAX_RECORD_BYTES:,} of any "
                            f"capture's frame")
        at += length
        block += 1
    return None


def write_frames(path, frames):
    """Write frames (bytes) to a pcap capture with Ethernet link type."""
    with RawPcapWriter(str(path), linktype=LINKTYPE_ETHERNET, sync=True) as writer:
        for frame in frames:
            writer.write(bytes(frame))
