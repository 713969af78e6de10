"""Transports: how the islands of `inwire stream` reach an aggregator.

Every transport has `start(deliver)`, `send(island, payload)`, `subscribe` / `unsubscribe(island, group)`,
`stats(island, stats_future, timeout)` and `close()`; `deliver(island, payload)` hands each received UDP
payload to the islands. `UdpTransport` uses the kernel's UDP sockets; `CaptureTransport` wraps the
payloads into frames for an in-process aggregator (the golden model, or the gateware in co-simulation)
and can write them to a capture. `inwire.iface.IfaceTransport` sends raw frames through a NIC.
"""

import asyncio
import socket

from .datagram import ip_str, island_address, payload_of, stats_request, wrap
from .model import Aggregator, AggregatorConfig
from .pcap import write_frames
from .protocol import INWIRE_PORT

PROBE_TRIES = 3
PCAP_AGGREGATOR = AggregatorConfig()
"""A pcap capture is addressed to an aggregator with the gateware's default addresses."""


class UdpTransport:
    """One UDP socket per island, each talking to its target address (a software aggregator, a board or
    a relay). With `multicast_iface`, each island also receives its clique's group on that interface."""

    def __init__(self, targets, sockets=None, multicast_iface=None, multicast_port=INWIRE_PORT):
        self.targets = dict(targets)
        self.sockets = dict(sockets or {})
        self.multicast_iface, self.multicast_port = multicast_iface, multicast_port
        self.endpoints, self.listeners = {}, {}
        self.send_errors = 0

    async def start(self, deliver):
        loop = asyncio.get_running_loop()
        for island in self.targets:
            sock = self.sockets.get(island)
            if sock is None:
                sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                sock.bind(("0.0.0.0", 0))
            sock.setblocking(False)
            self.endpoints[island], _ = await loop.create_datagram_endpoint(
                lambda island=island: _Receiver(island, deliver), sock=sock)
            if self.multicast_iface:
                listener = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                listener.bind(("0.0.0.0", self.multicast_port))
                listener.setblocking(False)
                self.listeners[island], _ = await loop.create_datagram_endpoint(
                    lambda island=island: _Receiver(island, deliver), sock=listener)

    def send(self, island, payload):
        try:
            self.endpoints[island].sendto(payload, self.targets[island])
        except OSError:
            self.send_errors += 1

    def _membership(self, island, group, option):
        listener = self.listeners.get(island)
        if listener is not None:
            request = socket.inet_aton(ip_str(group)) + socket.inet_aton(self.multicast_iface)
            listener.get_extra_info("socket").setsockopt(socket.IPPROTO_IP, option, request)

    def subscribe(self, island, group):
        self._membership(island, group, socket.IP_ADD_MEMBERSHIP)

    def unsubscribe(self, island, group):
        self._membership(island, group, socket.IP_DROP_MEMBERSHIP)

    async def stats(self, island, stats_future, timeout):
        return await probe_stats(self, island, stats_future, timeout)

    def close(self):
        for endpoint in (*self.endpoints.values(), *self.listeners.values()):
            endpoint.close()


async def probe_stats(transport, island, stats_future, timeout):
    """Counters of the target, asked from `island`; None when it never answers."""
    for _ in range(PROBE_TRIES):
        transport.send(island, stats_request())
        try:
            return await asyncio.wait_for(asyncio.shield(stats_future), timeout)
        except TimeoutError:
            continue
    return None


class _Receiver(asyncio.DatagramProtocol):
    def __init__(self, island, deliver):
        self.island, self.deliver = island, deliver

    def datagram_received(self, data, addr):
        self.deliver(self.island, data)

    def error_received(self, exc):
        """ICMP errors (port unreachable) on a UDP socket: the timeouts deal with the silence."""


class CaptureTransport:
    """`pcap:FILE` and `sim:SIMULATOR`: the frames the islands send, with the gateware's default addresses,
    go to an in-process aggregator whose results come back to the islands, so the run makes the same checks.

    For `pcap:` the aggregator is the golden model and the frames are also written to a capture, which
    replays on any aggregator with those addresses and enough slots. For `sim:` it is the gateware itself,
    in co-simulation (`inwire_hdl.cosim`), built with the slots the run needs."""

    def __init__(self, path, islands, slots, max_elements, make_aggregator=Aggregator):
        self.path = path
        self.hosts = {island: island_address(index) for index, island in enumerate(islands)}
        self.config = AggregatorConfig(mac=PCAP_AGGREGATOR.mac, ip=PCAP_AGGREGATOR.ip,
                                       slots=max(PCAP_AGGREGATOR.slots, slots),
                                       max_elements=max(PCAP_AGGREGATOR.max_elements, max_elements))
        self.model = make_aggregator(self.config)
        self.frames = []
        self.send_errors = 0

    async def start(self, deliver):
        self.deliver, self.loop = deliver, asyncio.get_running_loop()

    def send(self, island, payload):
        address, mac = self.hosts[island]
        frame = wrap(payload, (address, INWIRE_PORT), (ip_str(self.config.ip), self.config.port),
                     self.config.mac.to_bytes(6, "big"), mac.to_bytes(6, "big"))
        self.frames.append(frame)
        for output in self.model.process(frame):
            # The result is multicast: every island sees it and keeps what belongs to its clique.
            for receiver in self.hosts:
                self.loop.call_soon(self.deliver, receiver, payload_of(output))

    def subscribe(self, island, group):
        """Delivery reaches every island already."""

    unsubscribe = subscribe

    async def stats(self, island, stats_future, timeout):
        return self.model.stats()

    def close(self):
        if hasattr(self.model, "close"):
            self.model.close()
        if self.path is not None:
            write_frames(self.path, self.frames)
