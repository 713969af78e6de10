"""The software aggregator behind a UDP socket (`inwire serve`).

By default the fast path (`fastpath.FastAggregator`, where the compiled kernel is built; the golden model
otherwise) decides on each UDP payload directly, bit for bit
and counter for counter what the golden model decides (tests/test_fastpath.py holds it to that). With
`engine="golden"` (and with a co-simulation behind `make_aggregator`) each received datagram is wrapped
in the Ethernet/IPv4/UDP header it would have carried on the wire (source: the peer's address and port;
destination: the aggregator's own address and port), so the very `model.Aggregator` that the gateware is
checked against decides what happens to it, and each frame it sends is unwrapped again. Either way an
answer goes to the clique's multicast group (a result) or to the requester (a stats reply).

Each datagram's arrival time, in milliseconds since the service started (`model.LEASE_TICK_S`), is the
time the decision takes it at (the time its batch was read, with recvmmsg): slot leases (docs/protocol.md)
count in it.

Where multicast is not routable, `unicast=True` sends a result to each member instead, at the address the
member's contributions came from; a result answering a retransmission goes to the requester only.

Reduction trees: a partial (the output of a level below the root) goes to the next aggregator up, at the
address the completing frame names (`hop1`) and this service's own port, so the services of a tree share
one port. With `unicast=True` the root knows only the members and child aggregators that sent to it, so
it also sends its result to each child that sent it a partial, and a child relays a result that comes
from its parent (the address it sent that slot's partial to) to the members and children it learned
for the slot; a result that answers a child's retransmitted partial reaches that child alone, and it
relays it to all of its own.

Registered jobs (`registered`): the service's port is also its control port. A datagram starting with
b"IWCP" is a control message (`control.ControlPlane`), taken aside before the data plane decides: an
authenticated registration installs a job's tables in the engine, and a registration not renewed within
its ttl is removed (checked once a second). `unregistered` (default on) keeps taking
version 1 and 2 frames beside registered jobs. A version 3 datagram's answers go to exactly the endpoints
its decision names, from its job's tables (the job's group, its members, the clique's parent and children);
none of the learning, unicast copies and relays above, which serve versions 1 and 2, is involved.

A service listening on the wildcard address (0.0.0.0) is the aggregator at every address of its machine: each
datagram is decided by the aggregator at the address it arrived on (IP_PKTINFO), as a board at that address
would decide the frame.

Frames are untrusted, so the service decides where its datagrams may go, beside the model's route rule
(`drop_route`: never to itself, never back to the sender, only within the upstream prefix):
- nothing is ever sent to the service's own address and port (with a wildcard listen address: to any
  address of this machine at its port, the one a datagram arrived on being refused by the route rule
  already); such a send is refused and counted (`sends_refused`);
- each partial sent up earns one relay: a result from that partial's parent for that slot and owner is
  relayed once, to the slot's members and children other than the parent; any other result goes to the
  aggregator, which drops it (`drop_opcode`). Relays send no partials, so no set of services can pass a
  result around for ever;
- what it learns is kept per slot (the members, children and parent of the slot's current owner), so its
  tables are bounded by the slots, whatever the traffic;
- a stats reply is larger than its request, so it answers only requesters on this machine or within
  `stats_from` (default: the upstream prefix), and counts the others (`stats_refused`).
"""

import contextlib
import ipaddress
import operator
import re
import select
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import replace
from typing import Protocol, TypeVar

from .control import MAGIC, ControlPlane, RequestError, is_control, load_key
from .datagram import (
    MAX_DATAGRAM,
    PAYLOAD_HEADER_BYTES,
    PAYLOAD_OFFSET,
    SENDER_AT,
    Address,
    Payload,
    header_struct,
    ip_int,
    ip_str,
    payload_of,
    set_receive_buffer,
    socket_drops,
    wrap,
)
from .errors import InwireError
from .fastpath import FastAggregator, compiled, next_hop  # the kernel as the fast path loaded it
from .jobs import Endpoint, JobEntry, JobLimits
from .model import DEFAULT_LEASE, LEASE_TICK_S, Aggregator, AggregatorConfig
from .packets import frame_field
from .protocol import (
    DEFAULT_SLOTS,
    FAULT_DROP_COUNTERS,
    FRAME_OFFSETS,
    INWIRE_PORT,
    JOB_VERSION,
    RETRANSMISSION_DROP_COUNTERS,
    Disposition,
    Opcode,
)

