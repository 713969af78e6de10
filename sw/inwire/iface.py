"""`iface:NAME`: the islands as hosts on an Ethernet segment, raw frames through a NIC with scapy.

For a board on the wire: every island gets its own MAC and IPv4 address on the segment, its
contributions leave as whole Ethernet frames addressed to the aggregator (the gateware's default
addresses unless told otherwise), and every frame that comes back on the interface for the inwire port
is handed to the islands: results are multicast, so each island keeps what belongs to its clique. The
transport answers ARP for the islands' addresses, as the hosts it stands for would, so that a software
aggregator behind a kernel stack can reach them too.
"""

import asyncio
import select
import socket
import threading

from scapy.config import conf
from scapy.error import Scapy_Exception
from scapy.layers.l2 import ARP, Ether
from scapy.packet import Raw

from .datagram import PAYLOAD_OFFSET, ip_str, island_address, payload_of, wrap
from .errors import InwireError
from .model import AggregatorConfig
from .packets import frame_field
from .protocol import ETHERTYPE_IPV4, INWIRE_PORT, IP_PROTO_UDP
from .transport import probe_stats

ETHERTYPE_ARP = 0x0806
POLL_S = 0.1


class IfaceError(InwireError):
    """The interface cannot be opened; the message is one line for the user."""


class IfaceTransport:
    def __init__(self, iface, islands, aggregator=None):
        self.iface = iface
        self.aggregator = aggregator or AggregatorConfig()
        self.hosts = {island: island_address(index) for index, island in enumerate(islands)}
        self.by_ip = {ip: (island, mac) for island, (ip, mac) in self.hosts.items()}
        try:
            socket.if_nametoindex(iface)
        except OSError:
            raise IfaceError(f"iface:{iface}: no network interface named {iface!r} on this machine "
                             f"(see ip link)") from None
        try:
            self.socket = conf.L2socket(iface=iface)
        except (OSError, Scapy_Exception) as error:
            raise IfaceError(f"cannot open interface {iface!r}: {error}") from None
        self.send_errors = 0
        self._stop = threading.Event()
        self.reader = None

    async def start(self, deliver, deliver_batch=None):
        loop = asyncio.get_running_loop()
        self.reader = threading.Thread(target=self._read, args=(loop, deliver), daemon=True)
        self.reader.start()

    def _read(self, loop, deliver):
        while not self._stop.is_set():
            if not select.select([self.socket], [], [], POLL_S)[0]:
                continue
            try:
                frame = self.socket.recv_raw()[1]
            except (OSError, Scapy_Exception):
                continue
            if frame is None or len(frame) < PAYLOAD_OFFSET:
                continue
            if frame_field(frame, "eth_type") == ETHERTYPE_ARP:
                self._answer_arp(frame)
            elif (frame_field(frame, "eth_type") == ETHERTYPE_IPV4 and frame_field(frame, "ip_proto") == IP_PROTO_UDP
                  and frame_field(frame, "udp_dport") == INWIRE_PORT
                  and frame_field(frame, "ip_src") == self.aggregator.ip):
                for island in self.hosts:
                    loop.call_soon_threadsafe(deliver, island, payload_of(frame))

    def _answer_arp(self, frame):
        request = Ether(frame)[ARP]
        if request.op != 1 or request.pdst not in self.by_ip:
            return
        _island, mac = self.by_ip[request.pdst]
        mac_text = ":".join(f"{byte:02x}" for byte in mac.to_bytes(6, "big"))
        reply = Ether(dst=request.hwsrc, src=mac_text) / ARP(
            op=2, hwsrc=mac_text, psrc=request.pdst, hwdst=request.hwsrc, pdst=request.psrc)
        self._send(bytes(reply))

    def send(self, island, payload):
        address, mac = self.hosts[island]
        self._send(wrap(payload, (address, INWIRE_PORT), (ip_str(self.aggregator.ip), self.aggregator.port),
                        self.aggregator.mac.to_bytes(6, "big"), mac.to_bytes(6, "big")))

    def _send(self, frame):
        try:
            self.socket.send(Raw(frame))
        except (OSError, Scapy_Exception):
            self.send_errors += 1

    def subscribe(self, island, group):
        """Every frame on the segment reaches the islands already."""

    unsubscribe = subscribe

    async def stats(self, island, stats_future, first_wait, budget, request=None):
        return await probe_stats(self, island, stats_future, first_wait, budget, request=request)

    def close(self):
        self._stop.set()
        if self.reader is not None:
            self.reader.join(timeout=2)
        self.socket.close()
