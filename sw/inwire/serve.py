"""The software aggregator behind a UDP socket (`inwire serve`).

By default the fast path (`fastpath.FastAggregator`) decides on each UDP payload directly, bit for bit
and counter for counter what the golden model decides (tests/test_fastpath.py holds it to that). With
`engine="golden"` (and with a co-simulation behind `make_aggregator`) each received datagram is wrapped
in the Ethernet/IPv4/UDP header it would have carried on the wire (source: the peer's address and port;
destination: the aggregator's own address and port), so the very `model.Aggregator` that the gateware is
checked against decides what happens to it, and each frame it sends is unwrapped again. Either way an
answer goes to the clique's multicast group (a result) or to the requester (a stats reply).

Each datagram's arrival time, in milliseconds since the service started (`model.LEASE_TICK_S`), is the
time the decision takes it at: slot leases (docs/protocol.md) count in it.

Where multicast is not routable, `unicast=True` sends a result to each member instead, at the address the
member's contributions came from; a result answering a retransmission goes to the requester only.

Reduction trees: a partial (the output of a level below the root) goes to the next aggregator up, at the
address the completing frame names (`hop1`) and this service's own port, so the services of a tree share
one port. With `unicast=True` the root knows only the members and child aggregators that sent to it, so
it also sends its result to each child that sent it a partial, and a child relays a result that comes
from its parent (the address it sent that group's partials to) to the members and children it learned
for the group; a result that answers a child's retransmitted partial reaches that child alone, and it
relays it to all of its own.
"""

import contextlib
import operator
import select
import socket
import struct
import sys
import threading
import time

from .datagram import MAX_DATAGRAM, ip_int, ip_str, payload_of, set_receive_buffer, socket_drops, wrap
from .errors import InwireError
from .fastpath import FastAggregator, compiled, next_hop
from .model import DEFAULT_LEASE, LEASE_TICK_S, Aggregator, AggregatorConfig
from .packets import frame_field
from .protocol import DROP_COUNTERS, INWIRE_PORT, Disposition, Opcode

POLL_S = 0.1
"""Longest a wait for input lasts, so that a stop request is seen promptly."""
DEFAULT_SLOTS = 256
DEFAULT_MAX_ELEMENTS = 256
DEFAULT_RECEIVE_BUFFER = 4 << 20
"""SO_RCVBUF of the service: every island's window of datagrams must fit, or the kernel drops them and
each waits for a retransmission. A 1 KiB datagram costs about 2.3 KiB of buffer on loopback, so the
Linux default (208 KiB) holds about 90: fewer than 3 islands x 32 in flight. 4 MiB holds 9 x 32 with
8 KiB datagrams. Above net.core.rmem_max a root process forces it (SO_RCVBUFFORCE)."""
MULTICAST_TTL = 8
SERVE_COUNTERS = ("send_errors", "unicast_copies", "results_relayed")
"""Counters of the service itself, beside the model's: sends the kernel refused, unicast result copies
(including those to child aggregators), results from a parent relayed down (one per copy)."""
ENGINES = ("fast", "golden")
BATCH = 64
"""Datagrams read per recvmmsg (with the compiled kernel)."""
_MEMBER = struct.Struct("!4xB3xI16xI")
"""sender, job and group of a payload: who a unicast result copy goes to."""
_destination = operator.itemgetter(1)
_RESULT = struct.Struct("!4xB3xI16xIQ")
"""sender, job, group and bitmap of a result payload."""


class ServeError(InwireError):
    """The service cannot start; the message is one line for the user."""


