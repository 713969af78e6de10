"""Transports: how the islands of `inwire stream` reach an aggregator.

Every transport has `start(deliver, deliver_batch=None)`, `send(island, payload)`, `subscribe` /
`unsubscribe(island, group)`, `stats(island, stats_future, first_wait, budget)` and `close()`;
`deliver(island, payload)` hands each received UDP payload to the islands. A transport that reads datagrams
in batches may hand each batch over at once instead, as `deliver_batch(island, buffer, sizes, slot)` (the
i-th payload at buffer[i * slot:][:sizes[i]]); one that does not ignores `deliver_batch`. `UdpTransport` uses
the kernel's UDP sockets; `CaptureTransport` wraps the payloads into frames for an in-process aggregator (the golden
model, or the gateware in co-simulation) and can write them to a capture. `inwire.iface.IfaceTransport`
sends raw frames through a NIC.
"""

import asyncio
import socket
from dataclasses import dataclass, replace

from .client import local_address_towards
from .datagram import (
    MAX_DATAGRAM,
    PAYLOAD_HEADER_BYTES,
    endpoint_drops,
    ip_int,
    ip_str,
    island_address,
    payload_of,
    set_receive_buffer,
    socket_drops,
    stats_request,
    wrap,
)
from .kernel import compiled
from .model import Aggregator, AggregatorConfig
from .output import atomic_output
from .packets import frame_field
from .pcap import write_frames
from .protocol import INWIRE_PORT, Opcode

BATCH = 64
"""Datagrams per recvmmsg with the compiled kernel."""
DRAIN_BATCH = 256
"""Datagrams read from one socket per readiness event before the other sockets get their turn."""
BUFFER_OVERHEAD = 1280
"""What a datagram costs a receive buffer beyond its payload on Linux (skb and headers, rounded up): a
1 KiB datagram takes about 2.3 KiB."""
MIN_RECEIVE_BUFFER = 256 << 10


def receive_buffer_bytes(datagrams, payload_bytes):
    """SO_RCVBUF that holds `datagrams` datagrams of `payload_bytes` twice over."""
    return max(MIN_RECEIVE_BUFFER, 2 * datagrams * (payload_bytes + BUFFER_OVERHEAD))


PCAP_AGGREGATOR = AggregatorConfig()
"""A pcap capture is addressed to an aggregator with the gateware's default addresses."""