POLL_S = 0.1
"""Longest a wait for input lasts, so that a stop request is seen promptly."""
DEFAULT_MAX_ELEMENTS = 256
DEFAULT_RECEIVE_BUFFER = 4 << 20
"""SO_RCVBUF of the service: every island's window of datagrams must fit, or the kernel drops them and
each waits for a retransmission. A 1 KiB datagram costs about 2.3 KiB of buffer on loopback, so the
Linux default (208 KiB) holds about 90: fewer than 3 islands x 32 in flight. 4 MiB holds 9 x 32 with
8 KiB datagrams. Above net.core.rmem_max a root process forces it (SO_RCVBUFFORCE)."""
MULTICAST_TTL = 8
SERVE_COUNTERS = ("send_errors", "unicast_copies", "results_relayed", "sends_refused", "stats_refused")
"""Counters of the service itself, beside the model's: sends the kernel refused, unicast result copies
(including those to child aggregators), results from a parent relayed down (one per copy), datagrams that
would have gone to the service itself, stats requests from elsewhere."""
ENGINES = ("fast", "golden")
BATCH = 64
"""Datagrams read per recvmmsg (with the compiled kernel)."""
_OWNER = header_struct("sender", "chunk")
"""sender, fanin, exponent, contributors, job, round, clique, slot and chunk of a payload, at SENDER_AT."""
_BITMAP = header_struct("bitmap", "bitmap")
_BITMAP_AT = FRAME_OFFSETS["bitmap"] - PAYLOAD_OFFSET
_destination = operator.itemgetter(1)
EXPIRY_INTERVAL_S = 1.0
"""How often registrations are checked for expiry."""
LOCAL_CACHE = 256
"""Addresses remembered as local or not (wildcard listen address only); the cache starts over when full."""
IP_PKTINFO = getattr(socket, "IP_PKTINFO", 8)
"""Linux's option that hands each received datagram's destination address over (Python 3.11 lacks the name)."""
PKTINFO_BYTES = socket.CMSG_SPACE(12)
"""Ancillary space of one `struct in_pktinfo` (ifindex, spec_dst, addr); the destination is its last 4 bytes."""
SlotKey = tuple[int, int, int, int]
"""(job, round, clique, chunk): who owns a slot."""
Learned = dict[int, tuple[SlotKey, dict[int, Address], set[Address]]]
"""slot -> (owner key, {sender index: (ip, port)} of members, {(ip, port)} of child aggregators)."""


def parse_prefix(text: str, option: str = "--upstream") -> tuple[int, int]:
    """'A.B.C.D/N' as (network, length), host bits not allowed; one line naming `option` otherwise."""
    try:
        network = ipaddress.IPv4Network(text, strict=True)
    except ValueError as error:
        raise ServeError(f"{option} {text!r}: {error}; give an IPv4 prefix such as 10.0.0.0/24") from None
    return int(network.network_address), network.prefixlen


def _owner(payload: Payload) -> tuple[int, SlotKey, int]:
    """(slot, (job, round, clique, chunk), sender) of a payload whose header is whole."""
    sender, _, _, _, job, round_, clique, slot, chunk = _OWNER.unpack_from(payload, SENDER_AT)
    return slot, (job, round_, clique, chunk), sender


def parse_counters_line(line: str) -> dict[str, int]:
    """The `name=value` counters of a line `SoftwareAggregator.counters_line` wrote (serve's log), as numbers."""
    return {name: int(value) for name, value in re.findall(r"(\w+)=(\d+)", line)}


class ServeError(InwireError):
    """The service cannot start; the message is one line for the user."""


Send = tuple[bytes, Address]
"""A datagram to send: (UDP payload, destination)."""


class FrameAggregator(Protocol):
    """What the golden path serves: `model.Aggregator`, or what decides as it does (a co-simulation)."""

    config: AggregatorConfig

    def process(self, frame: bytes, now: int | None = None) -> list[bytes]: ...

    def stats(self) -> dict[str, int]: ...


