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
    missing = _truncation(path)
    if missing:
        raise CaptureError(f"{path}: capture is truncated ({missing})")
    return frames


def _truncation(path):
    """What is missing at the end of a capture whose last record or block was cut short, or None when every
    record is whole. scapy reads such a capture without an error, handing back a cut frame."""
    with open(path, "rb") as handle:
        data = handle.read()
    order = PCAP_MAGICS.get(data[:4])
    if order is not None:
        at, record = 24, struct.Struct(order + "IIII")
        while at < len(data):
            if at + record.size > len(data):
                return f"a record header of {len(data) - at} of {record.size} bytes at offset {at}"
            length = record.unpack_from(data, at)[2]
            if at + record.size + length > len(data):
                return f"a frame of {len(data) - at - record.size} of {length} bytes at offset {at}"
            at += record.size + length
        return None
    if data[:4] == PCAPNG_SECTION and len(data) >= 12:
        order = "<" if data[8:12] == b"\x4d\x3c\x2b\x1a" else ">"
        at = 0
        while at < len(data):
            if at + 8 > len(data):
                return f"a block header of {len(data) - at} of 8 bytes at offset {at}"
            length = struct.unpack_from(order + "I", data, at + 4)[0]
            if length < 12 or at + length > len(data):
                return f"a block of {len(data) - at} of {length} bytes at offset {at}"
            at += length
    return None


def write_frames(path, frames):
    """Write frames (bytes) to a pcap capture with Ethernet link type."""
    with RawPcapWriter(str(path), linktype=LINKTYPE_ETHERNET, sync=True) as writer:
        for frame in frames:
            writer.write(bytes(frame))