class UdpTransport:
    """One UDP socket per island, each talking to its target address (a software aggregator, a board or
    a relay). With `multicast_iface`, each island also receives its clique's group on that interface.

    The sockets are non-blocking and read in batches: one readiness event drains a socket (up to
    DRAIN_BATCH datagrams) into a preallocated buffer, and each payload is handed over as a view of it,
    valid during the `deliver` call (with recvmmsg and a `deliver_batch`, each batch at once: the buffer,
    valid during the call). Each socket's receive buffer holds `window` results of `chunk`
    elements twice over (results beyond the window are retransmission answers). With the compiled kernel
    (`inwire._kernel`, _transport.c) a socket is read with recvmmsg and the datagrams the islands send in answer to
    a batch leave with one sendmmsg."""

    SLOT = MAX_DATAGRAM + 1

    def __init__(self, targets, sockets=None, multicast_iface=None, multicast_port=INWIRE_PORT, window=32,
                 chunk=256, batch_io=None, aggregators=None):
        self.targets = dict(targets)
        self.aggregators = dict(aggregators) if aggregators else None
        """city -> (ip, port) of each city's aggregator (a reduction tree's), or None: the islands' targets."""
        self.aggregator_addresses = ({city: ip_int(ip) for city, (ip, _) in self.aggregators.items()}
                                     if self.aggregators else None)
        self.sockets = dict(sockets or {})
        # Sockets handed in may live in another network namespace (the demo's islands), where this
        # process's /proc/net/udp does not see them.
        self.namespace_known = not sockets
        self.multicast_iface, self.multicast_port = multicast_iface, multicast_port
        self.receive_buffer = receive_buffer_bytes(window, PAYLOAD_HEADER_BYTES + 4 * chunk + 4)
        if batch_io and compiled is None:
            raise ValueError("batched I/O needs the compiled kernel inwire._kernel (make setup builds it)")
        self.batch_io = compiled is not None if batch_io is None else batch_io
        """recvmmsg/sendmmsg through the compiled kernel (default: when it is built)."""
        self.readers, self.listeners = {}, {}
        self.send_errors = 0
        self.sources = None
        """island -> (IPv4 address as an int, port) it takes datagrams from (`bind_islands`); None: any."""
        self.results_refused = 0
        """Datagrams refused for coming from elsewhere than the island's target."""

    def bind_islands(self):
        """Open each island's socket now, bound to the local address that routes to its target, and take
        datagrams only from that target from then on (a registered job's members: what the job's tables
        name, and the only source of its results). {island: (host, port)} of the sockets."""
        self.sources = {}
        for island, target in self.targets.items():
            host = socket.gethostbyname(target[0])
            if island not in self.sockets:
                sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                try:
                    sock.bind((local_address_towards((host, target[1])), 0))
                except OSError:
                    sock.close()
                    raise
                self.sockets[island] = sock
            self.sources[island] = (ip_int(host), target[1])
        return {island: sock.getsockname() for island, sock in self.sockets.items()}

    def answer_from(self, island, city):
        """Take datagrams for `island` only from `city`'s aggregator from now on (after `bind_islands`): in a
        registered tree a member's results come from the aggregator it sends to, which may change by round."""
        if self.sources is not None:
            host, port = self.aggregators[city]
            self.sources[island] = (ip_int(socket.gethostbyname(host)), port)

    async def start(self, deliver, deliver_batch=None):
        self.loop = asyncio.get_running_loop()
        self.deliver = deliver
        self.deliver_batch = deliver_batch
        self.buffer = bytearray(MAX_DATAGRAM)
        self.view = memoryview(self.buffer)
        self.pending = None
        """island -> [(payload, target)] sent while a batch is being delivered; None outside a batch."""
        if self.batch_io:
            self.batch_buffer = bytearray(self.SLOT * BATCH)
            self.batch_view = memoryview(self.batch_buffer)
        for island in self.targets:
            sock = self.sockets.get(island)
            if sock is None:
                sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                sock.bind(("0.0.0.0", 0))
            self.sockets[island] = sock
            self._listen(island, sock)
            if self.multicast_iface:
                listener = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                listener.bind(("0.0.0.0", self.multicast_port))
                self.listeners[island] = listener
                self._listen(island, listener)

    def _listen(self, island, sock):
        sock.setblocking(False)
        set_receive_buffer(sock, self.receive_buffer)
        self.loop.add_reader(sock.fileno(), self._drain, island, sock)
        self.readers[sock.fileno()] = sock

    def _drain(self, island, sock):
        if self.batch_io:
            return self._drain_batched(island, sock)
        deliver, buffer, view = self.deliver, self.buffer, self.view
        source = None if self.sources is None else self.sources[island]
        for _ in range(DRAIN_BATCH):
            try:
                size, (host, port) = sock.recvfrom_into(buffer)
            except BlockingIOError:
                return
            except OSError:
                # ICMP errors (port unreachable) on a UDP socket: the timeouts deal with the silence.
                continue
            if source is not None and (ip_int(host), port) != source:
                self.results_refused += 1
                continue
            deliver(island, view[:size])

    def _drain_batched(self, island, sock):
        """recvmmsg in, and what the islands send in answer leaves with one sendmmsg per socket."""
        deliver, deliver_batch = self.deliver, self.deliver_batch
        buffer, view, slot = self.batch_buffer, self.batch_view, self.SLOT
        source = False if self.sources is None else self.sources[island]
        self.pending = pending = {}
        try:
            for _ in range(DRAIN_BATCH // BATCH):
                try:
                    sizes = compiled.recv_batch(sock.fileno(), buffer, slot, source)
                except OSError:
                    continue
                if source:  # datagrams from elsewhere have size 0, which no island reads
                    sizes, refused = sizes
                    self.results_refused += refused
                if not sizes:
                    break
                if deliver_batch is not None:
                    deliver_batch(island, buffer, sizes, slot)
                else:
                    at = 0
                    for size in sizes:
                        deliver(island, view[at:at + size])
                        at += slot
                if len(sizes) < BATCH:
                    break
        finally:
            self.pending = None
            for sender, messages in pending.items():
                start, refused = compiled.send_batch(self.sockets[sender].fileno(), messages, 0)
                # Refused or not sent (full buffer): lost, and retransmitted after its timeout.
                self.send_errors += refused + len(messages) - start

    def send(self, island, payload, city=None):
        """Send to the island's target, or to `city`'s aggregator."""
        target = self.targets[island] if city is None else self.aggregators[city]
        pending = self.pending
        if pending is not None and type(payload) is bytes:
            messages = pending.get(island)
            if messages is None:
                messages = pending[island] = []
            messages.append((payload, target))
            return
        try:
            self.sockets[island].sendto(payload, target)
        except OSError:
            # A full send buffer or an ICMP error: the datagram is lost, and retransmitted after its timeout.
            self.send_errors += 1

    def _membership(self, island, group, option):
        listener = self.listeners.get(island)
        if listener is not None and group:
            request = socket.inet_aton(ip_str(group)) + socket.inet_aton(self.multicast_iface)
            listener.setsockopt(socket.IPPROTO_IP, option, request)

    def subscribe(self, island, group):
        self._membership(island, group, socket.IP_ADD_MEMBERSHIP)

    def unsubscribe(self, island, group):
        self._membership(island, group, socket.IP_DROP_MEMBERSHIP)

    async def stats(self, island, stats_future, first_wait, budget, city=None, request=None):
        return await probe_stats(self, island, stats_future, first_wait, budget, city, request)

    def kernel_drops(self):
        """Datagrams the kernel has dropped so far at the islands' sockets and at the aggregator's (when it
        is on this machine); None for a side the OS does not report."""
        if not self.namespace_known:
            return {"islands": None, "aggregator": None}
        islands = [socket_drops(sock) for sock in self.readers.values()]
        aggregator = [endpoint_drops(target) for target in
                      set(self.aggregators.values() if self.aggregators else self.targets.values())]
        return {"islands": None if None in islands else sum(islands),
                "aggregator": None if None in aggregator else sum(aggregator)}

    def close(self):
        for fileno, sock in self.readers.items():
            self.loop.remove_reader(fileno)
            sock.close()
        self.readers = {}


@dataclass(frozen=True)
class StatsSilence:
    """What a stats probe that got no counters saw: how many requests it sent, and for how long it waited."""
    requests: int
    waited_s: float

    def __str__(self):
        return f"no reply to {self.requests} stats request{'s' if self.requests != 1 else ''} in {self.waited_s:.1f} s"


async def probe_stats(transport, island, stats_future, first_wait, budget, city=None, request=None):
    """Counters of the target (or of `city`'s aggregator), asked from `island` again and again until `budget`
    seconds have passed, each wait for a reply twice the one before (from `first_wait`): a service that was
    stalled for a moment (descheduled, paging, stopped) answers a later request. A `StatsSilence` when none
    is answered. `request`: the stats request's payload (default: version 2; a registered job's run asks in
    version 3 with its job and token, from an island whose socket is one of the job's members, which is what
    an aggregator that takes registered jobs only answers)."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    deadline, wait, requests = started + budget, first_wait, 0
    while (remaining := deadline - loop.time()) > 0:
        transport.send(island, request or stats_request(), *(() if city is None else (city,)))
        requests += 1
        try:
            return await asyncio.wait_for(asyncio.shield(stats_future), min(wait, remaining))
        except TimeoutError:
            wait *= 2
    return StatsSilence(requests, loop.time() - started)


class CaptureTransport:
    """`pcap:FILE` and `sim:SIMULATOR`: the frames the islands send, with the gateware's default addresses,
    go to an in-process aggregator whose results come back to the islands, so the run makes the same checks.

    For `pcap:` the aggregator is the golden model and the frames are also written to a capture, which
    replays on any aggregator with those addresses and enough slots. For `sim:` it is the gateware itself,
    in co-simulation (`inwire_hdl.cosim`), built with the slots the run needs.

    With `cities` (a schedule with reduction trees) each city gets its own aggregator, built with its own
    address (the k-th city at the default address + k, 10.73.87.(1+k)); frames go from one to another by
    destination address, as routers would take them: a partial to the aggregator it names, a result to
    every island."""

    def __init__(self, path, islands, slots, max_elements, make_aggregator=Aggregator, cities=None):
        self.path = path
        self.hosts = {island: island_address(index) for index, island in enumerate(islands)}
        self.config = AggregatorConfig(mac=PCAP_AGGREGATOR.mac, ip=PCAP_AGGREGATOR.ip,
                                       slots=max(PCAP_AGGREGATOR.slots, slots),
                                       max_elements=max(PCAP_AGGREGATOR.max_elements, max_elements))
        self.models, self.configs, self.aggregator_addresses, self.model = {}, {}, None, None
        if cities:
            self.configs = {city: replace(self.config, ip=self.config.ip + k, mac=self.config.mac + k)
                            for k, city in enumerate(cities)}
            self.aggregator_addresses = {city: config.ip for city, config in self.configs.items()}
            try:
                for city, config in self.configs.items():
                    self.models[city] = make_aggregator(config)
            except BaseException:
                self.close()
                raise
            self.by_address = {config.ip: self.models[city] for city, config in self.configs.items()}
        else:
            self.model = make_aggregator(self.config)
        self.frames = []
        self.send_errors = 0

    async def start(self, deliver, deliver_batch=None):
        self.deliver, self.loop = deliver, asyncio.get_running_loop()

    def send(self, island, payload, city=None):
        config, model = (self.config, self.model) if city is None else (self.configs[city], self.models[city])
        address, mac = self.hosts[island]
        frame = wrap(payload, (address, INWIRE_PORT), (ip_str(config.ip), config.port),
                     config.mac.to_bytes(6, "big"), mac.to_bytes(6, "big"))
        self.frames.append(frame)
        self._process(model, frame)

    def _process(self, model, frame):
        for output in model.process(frame):
            if frame_field(output, "opcode") == Opcode.PARTIAL:
                parent = self.by_address.get(frame_field(output, "ip_dst")) if self.models else None
                if parent is not None:
                    self._process(parent, output)
                continue
            # The result is multicast: every island sees it and keeps what belongs to its clique.
            for receiver in self.hosts:
                self.loop.call_soon(self.deliver, receiver, payload_of(output))

    def subscribe(self, island, group):
        """Delivery reaches every island already."""

    unsubscribe = subscribe

    async def stats(self, island, stats_future, first_wait, budget, city=None, request=None):
        return (self.model if city is None else self.models[city]).stats()

    def close(self):
        for model in [self.model, *self.models.values()]:
            if hasattr(model, "close"):
                model.close()

    def write_capture(self):
        """Write the frames sent to the capture file: once the run is over, whole (a run interrupted before
        leaves no file)."""
        with atomic_output(self.path) as temporary:
            write_frames(temporary, self.frames)