class SoftwareAggregator:
    """A UDP socket in front of the aggregator's decision (fast path, golden model or co-simulation).

    `handle(payload, peer, now)` is the whole decision (returns the datagrams to send; `now` is the arrival
    time in lease ticks, the service's clock `ticks()` when None); `serve()` is the receive loop around it,
    which runs until `stop()`. `lease` is the slot lease in ticks (milliseconds; 0 for none). `upstream`
    ((network, length), or 'A.B.C.D/N') is where partials may go (default: the /24 of the listen address),
    `stats_from` who besides this machine may ask for the counters (default: `upstream`). `engine` is
    "fast" (default) or "golden"; `make_aggregator` (a factory taking the `AggregatorConfig`, e.g. a
    co-simulation) implies "golden". `registered` (job tables: version 3) and `unregistered` (versions 1 and 2)
    are the aggregator's (`AggregatorConfig`), and so are `limits`, what its job tables hold (default:
    `JobLimits()`; `inwire serve --sim`'s gateware holds `inwire_hdl.job_table.TREE_LIMITS`); with `registered` the
    control port (`control`) takes registrations signed with the operator `key` (default: `control.load_key()`,
    read before the socket is bound).
    """

    def __init__(self, listen: Address = ("127.0.0.1", INWIRE_PORT), unicast: bool = False,
                 slots: int = DEFAULT_SLOTS, max_elements: int = DEFAULT_MAX_ELEMENTS,
                 multicast_iface: str | None = None, log: Callable[[str], None] | None = None,
                 make_aggregator: Callable[[AggregatorConfig], FrameAggregator] | None = None,
                 engine: str | None = None,
                 receive_buffer: int | None = DEFAULT_RECEIVE_BUFFER,
                 lease: int = DEFAULT_LEASE, upstream: tuple[int, int] | str | None = None,
                 stats_from: tuple[int, int] | str | None = None, registered: bool = False,
                 unregistered: bool = True, key: bytes | None = None, limits: JobLimits | None = None) -> None:
        # Without the compiled kernel there is no fast path: the golden model serves, with the same answers.
        engine = engine or ("golden" if make_aggregator is not None or compiled is None else "fast")
        if make_aggregator is not None and listen[0] in ("0.0.0.0", ""):
            raise ServeError(f"a co-simulation's gateware is built for one address: listen on it, not "
                             f"{listen[0] or '0.0.0.0'}:{listen[1]}")
        if registered and key is None:
            key = load_key()
        if engine not in ENGINES:
            raise ServeError(f"engine must be one of {', '.join(ENGINES)}, got {engine!r}")
        if engine == "fast" and make_aggregator is not None:
            raise ServeError("a custom aggregator (co-simulation) is served by the golden path only")
        if engine == "fast" and compiled is None:
            raise ServeError("the fast path needs the compiled kernel inwire._kernel (make setup builds it); "
                             "--golden serves without it")
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
        if isinstance(upstream, str):
            upstream = parse_prefix(upstream)
        self.config = AggregatorConfig(ip=ip_int(self.address[0]), port=self.address[1], slots=slots,
                                       max_elements=max_elements, lease=lease, upstream=upstream,
                                       registered=registered, unregistered=unregistered,
                                       limits=limits or JobLimits())
        if isinstance(stats_from, str):
            stats_from = parse_prefix(stats_from, "--stats-from")
        network, length = stats_from or self.config.upstream_prefix
        self.stats_from = ipaddress.IPv4Network((network, length))
        self.wildcard = self.address[0] == "0.0.0.0"
        if self.wildcard:
            self.sock.setsockopt(socket.IPPROTO_IP, IP_PKTINFO, 1)
        self._at = self.address
        """(ip, port) the aggregator decides as: the listen address, or with a wildcard one the address the
        datagram being decided arrived on (`decide_at`)."""
        self._copies_in_decider = unicast and not self.wildcard
        self._local: dict[str, bool] = {}
        self.model: FrameAggregator | None
        self.fast: FastAggregator | None
        self._decide: Callable[[Payload, Address, int], tuple[int | None, bytes | list[Send] | None]]
        """The engine's decision, the one call `handle` makes per datagram: (payload, peer, arrival time) ->
        (disposition, answer payload, or for version 3 the list of sends its job's tables name, or None). It
        decides, counts and learns who sent what; everything around it is `handle`'s."""
        self._table: LearningTable | FastAggregator
        """The learning table (`learned`, `LearningTable`): the compiled decider's where it decides (it learns as
        it decides and makes the unicast copies of a batch's results without leaving C), else the service's."""
        if engine == "fast":
            self.model = None
            self.fast = FastAggregator(self.config)
            decide = self.fast.handle
            # The peer is the source (for the route rule and job tables) and, given, is learned.
            self._decide = lambda payload, peer, now: decide(payload, now, peer, peer)
            self._table = self.fast
            self.batch_io = True
        else:
            self.fast = None
            self.model = (make_aggregator or Aggregator)(self.config)
            self._decide = self._decide_golden
            self._table = LearningTable()
            self.batch_io = False
        # The clock starts once the engine is up: a co-simulation's gateware, built and reset meanwhile, would
        # otherwise simulate the build's seconds as lease ticks before its first frame.
        self._started = time.monotonic()
        self.dst_mac = self.config.mac.to_bytes(6, "big")
        self.parents: dict[int, tuple[SlotKey, Address]] = {}
        """slot -> (owner key, (ip, port)) of the partial this service last sent up for the slot: the one
        result it may relay next."""
        self.own = dict.fromkeys(SERVE_COUNTERS, 0)
        self._groups: dict[int, Address] = {}
        self._stop = threading.Event()
        self.control = (ControlPlane(self.install_job, self.remove_job, self.leave_job, key, self.log) if registered
                        else None)
        self._next_expiry = 0.0

    @property
    def learned(self) -> Learned:
        """slot -> (owner key, {sender index: (ip, port)} of members, {(ip, port)} of child aggregators),
        learned from the accepted contributions and partials of the slot's current owner (`LearningTable`); a
        copy."""
        return self._table.learned()

    @property
    def description(self) -> str:
        if self.fast is not None:
            return "the fast path (compiled, bit-exact with the golden model)"
        return "the golden model" if isinstance(self.model, Aggregator) else type(self.model).__name__

    def slot_key(self, slot: int) -> SlotKey | None:
        """(job, round, clique, chunk) owning `slot`, or None while it was never used."""
        if self.fast is not None:
            return self.fast.slot_key(slot)
        if not isinstance(self.model, Aggregator):
            raise ServeError(f"{self.description} does not tell who owns its slots")
        return self.model.slots[slot].key

    def install_job(self, entry: JobEntry) -> int:
        """The control plane's write to the engine's job tables: install or renew `entry`; its first slot."""
        install = getattr(self.fast if self.fast is not None else self.model, "install", None)
        if install is None:
            raise RequestError(f"{self.description} holds no job tables (serve --golden takes registered jobs)")
        return install(entry)

    def remove_job(self, job: int) -> bool:
        """Tear `job` down in the engine's job tables; whether it was there."""
        remove = getattr(self.fast if self.fast is not None else self.model, "remove", None)
        return False if remove is None else remove(job)

    def leave_job(self, job: int, members: Iterable[Endpoint]) -> tuple[int, int]:
        """`members` leave `job` in the engine's job tables: (how many were members, how many remain)."""
        leave = getattr(self.fast if self.fast is not None else self.model, "leave", None)
        return (0, 0) if leave is None else leave(job, members)

    def handle(self, payload: Payload, peer: Address, now: int | None = None) -> list[Send]:
        """The datagrams to send for `payload` from `peer`, arrived at `now` (lease ticks; None: `ticks()`), for
        every engine alike: a control message goes to the control port; the service answers or refuses what it
        looks at itself; the engine decides the rest (`_decide`), and its answer goes where it goes."""
        if self.control is not None and is_control(payload):
            return self._control(payload, peer)
        if len(payload) > 3 and payload[3] in _SERVICE_OPCODES:
            refused = self._refused_before_deciding(payload, peer)
            if refused is not None:
                return refused
        disposition, answer = self._decide(payload, peer, self.ticks() if now is None else now)
        return [] if answer is None else self._send_answer(payload, peer, disposition, answer)

    def _control(self, payload: Payload, peer: Address) -> list[Send]:
        """The control plane's reply to a control message, if any (never to this service itself)."""
        assert self.control is not None  # only a service with a control port gets here
        reply = self.control.handle(payload, peer, time.time())
        return [] if reply is None else self._unless_own([(reply, (peer[0], peer[1]))])

    def ticks(self) -> int:
        """Milliseconds since the service started: the arrival time of a datagram read now."""
        return int((time.monotonic() - self._started) / LEASE_TICK_S)

    def _refused_before_deciding(self, payload: Payload, peer: Address) -> list[Send] | None:
        """Datagrams the service itself answers or refuses before the aggregator decides: a result (relayed
        or refused) with `unicast`, a stats request from elsewhere, anything from its own address. None
        when the aggregator decides."""
        opcode = payload[3]
        if opcode == Opcode.RESULT:
            # A version 3 result comes down from a parent in its job's tables: the aggregator decides it.
            return self._relay(payload, peer) if self.unicast and payload[2] != JOB_VERSION else None
        if opcode == Opcode.STATS_REQUEST and not self._may_ask_stats(peer[0]):
            self.own["stats_refused"] += 1
            return []
        return None

    def _may_ask_stats(self, host: str) -> bool:
        address = ipaddress.IPv4Address(host)
        return address.is_loopback or address in self.stats_from

    def _send_answer(self, payload: Payload, peer: Address, disposition: int | None,
                     answer: bytes | list[Send]) -> list[Send]:
        """Where the engine's answer to `payload` from `peer` goes: a version 3 answer names its sends."""
        if isinstance(answer, list):
            return self._unless_own(answer)
        if answer[3] == _PARTIAL:
            return self._partial(answer, (ip_str(next_hop(payload)), self.config.port))
        if answer[3] != _RESULT:
            return self._unless_own([(answer, peer)])
        answered = disposition == _ANSWERED
        if self.unicast:
            return self._unicast_copies(answer, peer, answered)
        group = int.from_bytes(answer[_GROUP_AT:_GROUP_AT + 4], "big")
        destination = self._groups.get(group)
        if destination is None:
            destination = self._groups[group] = (ip_str(group), self.config.port)
        return [(answer, destination)]

    def _decide_golden(self, payload: Payload, peer: Address, now: int) -> tuple[int | None, bytes | list[Send] | None]:
        """The golden model's (or a co-simulation's) decision on the frame `payload` would have arrived in from
        `peer`, as `_decide`: the disposition is the counter that moved (None if none did)."""
        model = self.model
        assert model is not None  # this path serves only with it
        frame = wrap(payload, peer, self._at, self.dst_mac)
        before = model.stats()
        outputs = model.process(frame, now)
        if len(payload) > 2 and payload[2] == JOB_VERSION:
            # Each output to where the model addressed it, from the job's tables (a stats reply: the asker).
            return None, [(payload_of(output), (ip_str(frame_field(output, "ip_dst")),
                                                frame_field(output, "udp_dport"))) for output in outputs]
        after = model.stats()
        disposition = next((number for number, name in _DISPOSITIONS if after[name] != before[name]), None)
        if disposition == _ACCUMULATED or disposition == _ANSWERED:
            assert isinstance(self._table, LearningTable)  # the golden path's own
            self._table.learn(payload, peer)
        # Versions 1 and 2 answer with one frame at most: to the requester, the next hop up or the group, as
        # `_send_answer` reads from the payloads.
        return disposition, payload_of(outputs[0]) if outputs else None

    def decide_at(self, destination: int) -> None:
        """With a wildcard listen address: decide the next datagrams as the aggregator at IPv4 `destination`
        (an int, the address they arrived on; 0 when the kernel did not say, which no route may name)."""
        if destination == self.config.ip:
            return
        # The upstream prefix stays the listen address's (0.0.0.0/24, nowhere, unless --upstream is given).
        self.config = replace(self.config, ip=destination, upstream=self.config.upstream_prefix)
        self._at = (ip_str(destination) if destination else self.address[0], self.address[1])
        if self.fast is not None:
            self.fast.config = self.config
        elif self.model is not None:
            self.model.config = self.config

    def _partial(self, body: bytes, parent: Address) -> list[Send]:
        """Send a partial to `parent` (never to this service) and earn the one relay of its result."""
        if self._is_own(parent):
            self.own["sends_refused"] += 1
            return []
        slot, key, _ = _owner(body)
        self.parents[slot] = (key, parent)
        return [(body, parent)]

    def _unicast_copies(self, body: bytes, peer: Address, answered: bool) -> list[Send]:
        if answered:
            return self._unless_own([(body, peer)])
        copies = self._copies(body)
        self.own["unicast_copies"] += len(copies)
        return copies

    def _copies(self, body: bytes, parent: Address | None = None) -> list[Send]:
        """A result for each member and child aggregator learned for its slot's owner, except `parent`
        (where a relayed result came from) and this service."""
        return self._unless_own(self._table.copies(body, parent))

    def _relay(self, payload: Payload, peer: Address) -> list[Send] | None:
        """Copies of a result for everyone below, when it answers the partial this service last sent up for
        its slot, from the parent it went to: once per partial sent. None for any other result (the aggregator's
        decision then counts it, as `drop_opcode`)."""
        if len(payload) < PAYLOAD_HEADER_BYTES:
            return None
        slot, key, _ = _owner(payload)
        peer = (peer[0], peer[1])
        if self.parents.get(slot) != (key, peer):
            return None
        del self.parents[slot]
        copies = self._copies(bytes(payload), parent=peer)
        self.own["results_relayed"] += len(copies)
        return copies

    def _unless_own(self, sends: Sequence[Send]) -> list[Send]:
        """`sends` without those addressed to this service, which are counted."""
        if self.wildcard:
            kept = [send for send in sends if not self._is_own(send[1])]
        else:
            address = self.address  # `_is_own` without a wildcard, inline: once per unicast copy
            kept = [send for send in sends if tuple(send[1]) != address]
        self.own["sends_refused"] += len(sends) - len(kept)
        return kept

    def _is_own(self, destination: Address) -> bool:
        """Whether a datagram to `destination` (ip, port) would come back to this service."""
        if tuple(destination) == self.address:
            return True
        if not self.wildcard or destination[1] != self.address[1]:
            return False
        local = self._local.get(destination[0])
        if local is None:
            if len(self._local) >= LOCAL_CACHE:
                self._local.clear()
            local = self._local[destination[0]] = _is_local_address(destination[0])
        return local

    def send(self, sends: Sequence[Send]) -> None:
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

    def counters(self) -> dict[str, int]:
        engine = self.fast if self.fast is not None else self.model
        assert engine is not None  # one of them serves
        control = {} if self.control is None else self.control.counters
        return {**engine.stats(), **self.own, **control}

    def counters_line(self, prefix: str = "counters") -> str:
        counters = self.counters()
        # Drops that retransmissions cause on a healthy run are counted apart, so that `drops` means trouble.
        drops = sum(counters[name] for name in FAULT_DROP_COUNTERS)
        repeated = sum(counters[name] for name in RETRANSMISSION_DROP_COUNTERS)
        shown = [f"{name}={value}" for name, value in counters.items()
                 if value and name not in ("frames_in",)]
        # Datagrams the kernel dropped before the aggregator saw them (receive buffer full): not in frames_in.
        kernel = socket_drops(self.sock)
        shown += [] if kernel is None else [f"kernel_drops={kernel}"]
        return (f"{prefix} frames_in={counters['frames_in']} drops={drops} retransmission_drops={repeated} "
                + " ".join(shown))

    def serve(self, stats_interval: float | None = None) -> None:
        """Receive and answer until `stop()`; logs counters every `stats_interval` seconds and at the end.

        The socket is drained without waiting while it holds datagrams; only an empty socket is waited on
        (at most POLL_S, so that a stop request is seen). With the compiled kernel, datagrams are read
        with one recvmmsg and the answers to a batch leave with one sendmmsg."""
        self._next_log = time.monotonic() + stats_interval if stats_interval else None
        self._stats_interval = stats_interval or 0.0
        if self.batch_io:
            self._serve_batched()
        else:
            self._serve_each()
        self.log(f"inwire serve: stopped; final {self.counters_line()}")

    def _log_due(self) -> None:
        """Log the counters when their interval is up; and, once a second, remove expired registrations."""
        if self.control is not None and time.monotonic() >= self._next_expiry:
            self._next_expiry = time.monotonic() + EXPIRY_INTERVAL_S
            self.control.expire(time.time())
        if self._next_log is not None and time.monotonic() >= self._next_log:
            self.log(f"inwire serve: {self.counters_line()}")
            self._next_log += self._stats_interval

    def _serve_each(self) -> None:
        buffer = bytearray(MAX_DATAGRAM)
        view = memoryview(buffer)
        sock, stopped, handle = self.sock, self._stop.is_set, self.handle
        receive = self._receive_with_destination if self.wildcard else sock.recvfrom_into
        size: int | None
        while not stopped():
            try:
                size, peer = receive(buffer)
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

    def _receive_with_destination(self, buffer: bytearray) -> tuple[int, Address]:
        """recvfrom_into that also decides the datagram as the aggregator at the address it arrived on."""
        size, ancillary, _, peer = self.sock.recvmsg_into([buffer], PKTINFO_BYTES)
        destination = 0
        for level, kind, data in ancillary:
            if level == socket.IPPROTO_IP and kind == IP_PKTINFO:
                destination = int.from_bytes(data[8:12], "big")
        self.decide_at(destination)
        return size, peer

    def _serve_batched(self) -> None:
        slot = MAX_DATAGRAM + 1
        buffer = bytearray(slot * BATCH)
        view = memoryview(buffer)
        sock, fd, stopped, handle_batch = self.sock, self.sock.fileno(), self._stop.is_set, self.handle_batch
        receive = compiled.recv_batch
        destinations: list[int] | None = [] if self.wildcard else None
        while not stopped():
            try:
                if destinations is None:
                    batch = receive(fd, buffer, slot, True)
                else:
                    destinations.clear()
                    batch = receive(fd, buffer, slot, True, destinations)
            except OSError:
                continue  # an ICMP error from an earlier send: read on
            if not batch:
                select.select([sock], [], [], POLL_S)
                self._log_due()
                continue
            # one arrival time for the datagrams one recvmmsg read
            sends = handle_batch(buffer, batch, slot, self.ticks(), view, destinations)
            if sends:
                if len(sends) > 1:
                    # Grouped by destination (stable: each peer's order kept), so that a peer's results form
                    # runs that leave as one GSO message.
                    sends.sort(key=_destination)
                self.send_batch(sends)
            self._log_due()

    def handle_batch(self, buffer: bytearray, batch: Sequence[tuple[int, Address]], slot: int, now: int,
                     view: memoryview | None = None, destinations: Sequence[int] | None = None) -> list[Send]:
        """`handle` on each datagram of one recvmmsg batch in turn (batch[i] is its (size, peer), its bytes at
        i * `slot` in `buffer`; `view` a memoryview of it), all arrived at `now`: the datagrams to send, in
        that order. With the compiled decider its common case takes one call for the batch
        (`Decider.serve_batch`), and only the datagrams whose answers the service sends itself come back here.
        `destinations` (wildcard listen address): the address each datagram arrived on, which decides it."""
        view = memoryview(buffer) if view is None else view
        if destinations:
            sends: list[Send] = []
            start = 0
            while start < len(batch):
                # one run of datagrams that arrived on one address
                end = start + 1
                while end < len(batch) and destinations[end] == destinations[start]:
                    end += 1
                self.decide_at(destinations[start])
                sends += self._handle_run(buffer, batch[:end], start, slot, now, view)
                start = end
            return sends
        return self._handle_run(buffer, batch, 0, slot, now, view)

    def _handle_run(self, buffer: bytearray, batch: Sequence[tuple[int, Address]], start: int, slot: int, now: int,
                    view: memoryview) -> list[Send]:
        """`handle` on each datagram of `batch` from `start` on. With the compiled decider, runs of them are
        decided in one call (`_decide_run`); control messages, which it would drop as data frames of no known
        version, end a run and go through `handle`."""
        sends: list[Send] = []
        if self.fast is None:
            handle = self.handle
            for index in range(start, len(batch)):
                size, peer = batch[index]
                sends += handle(view[index * slot:index * slot + size], peer, now)
            return sends
        # One slice of the batch's version bytes tells whether any datagram may be one (most batches: none).
        if self.control is None or _CONTROL_MARK not in buffer[start * slot + _CONTROL_MARK_AT:len(batch) * slot:slot]:
            return self._decide_run(buffer, batch, start, slot, now, view)
        at, magic_bytes = buffer.startswith, len(MAGIC)
        # a datagram's size first: the bytes past it are an earlier datagram's
        controls = [index for index in range(start, len(batch))
                    if batch[index][0] >= magic_bytes and at(MAGIC, index * slot)]
        for index in controls:
            if index > start:
                sends += self._decide_run(buffer, batch[:index], start, slot, now, view)
            size, peer = batch[index]
            sends += self.handle(view[index * slot:index * slot + size], peer, now)
            start = index + 1
        return sends + self._decide_run(buffer, batch, start, slot, now, view)

    def _decide_run(self, buffer: bytearray, batch: Sequence[tuple[int, Address]], start: int, slot: int, now: int,
                    view: memoryview) -> list[Send]:
        """`handle` on the data datagrams of `batch` from `start` on, with the compiled decider: its common case
        (decided, learned and, with `unicast`, a completed result's copies made) takes one call for the run
        (`Decider.serve_batch`), which stops at each datagram the service looks at before deciding (that one
        goes through `handle`) and at each answer that goes elsewhere (through `_send_answer`)."""
        assert self.fast is not None  # runs are decided in one call only by the compiled decider
        serve_batch, counts, index, end = self.fast.serve_batch, self.own, start, len(batch)
        sends: list[Send] = []
        own = self.address if self._copies_in_decider else None
        while index < end:
            index, decided, refused, copies = serve_batch(buffer, batch, slot, index, now, own, sends)
            counts["sends_refused"] += refused
            counts["unicast_copies"] += copies
            if index < end:
                size, peer = batch[index]
                payload = view[index * slot:index * slot + size]
                sends += (self.handle(payload, peer, now) if decided is None
                          else self._send_answer(payload, peer, *decided))
                index += 1
        return sends

    def send_batch(self, sends: Sequence[Send]) -> None:
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

    def stop(self) -> None:
        self._stop.set()

    def close(self) -> None:
        self.sock.close()
        close = getattr(self.model, "close", None)  # a co-simulation has a simulator to end
        if close is not None:
            close()


