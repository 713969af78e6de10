"""Reading and writing captures of Ethernet frames (pcap and pcapng) as raw bytes."""

import logging
import struct

from scapy.error import Scapy_Exception
from scapy.utils import RawPcapReader, RawPcapWriter

from .errors import InwireError

LINKTYPE_ETHERNET = 1
PCAP_MAGICS = {b"\xa1\xb2\xc3\xd4": ">", b"\xd4\xc3\xb2\xa1": "<", b"\xa1\xb2\x3c\x4d": ">",
               b"\x4d\x3c\xb2\xa1": "<"}
"""First four bytes of a classic pcap (microsecond or nanosecond timestamps) -> byte order."""
PCAPNG_SECTION = b"\x0a\x0d\x0d\x0a"


class CaptureError(InwireError):
    """A capture that cannot be read; the message names the file and the reason."""


def read_frames(path):
    """Every frame of an Ethernet capture, as bytes, in order."""
    try:
        reader = RawPcapReader(str(path))
    except FileNotFoundError:
        raise CaptureError(f"{path}: no such file") from None
    except (Scapy_Exception, OSError, EOFError, ValueError) as error:
        raise CaptureError(f"{path}: not a readable pcap or pcapng capture ({error})") from None
    with reader:
        linktype = getattr(reader, "linktype", LINKTYPE_ETHERNET)
        if linktype != LINKTYPE_ETHERNET:
            raise CaptureError(f"{path}: link type {linktype} is not Ethernet")
        # scapy logs a warning for a cut frame; the one-line error below says it instead.
        logger = logging.getLogger("scapy.runtime")
        level = logger.level
        logger.setLevel(logging.ERROR)
        try:
            frames = [bytes(frame) for frame, _metadata in reader]
        except (Scapy_Exception, OSError, EOFError, ValueError) as error:
            raise CaptureError(f"{path}: capture is damaged ({error})") from None
        finally:
            logger.setLevel(level)
    problem = _problem(path)
    if problem:
        raise CaptureError(f"{path}: {problem}")
    return frames


PCAPNG_BLOCKS = {1: ("an interface description", 8), 6: ("an enhanced packet", 20), 3: ("a simple packet", 4),
                 2: ("a packet", 20)}
"""pcapng block type -> (its name, the bytes of its fixed fields), for the blocks checked below."""


def _problem(path):
    """What scapy reads past without an error, or None: a last record or block cut short (scapy hands back
    a cut frame), a pcapng packet block that names no described interface (scapy skips it) or is too short
    for its fields (scapy ends the capture there), an interface that is not Ethernet (scapy takes the first
    interface's link type for all)."""
    with open(path, "rb") as handle:
        data = handle.read()
    order = PCAP_MAGICS.get(data[:4])
    if order is not None:
        at, record = 24, struct.Struct(order + "IIII")
        while at < len(data):
            if at + record.size > len(data):
                return (f"capture is truncated (a record header of {len(data) - at} of {record.size} bytes at "
                        f"offset {at})")
            length = record.unpack_from(data, at)[2]
            if at + record.size + length > len(data):
                return (f"capture is truncated (a frame of {len(data) - at - record.size} of {length} bytes at "
                        f"offset {at})")
            at += record.size + length
        return None
    if data[:4] == PCAPNG_SECTION and len(data) >= 12:
        at, block, interfaces = 0, 0, []
        while at < len(data):
            if at + 8 > len(data):
                return f"capture is truncated (a block header of {len(data) - at} of 8 bytes at offset {at})"
            if data[at:at + 4] == PCAPNG_SECTION and at + 12 <= len(data):
                # Each section has its own byte order and numbers its own interfaces from 0.
                order = "<" if data[at + 8:at + 12] == b"\x4d\x3c\x2b\x1a" else ">"
                interfaces = []
            kind, length = struct.unpack_from(order + "II", data, at)
            if length < 12 or at + length > len(data):
                return f"capture is truncated (a block of {len(data) - at} of {length} bytes at offset {at})"
            if kind in PCAPNG_BLOCKS:
                name, fields = PCAPNG_BLOCKS[kind]
                where = f"block {block} ({name} block at offset {at})"
                if length - 12 < fields:
                    return f"{where} has {length - 12} bytes, fewer than the {fields} of its fields"
                if kind == 1:
                    interfaces.append(struct.unpack_from(order + "H", data, at + 8)[0])
                    if interfaces[-1] != LINKTYPE_ETHERNET:
                        return f"{where}: link type {interfaces[-1]} is not Ethernet"
                else:
                    interface = 0 if kind == 3 else struct.unpack_from(order + ("H" if kind == 2 else "I"), data,
                                                                       at + 8)[0]
                    if interface >= len(interfaces):
                        described = ("no interface" if not interfaces else "only interface 0" if len(interfaces) == 1
                                     else f"only interfaces 0 to {len(interfaces) - 1}")
                        return f"{where} names interface {interface}, but its section describes {described} before it"
            at += length
            block += 1
    return None


def write_frames(path, frames):
    """Write frames (bytes) to a pcap capture with Ethernet link type."""
    with RawPcapWriter(str(path), linktype=LINKTYPE_ETHERNET, sync=True) as writer:
        for frame in frames:
            writer.write(bytes(frame))
