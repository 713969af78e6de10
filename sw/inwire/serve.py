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
import ipaddress
import socket
import struct
import sys
import threading
import time

import numpy as np

from .model import Aggregator, AggregatorConfig
from .packets import build_frames, frame_field, parse_header
from .protocol import (
    COUNTERS,
    DROP_COUNTERS,
    ETHERNET_BYTES,
    ETHERTYPE_IPV4,
    FRAME_HEADER_BYTES,
    INWIRE_PORT,
    IP_FLAG_DF,
    IP_PROTO_UDP,
    IP_VER_IHL,
    IPV4_BYTES,
    RESULT_TTL,
    UDP_BYTES,
    Opcode,
)

PAYLOAD_OFFSET = ETHERNET_BYTES + IPV4_BYTES + UDP_BYTES
PEER_MAC = bytes.fromhex("020000000000")
"""Source MAC of wrapped datagrams: the kernel hides the real one and the model does not read it."""
MAX_DATAGRAM = 65535
POLL_S = 0.1
"""Longest a receive blocks, so that a stop request is seen promptly."""
DEFAULT_SLOTS = 256
DEFAULT_MAX_ELEMENTS = 256
MULTICAST_TTL = 8
SERVE_COUNTERS = ("send_errors", "unicast_copies")
"""Counters of the service itself, beside the model's: sends the kernel refused, unicast result copies."""


class ServeError(Exception):
    """The service cannot start; the message is one line for the user."""


def parse_endpoint(text, what="address"):
    """'HOST:PORT' as (dotted IPv4 address, port); the host may be a name that resolves to IPv4."""
    host, sep, port = str(text).rpartition(":")
    if not sep or not host:
        raise ValueError(f"{what} {text!r} is not HOST:PORT")
    try:
        port = int(port)
    except ValueError:
        raise ValueError(f"{what} {text!r}: port {port!r} is not a number") from None
    if not 0 <= port <= 65535:
        raise ValueError(f"{what} {text!r}: port {port} is outside 0-65535")
    try:
        address = socket.getaddrinfo(host, port, socket.AF_INET, socket.SOCK_DGRAM)[0][4][0]
    except (socket.gaierror, UnicodeError) as error:
        raise ValueError(f"{what} {text!r}: cannot resolve {host!r} ({error})") from None
    return address, port


def ip_int(address):
    return int(ipaddress.IPv4Address(address))


def ip_str(value):
    return str(ipaddress.IPv4Address(int(value)))


_HEADER = struct.Struct("!6s6sHBBHHHBBH4s4sHHHH")


def wrap_datagram(payload, source, destination, dst_mac, src_mac=PEER_MAC):
    """The Ethernet frame that carries `payload` from `source` to `destination` ((ip, port) pairs)."""
    ip_len = IPV4_BYTES + UDP_BYTES + len(payload)
    src_ip = socket.inet_aton(source[0])
    dst_ip = socket.inet_aton(destination[0])
    header = bytearray(_HEADER.pack(dst_mac, src_mac, ETHERTYPE_IPV4, IP_VER_IHL, 0, ip_len & 0xFFFF, 0,
                                    IP_FLAG_DF, RESULT_TTL, IP_PROTO_UDP, 0, src_ip, dst_ip, source[1],
                                    destination[1], (UDP_BYTES + len(payload)) & 0xFFFF, 0))
    total = sum(struct.unpack_from("!10H", header, ETHERNET_BYTES))
    total = (total & 0xFFFF) + (total >> 16)
    total = (total & 0xFFFF) + (total >> 16)
    struct.pack_into("!H", header, ETHERNET_BYTES + 10, ~total & 0xFFFF)
    return bytes(header) + bytes(payload)


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
        frame = wrap_datagram(payload, peer, self.address, self.dst_mac)
        before = self.model.stats()
        outputs = self.model.process(frame)
        after = self.model.stats()
        answered = after["answered"] > before["answered"]
        if answered or after["accumulated"] > before["accumulated"]:
            self._learn(frame, peer)
        sends = []
        for output in outputs:
            body = output[PAYLOAD_OFFSET:]
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


def stats_request(job=0, sender=0):
    """The UDP payload of a stats request."""
    frame = build_frames(np.zeros((1, 0), dtype=np.int32), opcode=Opcode.STATS_REQUEST, job=job, sender=sender)
    return bytes(frame[0, PAYLOAD_OFFSET:])


def parse_stats_reply(payload):
    """Counters of a stats reply payload as a dict, or None when it is not one."""
    frame = bytes(PAYLOAD_OFFSET) + bytes(payload)
    if (len(frame) < FRAME_HEADER_BYTES or (len(frame) - FRAME_HEADER_BYTES) % 4
            or frame_field(frame, "opcode") != Opcode.STATS_REPLY):
        return None
    values = np.frombuffer(frame, dtype=">u4", offset=FRAME_HEADER_BYTES)
    if len(values) != len(COUNTERS):
        return None
    return dict(zip(COUNTERS, (int(v) for v in values), strict=True))


def run(args):
    """`inwire serve`: until SIGINT or SIGTERM."""
    import signal

    listen = parse_endpoint(args.listen, "--listen")
    if args.stats_interval is not None and args.stats_interval <= 0:
        raise ValueError(f"--stats-interval must be positive, got {args.stats_interval}")
    make_aggregator = Aggregator
    if args.sim:
        from inwire_hdl.cosim import CoSimulation

        simulator, width = args.sim

        def make_aggregator(config):
            return CoSimulation(simulator, width, config)
    server = SoftwareAggregator(listen, unicast=args.unicast, slots=args.slots, max_elements=args.max_elements,
                                multicast_iface=args.multicast_iface, make_aggregator=make_aggregator)
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: server.stop())
    host, port = server.address
    mode = "unicast to each member" if args.unicast else "multicast to the clique's group"
    engine = f"the gateware in {args.sim[0]} at width {args.sim[1]}" if args.sim else "the golden model"
    server.log(f"inwire serve: listening on udp://{host}:{port}, {server.config.slots} slots of up to "
               f"{server.config.max_elements} elements, {engine}, results by {mode}")
    try:
        server.serve(args.stats_interval)
    finally:
        server.close()
    return 0


def main(argv=None):
    from .host_cli import run_command
    return run_command("serve", argv)


if __name__ == "__main__":
    sys.exit(main())