def _is_local_address(host: str) -> bool:
    """Whether IPv4 `host` is an address of this machine: only a local address can be bound."""
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.bind((host, 0))
    except OSError:
        return False
    finally:
        probe.close()
    return True


_SERVICE_OPCODES = frozenset((int(Opcode.RESULT), int(Opcode.STATS_REQUEST)))
"""Opcodes that the service itself looks at before the aggregator."""
_PARTIAL, _RESULT = int(Opcode.PARTIAL), int(Opcode.RESULT)
_LEARNED_OPCODES = frozenset((int(Opcode.CONTRIBUTION), _PARTIAL))
"""Opcodes whose sender the service learns for unicast copies, when the aggregator takes or answers them."""
_ACCUMULATED, _ANSWERED = int(Disposition.ACCUMULATED), int(Disposition.ANSWERED)
_DISPOSITIONS = tuple((int(disposition), disposition.name.lower()) for disposition in Disposition)
"""(number, counter) of each disposition: the golden path's decision is the counter that moved."""
_GROUP_AT = FRAME_OFFSETS["group"] - PAYLOAD_OFFSET
_CONTROL_MARK_AT = FRAME_OFFSETS["version"] - PAYLOAD_OFFSET
_CONTROL_MARK = MAGIC[_CONTROL_MARK_AT:_CONTROL_MARK_AT + 1]
"""The byte of a control message where a data header has its version: "C", no version of the protocol."""


