"""The software aggregator: the golden model behind a UDP socket (`inwire serve`).

Each received datagram is wrapped in the Ethernet/IPv4/UDP header it would have carried on the wire
(source: the peer's address and port; destination: the aggregator's own address and port), so the very
`model.Aggregator` that the gateware is checked against decides what happens to it. Each frame the model
sends is unwrapped again: its UDP payload goes to the frame's IPv4 destination and UDP port, which is the
clique's multicast group for a result and the requester for a stats reply.

Where multicast is not routable, `unicast=True` sends a result to each member instead, at the address the
member's contributions came from; a result answering a retransmission goes to the requester only.
"""

import contextlib
import socket
import sys
import threading
import time

from .datagram import MAX_DATAGRAM, ip_int, ip_str, payload_of, wrap
from .errors import InwireError
from .model import Aggregator, AggregatorConfig
from .packets import frame_field, parse_header
from .protocol import DROP_COUNTERS, INWIRE_PORT, Opcode

POLL_S = 0.1
"""Longest a receive blocks, so that a stop request is seen promptly."""
DEFAULT_SLOTS = 256
DEFAULT_MAX_ELEMENTS = 256
MULTICAST_TTL = 8
SERVE_COUNTERS = ("send_errors", "unicast_copies")
"""Counters of the service itself, beside the model's: sends the kernel refused, unicast result copies."""


class ServeError(InwireError):
    """The service cannot start; the message is one line for the user."""


class SoftwareAggregator:
    """A UDP socket in front of `model.Aggregator`.

    `handle(payload, peer)` is the whole decision (returns the datagrams to send); `serve()` is the
    receive loop around it, which runs until `stop()`.
    """

    def __init__(self, listen=("127.0.0.1", INWIRE_PORT), unicast=False, slots=DEFAULT_SLOTS,
                 max_elements=DEFAULT_MAX_ELEMENTS, multicast_iface=None, log=None, make_aggregator=Aggregator):
        self.unicast = unicast
        self.log = log or (lambda line: print(line, file=sys.stderr, flush=True))
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            self.sock.bind(listen)
        except OSError as error:
            self.sock.close()
            raise ServeError(f"cannot listen on {listen[0]}:{listen[1]}: {error.strerror}") from None
        self.sock.settimeout(POLL_S)
        self.sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL, MULTICAST_TTL)
        self.sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_LOOP, 1)
        if multicast_iface:
            self.sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, socket.inet_aton(multicast_iface))
        self.address = self.sock.getsockname()
        self.config = AggregatorConfig(ip=ip_int(self.address[0]), port=self.address[1], slots=slots,
                                       max_elements=max_elements)
        self.model = make_aggregator(self.config)
        self.dst_mac = self.config.mac.to_bytes(6, "big")
        self.members = {}
        """(job, group) -> {sender index: (ip, port)}, learned from accepted contributions."""
        self.own = dict.fromkeys(SERVE_COUNTERS, 0)
        self._stop = threading.Event()

    def handle(self, payload, peer):
        """Datagrams to send, as (payload, (ip, port)), in answer to one datagram from `peer`."""
        frame = wrap(payload, peer, self.address, self.dst_mac)
        before = self.model.stats()
        outputs = self.model.process(frame)
        after = self.model.stats()
        answered = after["answered"] > before["answered"]
        if answered or after["accumulated"] > before["accumulated"]:
            self._learn(frame, peer)
        sends = []
        for output in outputs:
            body = payload_of(output)
            if self.unicast and frame_field(output, "opcode") == Opcode.RESULT:
                sends.extend(self._unicast_copies(output, body, peer, answered))
            else:
                destination = (ip_str(frame_field(output, "ip_dst")), frame_field(output, "udp_dport"))
                sends.append((body, destination))
        return sends

    def _learn(self, frame, peer):
        """Only frames the model accepted get here, so the header is whole and well-formed."""
        header = parse_header(frame)
        if header["opcode"] != Opcode.CONTRIBUTION:
            return
        key = (int(header["job"]), int(header["group"]))
        self.members.setdefault(key, {})[int(header["sender"])] = peer

    def _unicast_copies(self, output, body, peer, answered):
        if answered:
            return [(body, peer)]
        header = parse_header(output)
        members = self.members.get((int(header["job"]), int(header["group"])), {})
        bitmap = int(header["bitmap"])
        copies = [(body, address) for sender, address in sorted(members.items()) if bitmap >> sender & 1]
        self.own["unicast_copies"] += len(copies)
        return copies

    def send(self, sends):
        for body, destination in sends:
            try:
                self.sock.sendto(body, destination)
            except OSError:
                self.own["send_errors"] += 1

    def counters(self):
        return {**self.model.stats(), **self.own}

    def counters_line(self, prefix="counters"):
        counters = self.counters()
        drops = sum(counters[name] for name in DROP_COUNTERS)
        shown = [f"{name}={value}" for name, value in counters.items()
                 if value and name not in ("frames_in",)]
        return f"{prefix} frames_in={counters['frames_in']} drops={drops} " + " ".join(shown)

    def serve(self, stats_interval=None):
        """Receive and answer until `stop()`; logs counters every `stats_interval` seconds and at the end."""
        next_log = time.monotonic() + stats_interval if stats_interval else None
        while not self._stop.is_set():
            try:
                payload, peer = self.sock.recvfrom(MAX_DATAGRAM)
            except TimeoutError:
                payload = None
            except OSError:
                # ICMP errors from earlier sends surface here on some kernels: they are no reason to stop.
                payload = None
            if payload is not None:
                self.send(self.handle(payload, peer))
            if next_log is not None and time.monotonic() >= next_log:
                self.log(f"inwire serve: {self.counters_line()}")
                next_log += stats_interval
        self.log(f"inwire serve: stopped; final {self.counters_line()}")

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
