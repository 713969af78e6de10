"""Reading and writing captures of Ethernet frames (pcap and pcapng) as raw bytes."""

from scapy.error import Scapy_Exception
from scapy.utils import RawPcapReader, RawPcapWriter

from .errors import InwireError

LINKTYPE_ETHERNET = 1


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
        try:
            return [bytes(frame) for frame, _metadata in reader]
        except (Scapy_Exception, OSError, EOFError, ValueError) as error:
            raise CaptureError(f"{path}: capture is damaged ({error})") from None


def write_frames(path, frames):
    """Write frames (bytes) to a pcap capture with Ethernet link type."""
    with RawPcapWriter(str(path), linktype=LINKTYPE_ETHERNET, sync=True) as writer:
        for frame in frames:
            writer.write(bytes(frame))