class LearningTable:
    """Who sent the accepted or answered version 1 and 2 contributions and partials of each slot's current owner,
    for a result's unicast copies: a member by its index, an aggregator below by its address. Bounded by the
    slots: a slot's new owner starts its entry over. The compiled decider keeps the same table (`learned` and
    `copies` alike, `_fastpath.c`), where it decides."""

    def __init__(self) -> None:
        self._entries: Learned = {}

    def learn(self, payload: Payload, peer: Address) -> None:
        """Note `peer` as the sender of `payload`, which the engine accepted or answered (its header is whole)."""
        opcode = payload[3]
        if opcode not in _LEARNED_OPCODES:
            return
        slot, key, sender = _owner(payload)
        entry = self._entries.get(slot)
        if entry is None or entry[0] != key:
            entry = self._entries[slot] = (key, {}, set())
        if opcode == _PARTIAL:
            entry[2].add(peer)
        else:
            entry[1][sender] = peer

    def copies(self, body: bytes, parent: Address | None = None) -> list[Send]:
        """Result `body` for each member learned for its slot's owner whose bit its bitmap holds (by index),
        then each child aggregator (sorted), except `parent`."""
        slot, key, _ = _owner(body)
        entry = self._entries.get(slot)
        if entry is None or entry[0] != key:
            return []
        bitmap, = _BITMAP.unpack_from(body, _BITMAP_AT)
        addresses = [address for sender, address in sorted(entry[1].items()) if bitmap >> sender & 1]
        addresses += sorted(entry[2])
        return [(body, address) for address in addresses if address != parent]

    def learned(self) -> Learned:
        """slot -> (owner key, {sender index: (ip, port)}, {(ip, port)} of children): a copy."""
        return {slot: (key, dict(members), set(children)) for slot, (key, members, children) in self._entries.items()}


class Served(Protocol):
    """A service `serving_in_thread` runs: `SoftwareAggregator`, or one that serves as it does."""

    def serve(self) -> None: ...

    def stop(self) -> None: ...

    def close(self) -> None: ...


ServedT = TypeVar("ServedT", bound=Served)


@contextlib.contextmanager
def serving_in_thread(server: ServedT, serve: Callable[[], object] | None = None) -> Iterator[ServedT]:
    """Run `server.serve()` (or `serve`, which runs it) in a thread for the body of a with-statement; stop and
    close it afterwards."""
    thread = threading.Thread(target=serve or server.serve, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.stop()
        thread.join(timeout=5)
        server.close()