class SoftwareAggregator:
    """A UDP socket in front of the aggregator's decision (fast path, golden model or co-simulation).

    `handle(payload, peer, now)` is the whole decision (returns the datagrams to send; `now` is the arrival
    time in lease ticks, the service's clock `ticks()` when None); `serve()` is the receive loop around it,
    which runs until `stop()`. `lease` is the slot lease in ticks (milliseconds; 0 for none). `engine` is
    "fast" (default) or "golden"; `make_aggregator` (a factory taking the `AggregatorConfig`, e.g. a
    co-simulation) implies "golden".
    """

    def __init__(self, listen=("127.0.0.1", INWIRE_PORT), unicast=False, slots=DEFAULT_SLOTS,
                 max_elements=DEFAULT_MAX_ELEMENTS, multicast_iface=None, log=None, make_aggregator=None,
                 engine=None, backend=None, receive_buffer=DEFAULT_RECEIVE_BUFFER, lease=DEFAULT_LEASE):
        engine = engine or ("golden" if make_aggregator is not None else "fast")
        if engine not in ENGINES:
            raise ServeError(f"engine must be one of {', '.join(ENGINES)}, got {engine!r}")
        if engine == "fast" and make_aggregator is not None:
            raise ServeError("a custom aggregator (co-simulation) is served by the golden path only")
        self.engine = engine
        self.unicast = unicast
        self.log = log or (lambda line: print(line, file=sys.stderr, flush=True))
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            self.sock.bind(listen)
        except OSError as error:
            self.sock.close()
            raise ServeError(f"cannot listen on {listen[0]}:{listen[1]}: {error.strerror}") from None
        # Non-blocking: a socket with a timeout polls before every receive; this one polls only when empty.
        self.sock.setblocking(False)
        self.receive_buffer = set_receive_buffer(self.sock, receive_buffer) if receive_buffer else None
        self.sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL, MULTICAST_TTL)
        self.sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_LOOP, 1)
        if multicast_iface:
            self.sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, socket.inet_aton(multicast_iface))
        self.address = self.sock.getsockname()
        self.config = AggregatorConfig(ip=ip_int(self.address[0]), port=self.address[1], slots=slots,
                                       max_elements=max_elements, lease=lease)
        self._started = time.monotonic()
        if engine == "fast":
            self.model = None
            self.fast = FastAggregator(self.config, backend)
            self.handle = self._handle_fast
            # recvmmsg/sendmmsg come with the compiled kernel; the numpy variant stays all Python.
            self.batch_io = self.fast.backend == "c"
        else:
            self.fast = None
            self.model = (make_aggregator or Aggregator)(self.config)
            self.handle = self._handle_golden
            self.batch_io = False
        self.dst_mac = self.config.mac.to_bytes(6, "big")
        self.members = {}
        """(job, group) -> {sender index: (ip, port)}, learned from accepted contributions."""
        self.children = {}
        """(job, group) -> {(ip, port)} of the aggregators below that sent accepted partials."""
        self.parents = {}
        """(job, group) -> (ip, port) this service sent the group's partials to: the only source whose
        results it relays."""
        self.own = dict.fromkeys(SERVE_COUNTERS, 0)
        self._groups = {}
        self._stop = threading.Event()

    @property
    def description(self):
        if self.fast is not None:
            return f"the fast path ({self.fast.backend}, bit-exact with the golden model)"
        return "the golden model" if isinstance(self.model, Aggregator) else type(self.model).__name__

    def slot_key(self, slot):
        """(job, round, clique, chunk) owning `slot`, or None while it was never used."""
        return self.fast.slot_key(slot) if self.fast is not None else self.model.slots[slot].key

    def ticks(self):
        """Milliseconds since the service started: the arrival time of a datagram read now."""
        return int((time.monotonic() - self._started) / LEASE_TICK_S)

    def _handle_fast(self, payload, peer, now=None):
        if self.unicast and len(payload) > 3 and payload[3] == Opcode.RESULT:
            relay = self._relay(payload, peer)
            if relay is not None:
                return relay
        disposition, answer = self.fast.handle(payload, self.ticks() if now is None else now)
        if disposition == Disposition.ACCUMULATED or (disposition == Disposition.ANSWERED
                                                      and payload[3] in (Opcode.CONTRIBUTION, Opcode.PARTIAL)):
            self._learn(payload, peer)
        if answer is None:
            return []
        if answer[3] == Opcode.PARTIAL:
            parent = (ip_str(next_hop(payload)), self.config.port)
            self.parents[_MEMBER.unpack_from(payload)[1:]] = parent
            return [(answer, parent)]
        if answer[3] != Opcode.RESULT:
            return [(answer, peer)]
        answered = disposition == Disposition.ANSWERED
        if self.unicast:
            return self._unicast_copies(answer, peer, answered)
        group = _RESULT.unpack_from(answer)[2]
        destination = self._groups.get(group)
        if destination is None:
            destination = self._groups[group] = (ip_str(group), self.config.port)
        return [(answer, destination)]

    def _handle_golden(self, payload, peer, now=None):
        if self.unicast and len(payload) > 3 and payload[3] == Opcode.RESULT:
            relay = self._relay(payload, peer)
            if relay is not None:
                return relay
        frame = wrap(payload, peer, self.address, self.dst_mac)
        before = self.model.stats()
        outputs = self.model.process(frame, self.ticks() if now is None else now)
        after = self.model.stats()
        answered = after["answered"] > before["answered"]
        if answered or after["accumulated"] > before["accumulated"]:
            self._learn(payload, peer)
        sends = []
        for output in outputs:
            body = payload_of(output)
            opcode = frame_field(output, "opcode")
            if self.unicast and opcode == Opcode.RESULT:
                sends.extend(self._unicast_copies(body, peer, answered))
            else:
                destination = (ip_str(frame_field(output, "ip_dst")), frame_field(output, "udp_dport"))
                if opcode == Opcode.PARTIAL:
                    self.parents[_MEMBER.unpack_from(body)[1:]] = destination
                sends.append((body, destination))
        return sends

    def _learn(self, payload, peer):
        """Who sent an accepted contribution or partial (only those get here, so the header is whole), for
        unicast copies: a member by its index, an aggregator below by its address."""
        sender, job, group = _MEMBER.unpack_from(payload)
        if payload[3] == Opcode.PARTIAL:
            self.children.setdefault((job, group), set()).add(peer)
        elif payload[3] == Opcode.CONTRIBUTION:
            self.members.setdefault((job, group), {})[sender] = peer

    def _unicast_copies(self, body, peer, answered):
        if answered:
            return [(body, peer)]
        copies = self._copies(body)
        self.own["unicast_copies"] += len(copies)
        return copies

    def _copies(self, body):
        """A result for each member and child aggregator learned for its group."""
        _, job, group, bitmap = _RESULT.unpack_from(body)
        members = self.members.get((job, group), {})
        copies = [(body, address) for sender, address in sorted(members.items()) if bitmap >> sender & 1]
        copies += [(body, address) for address in sorted(self.children.get((job, group), ()))]
        return copies

    def _relay(self, payload, peer):
        """Copies of a result from this group's parent aggregator, for everyone below; None for any other
        result (the aggregator's decision then counts it)."""
        if len(payload) < _RESULT.size:
            return None
        _, job, group, _ = _RESULT.unpack_from(payload)
        if self.parents.get((job, group)) != tuple(peer):
            return None
        body = bytes(payload)
        copies = self._copies(body)
        self.own["results_relayed"] += len(copies)
        return copies

    def send(self, sends):
        sock = self.sock
        for body, destination in sends:
            try:
                sock.sendto(body, destination)
            except BlockingIOError:
                # The send buffer is full: wait until it drains rather than lose the datagram.
                select.select([], [sock], [], POLL_S)
                try:
                    sock.sendto(body, destination)
                except OSError:
                    self.own["send_errors"] += 1
            except OSError:
                self.own["send_errors"] += 1

    def counters(self):
        engine = self.fast if self.fast is not None else self.model
        return {**engine.stats(), **self.own}

    def counters_line(self, prefix="counters"):
        counters = self.counters()
        drops = sum(counters[name] for name in DROP_COUNTERS)
        shown = [f"{name}={value}" for name, value in counters.items()
                 if value and name not in ("frames_in",)]
        # Datagrams the kernel dropped before the aggregator saw them (receive buffer full): not in frames_in.
        kernel = socket_drops(self.sock)
        shown += [] if kernel is None else [f"kernel_drops={kernel}"]
        return f"{prefix} frames_in={counters['frames_in']} drops={drops} " + " ".join(shown)

    def serve(self, stats_interval=None):
        """Receive and answer until `stop()`; logs counters every `stats_interval` seconds and at the end.

        The socket is drained without waiting while it holds datagrams; only an empty socket is waited on
        (at most POLL_S, so that a stop request is seen). With the compiled kernel, datagrams are read
        with one recvmmsg and the answers to a batch leave with one sendmmsg."""
        self._next_log = time.monotonic() + stats_interval if stats_interval else None
        self._stats_interval = stats_interval
        if self.batch_io:
            self._serve_batched()
        else:
            self._serve_each()
        self.log(f"inwire serve: stopped; final {self.counters_line()}")

    def _log_due(self):
        if self._next_log is not None and time.monotonic() >= self._next_log:
            self.log(f"inwire serve: {self.counters_line()}")
            self._next_log += self._stats_interval

    def _serve_each(self):
        buffer = bytearray(MAX_DATAGRAM)
        view = memoryview(buffer)
        sock, stopped, handle = self.sock, self._stop.is_set, self.handle
        while not stopped():
            try:
                size, peer = sock.recvfrom_into(buffer)
            except BlockingIOError:
                select.select([sock], [], [], POLL_S)
                size = None
            except OSError:
                # ICMP errors from earlier sends surface here on some kernels: they are no reason to stop.
                size = None
            if size is not None:
                sends = handle(view[:size], peer)
                if sends:
                    self.send(sends)
            self._log_due()

    def _serve_batched(self):
        slot = MAX_DATAGRAM + 1
        buffer = bytearray(slot * BATCH)
        view = memoryview(buffer)
        sock, fd, stopped, handle = self.sock, self.sock.fileno(), self._stop.is_set, self.handle
        receive = compiled.recv_batch
        while not stopped():
            try:
                batch = receive(fd, buffer, slot, True)
            except OSError:
                continue  # an ICMP error from an earlier send: read on
            if not batch:
                select.select([sock], [], [], POLL_S)
                self._log_due()
                continue
            sends, at = [], 0
            for size, peer in batch:
                answer = handle(view[at:at + size], peer)
                if answer:
                    sends += answer
                at += slot
            if sends:
                if len(sends) > 1:
                    # Grouped by destination (stable: each peer's order kept), so that a peer's results form
                    # runs that leave as one GSO message.
                    sends.sort(key=_destination)
                self.send_batch(sends)
            self._log_due()

    def send_batch(self, sends):
        """Send (payload, (ip, port)) pairs with sendmmsg; a full send buffer is waited out (POLL_S)."""
        start = 0
        while True:
            start, refused = compiled.send_batch(self.sock.fileno(), sends, start)
            self.own["send_errors"] += refused
            if start >= len(sends):
                return
            if not select.select([], [self.sock], [], POLL_S)[1]:
                self.own["send_errors"] += len(sends) - start
                return

    def stop(self):
        self._stop.set()

    def close(self):
        self.sock.close()
        if hasattr(self.model, "close"):
            self.model.close()


@contextlib.contextmanager
def serving_in_thread(server):
    """Run `server.serve()` in a thread for the body of a with-statement; stop and close it afterwards."""
    thread = threading.Thread(target=server.serve, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.stop()
        thread.join(timeout=5)
        server.close()
