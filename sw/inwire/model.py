"""The golden model of the aggregator: frame in, frames out, bit for bit what the gateware does.

It is also the software aggregator (`inwire serve`). Every input frame gets exactly one disposition
(`protocol.Disposition`) and produces at most one output frame:

- forwarded: the frame itself, unchanged;
- accumulated: nothing, or the slot's output when it completed its level: the result, multicast to the
  group, at the root; a partial, sent to the next aggregator up (`hop1`), below it;
- answered: the stored output (retransmitted contribution or partial, result request) or a stats reply;
- dropped: nothing.

Reduction trees: a contribution holds a set of members (`bitmap`; a partial holds several) and names its
level, the members the receiving aggregator gathers (`expect`), and the aggregators above (`hop1`,
`hop2` with their levels). A slot completes when the disjoint member sets summed into it make up its level.

A frame acts atomically: a frame dropped for any reason leaves every slot as it was.

Time is explicit: `process(frame, now)` takes the frame's arrival time in ticks of the lease timer (the
gateware counts them on its `lease_tick` input; `inwire serve` counts milliseconds, `LEASE_TICK_S`). It
only matters to slot leases: an unfinished slot that has seen no accepted contribution for
`AggregatorConfig.lease` ticks may be claimed by any owner. Times count modulo 2**TIME_BITS, as the
gateware's timer and stamps do.
"""

import copy
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .jobs import FLAT, CliqueRoute, Endpoint, JobEntry, JobLimits, JobTable
from .packets import build_frames, frame_field, ipv4_header_valid, mac_bytes, parse_header
from .protocol import (
    COUNTERS,
    ELEMENT_DTYPE,
    ETHERNET_BYTES,
    ETHERTYPE_IPV4,
    FRAME_HEADER_BYTES,
    GATEWAY_MAC,
    INT32_MAX,
    INT32_MIN,
    INWIRE_PORT,
    IP_FRAGMENT_MASK,
    IP_PROTO_UDP,
    IP_VER_IHL,
    IPV4_BYTES,
    JOB_VERSION,
    MAGIC,
    MAX_FANIN,
    MAX_RESULT_ELEMENTS,
    MIN_FRAME_BYTES,
    OPEN_VERSIONS,
    RESULT_TRAILER_BYTES,
    STATUS_OVERFLOW,
    SUMMED_OPCODES,
    Disposition,
    Opcode,
    clique_mask,
    frame_bytes,
    is_multicast_group,
    multicast_mac,
)

ACCEPTED_OPCODES = (Opcode.CONTRIBUTION, Opcode.PARTIAL, Opcode.RESULT_REQUEST, Opcode.STATS_REQUEST)
TIME_BITS = 16
"""Width of the lease timer and of each slot's activity stamp: idle time is (now - stamp) mod 2**TIME_BITS,
so a slot idle for k * 2**TIME_BITS + t ticks counts as idle for t (65.5 s at LEASE_TICK_S: an abandoned
slot looks live again for one lease in every 65.5 s). Narrow, so that the gateware's subtraction and
comparison stay short carry chains."""
DEFAULT_UPSTREAM_LENGTH = 24
"""Without a configured upstream prefix an aggregator sends partials only within the /24 of its own address."""
LEASE_TICK_S = 0.001
"""The tick `inwire serve` counts and a board's prescaler makes: one millisecond."""
DEFAULT_LEASE = 2000
"""Ticks (2 s at LEASE_TICK_S): ten of `inwire stream`'s default retransmission timeouts, so a live round's
members retransmit many times before it can lose its slot, and well under the 5 s a stream waits in all,
so a stream that finds an abandoned slot still completes."""


@dataclass(frozen=True)
class AggregatorConfig:
    """What an aggregator is: its addresses and its sizes (the gateware's parameters)."""
    mac: int = 0x02_49_57_00_00_01
    ip: int = 0x0A_49_57_01
    port: int = INWIRE_PORT
    slots: int = 16
    max_elements: int = 256
    max_fanin: int = MAX_FANIN
    gateway_mac: int = GATEWAY_MAC
    """Destination MAC of the partials it sends up a reduction tree: its next-hop router's."""
    lease: int = DEFAULT_LEASE
    """Ticks without an accepted contribution after which an unfinished slot may be claimed by any owner,
    and a completed one by an older frame of its job; 0 for no lease (an unfinished slot then waits for its
    owner, or a newer round of its job, forever)."""
    upstream: tuple[int, int] | None = None
    """(network, prefix length): the only addresses partials may be sent to, the aggregators above this one;
    None: the /24 of `ip`."""
    registered: bool = False
    """Holds job tables (`install`): version 3 frames of registered jobs count. The gateware holds them when
    built with it, sized by `limits` (`inwire_hdl.job_table`: jobs with a group, routes with `TREE_LIMITS`)."""
    unregistered: bool = True
    """Takes version 1 and 2 frames, whose headers name their fan-in, group, level and route: for captures
    and the lab. An aggregator shared by jobs that do not trust each other takes registered jobs only."""
    limits: JobLimits = JobLimits()
    """How much the job tables hold (with `registered`)."""

    def __post_init__(self) -> None:
        mac_bytes(self.mac)
        mac_bytes(self.gateway_mac)
        checks = {"ip": (self.ip, 0, 2**32 - 1), "port": (self.port, 1, 2**16 - 1),
                  "slots": (self.slots, 1, 2**16), "max_elements": (self.max_elements, 1, MAX_RESULT_ELEMENTS),
                  "max_fanin": (self.max_fanin, 1, MAX_FANIN), "lease": (self.lease, 0, 2**TIME_BITS - 1)}
        for name, (value, low, high) in checks.items():
            if not isinstance(value, (int, np.integer)) or isinstance(value, bool):
                raise TypeError(f"aggregator {name} must be an integer, got {value!r}")
            if not low <= value <= high:
                raise ValueError(f"aggregator {name} must lie in [{low}, {high}], got {value}")
        network, length = self.upstream_prefix
        if not (0 <= network < 2**32 and 0 <= length <= 32) or network & ~_prefix_mask(length) & 0xFFFFFFFF:
            raise ValueError(f"aggregator upstream must be (network, prefix length) with no host bits set, "
                             f"got {self.upstream!r}")

    @property
    def upstream_prefix(self) -> tuple[int, int]:
        """(network, prefix length) of the addresses partials may go to."""
        if self.upstream is None:
            return self.ip & _prefix_mask(DEFAULT_UPSTREAM_LENGTH), DEFAULT_UPSTREAM_LENGTH
        network, length = self.upstream
        return int(network), int(length)

    def is_upstream(self, address: int) -> bool:
        """Whether a partial may be sent to IPv4 `address` (an int)."""
        network, length = self.upstream_prefix
        return address & _prefix_mask(length) == network


def _prefix_mask(length: int) -> int:
    return (0xFFFFFFFF << (32 - length)) & 0xFFFFFFFF


@dataclass
class Slot:
    key: tuple[int, int, int, int] | None = None
    """(job, round, clique, chunk) of the slot's owner; None while the slot was never used."""
    fanin: int = 0
    group: int = 0
    count: int = 0
    exponent: int = 0
    level: int = 0
    """The members this slot gathers (`expect`, 0 resolved to the whole clique)."""
    bitmap: int = 0
    overflow: bool = False
    complete: bool = False
    stamp: int = 0
    """Arrival time of the slot's last accepted contribution."""
    sums: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    sources: dict[int, Endpoint] = field(default_factory=dict)
    """Version 3: member index -> the address its contribution came from (one of the job's members)."""
    children: set[Endpoint] = field(default_factory=set)
    """Version 3: the child aggregators whose partials the slot holds."""
    final: bool = False
    """Version 3, below the root: the clique's result came down from the parent and replaced the sums."""
    asked: int = 0
    """Version 3, below the root, before the result came down: the member indices (of `sources`) whose
    retransmitted contribution sent the partial up again."""
    asked_children: set[Endpoint] = field(default_factory=set)
    """Likewise, the child aggregators (of `children`) whose retransmitted partial did."""


def round_is_newer(candidate: int, current: int) -> bool:
    """Serial-number comparison of 32-bit rounds, so that round numbers may wrap."""
    return 0 < ((candidate - current) & 0xFFFFFFFF) < 2**31


def is_older(key: tuple[int, int, int, int], owner: tuple[int, int, int, int]) -> bool:
    """Whether a frame of owner key `key` (job, round, clique, chunk) is older than the slot's `owner`: the
    same job and an earlier round (serial order, so rounds may wrap), or the same round and clique and an
    earlier chunk (chunks are offsets within one vector and do not wrap)."""
    job, round_, clique, chunk = key
    owner_job, owner_round, owner_clique, owner_chunk = owner
    if job != owner_job:
        return False
    if round_ != owner_round:
        return round_is_newer(owner_round, round_)
    return clique == owner_clique and chunk < owner_chunk


def _route_allowed(config: AggregatorConfig, source: int, tree: "TreeFields") -> bool:
    """Where a frame's route may send this aggregator's partial: up, never to itself or back to the frame's
    source, only within the upstream prefix; and `hop2` only above a `hop1`, distinct from it and from this
    aggregator. Version 1 frames and a root's frames (every hop 0) have no route to check."""
    if not tree.hop1:
        return not tree.hop2
    return (tree.hop1 != config.ip and tree.hop1 != source and config.is_upstream(tree.hop1)
            and tree.hop2 != tree.hop1 and tree.hop2 != config.ip)


def _lengths_disagree(frame: bytes, header: np.void) -> bool:
    expected = frame_bytes(int(header["count"]), int(header["opcode"]))
    return (len(frame) != expected or header["ip_len"] != expected - ETHERNET_BYTES
            or header["udp_len"] != expected - ETHERNET_BYTES - IPV4_BYTES)


FrameCheck = Callable[["Aggregator", bytes, Any], Any]
"""A check's test: (aggregator, frame, parsed header or None before the header is read) -> whether it applies."""

FRAME_CHECKS: tuple[tuple[Disposition, str, FrameCheck], ...] = (
    (Disposition.DROP_RUNT, "it is shorter than 60 bytes",
     lambda agg, frame, header: len(frame) < MIN_FRAME_BYTES),
    (Disposition.FORWARDED, "it is not IPv4/UDP to the aggregator's address and port",
     lambda agg, frame, header: not agg._addressed_to_me(frame)),
    (Disposition.DROP_IP_HEADER, "its IPv4 version is not 4 or its header is not 5 words",
     lambda agg, frame, header: frame_field(frame, "ip_ver_ihl") != IP_VER_IHL),
    (Disposition.DROP_IP_FRAGMENT, "it is an IPv4 fragment",
     lambda agg, frame, header: frame_field(frame, "ip_frag") & IP_FRAGMENT_MASK),
    (Disposition.DROP_IP_CHECKSUM, "its IPv4 header checksum is wrong",
     lambda agg, frame, header: not ipv4_header_valid(frame)),
    (Disposition.DROP_LENGTH, f"it is shorter than the {FRAME_HEADER_BYTES}-byte header",
     lambda agg, frame, header: len(frame) < FRAME_HEADER_BYTES),
    (Disposition.DROP_VERSION, "its magic or version is unknown, or a version the aggregator does not take: 3 "
                               "without job tables (`registered`), 1 and 2 without `unregistered`",
     lambda agg, frame, header: header["magic"] != MAGIC or not agg.takes_version(int(header["version"]))),
    (Disposition.DROP_OPCODE, "its opcode is not contribution, partial, result request or stats request (or, "
                              "version 3, result: one coming down a tree)",
     lambda agg, frame, header: header["opcode"] not in ACCEPTED_OPCODES
     and not (header["opcode"] == Opcode.RESULT and header["version"] == JOB_VERSION)),
    (Disposition.DROP_LENGTH, "frame length, IPv4 and UDP lengths and element count disagree",
     lambda agg, frame, header: _lengths_disagree(frame, header)),
    (Disposition.DROP_JOB, "it is version 3 and its job is not in the aggregator's tables",
     lambda agg, frame, header: header["version"] == JOB_VERSION and agg.entry(header) is None),
    (Disposition.DROP_TOKEN, "it is version 3 and its token is not its job's",
     lambda agg, frame, header: header["version"] == JOB_VERSION and header["token"] != agg.job_of(header).token),
    (Disposition.DROP_MEMBER, "it is version 3 and its source (IPv4 address and UDP port) is not where its job's "
                              "tables say it may come from: a member for a contribution, result request or stats "
                              "request, a child aggregator of its clique for a partial (holding none but that child's "
                              "members), the clique's parent for a result",
     lambda agg, frame, header: header["version"] == JOB_VERSION and not agg.source_allowed(frame, header)),
    (Disposition.ANSWERED, "it is a stats request (whatever its other fields say; version 3 only once the checks "
                           "above passed, from a member of its job: the reply is larger than the request)",
     lambda agg, frame, header: header["opcode"] == Opcode.STATS_REQUEST),
    (Disposition.DROP_FANIN, "its fan-in is 0 or above the aggregator's maximum",
     lambda agg, frame, header: not 1 <= header["fanin"] <= agg.config.max_fanin),
    (Disposition.DROP_SENDER, "its sender index is not below its fan-in, it holds a member outside its level, "
                              "or its level has a member not below its fan-in",
     lambda agg, frame, header: header["sender"] >= header["fanin"] or not agg.members_valid(header)),
    (Disposition.DROP_COUNT, "its element count is 0 or above the aggregator's maximum",
     lambda agg, frame, header: not 1 <= header["count"] <= agg.config.max_elements),
    (Disposition.DROP_GROUP, "its group is not in 239.0.0.0/8, or it is version 3 and its group is not its job's",
     lambda agg, frame, header: not agg.group_valid(header)),
    (Disposition.DROP_SLOT, "its slot is beyond the aggregator's slots, or it is version 3 and its slot is beyond "
                            "its job's quota, or it is version 1 or 2 and its slot is one a registered job holds",
     lambda agg, frame, header: not agg.slot_valid(header)),
    (Disposition.DROP_ROUTE, "its `hop1` is the aggregator's own address, the frame's IPv4 source or outside "
                             "the aggregator's upstream prefix, or its `hop2` is set while `hop1` is 0, equals "
                             "`hop1` or is the aggregator's own address; or it is version 3 and its `expect` or a "
                             "hop is not 0",
     lambda agg, frame, header: not agg.route_valid(frame, header)),
)
"""The checks before any slot is looked at, in the order `Aggregator` applies them: (disposition, when,
test). The first that applies decides; docs/protocol.md lists them from here."""

SLOT_CHECKS = (
    (Disposition.RELAYED, "it is a version 3 result from the parent for the slot's owner, whose level is complete "
                          "and has no result yet: stored, and sent down"),
    (Disposition.DROP_MISMATCH, "it is such a result with another fan-in, count or exponent"),
    (Disposition.DROP_DUPLICATE, "it is such a result for a slot that has it already"),
    (Disposition.DROP_NO_RESULT, "it is any other version 3 result"),
    (Disposition.ANSWERED,
     "it is a result request for the slot's completed result, same job, round, clique and chunk (version 3 "
     "below the root: once the result came down)"),
    (Disposition.DROP_NO_RESULT, "it is any other result request"),
    (Disposition.DROP_MISMATCH,
     "it is a contribution or partial with the slot's owner but another fan-in, group, count, exponent or level"),
    (Disposition.ANSWERED, "it is a contribution or partial to its owner's completed slot: the stored output again"),
    (Disposition.DROP_DUPLICATE, "it is a contribution or partial holding a member already summed"),
    (Disposition.DROP_STALE, "it is a contribution or partial of the slot's owner's job but older, an earlier "
                             "round (serial order) or the same round and clique and an earlier chunk, while the "
                             "slot's lease has not run out"),
    (Disposition.DROP_COLLISION, "it is a contribution with another owner while the slot is unfinished, "
                                 "unless from the same job and a newer round (which reclaims the slot) or the "
                                 "slot's lease ran out: no accepted contribution for `lease` ticks (any owner "
                                 "claims it)"),
    (Disposition.ACCUMULATED, "it is any other contribution or partial: summed, and the slot's output sent when "
                              "its members make up the level (a result at the root, a partial below)"),
)
"""What happens next, by the slot the frame names, in the order `Aggregator` decides it. A version 3 frame
names a slot of its job's range: slot s of a job whose range starts at b is the aggregator's slot b + s."""

JOB_DISPOSITIONS = (Disposition.DROP_JOB, Disposition.DROP_TOKEN, Disposition.DROP_MEMBER, Disposition.RELAYED)
"""Dispositions that only an aggregator holding job tables (`AggregatorConfig.registered`) gives."""


class Aggregator:
    """The aggregator's state and behaviour; `process(frame, now)` returns the frames it sends."""

    def __init__(self, config: AggregatorConfig | None = None) -> None:
        self.config: AggregatorConfig = config or AggregatorConfig()
        self.slots = [Slot() for _ in range(self.config.slots)]
        self.counters = dict.fromkeys(COUNTERS, 0)
        self.now = 0
        """Arrival time of the latest frame, in lease ticks modulo 2**TIME_BITS."""
        self.jobs = JobTable(self.config.slots, self.config.limits)
        """The registered jobs (with `config.registered`): what the control interface writes."""

    def install(self, entry: JobEntry) -> int:
        """The control interface: install or renew a job's tables; returns the first slot of its range. A
        clash or a full table raises `JobTableError`. Installing a job frees nothing of another's."""
        if not self.config.registered:
            raise ValueError("this aggregator holds no job tables (AggregatorConfig.registered is off)")
        new = entry.job not in self.jobs.entries
        base = self.jobs.install(entry)
        if new:
            # Versions 1 and 2 may use a range while it is free: a new job must not find slots someone prepared
            # for it (stale or colliding ones it would wait behind, completed ones it would be answered from).
            for index in range(base, base + entry.slots):
                self.slots[index] = Slot()
        return base

    def remove(self, job: int) -> bool:
        """The control interface: tear a job down; its slots become free (and forget its sums)."""
        base = self.jobs.bases.get(job)
        entry = self.jobs.entries.get(job)
        if base is None or entry is None:
            return False
        for index in range(base, base + entry.slots):
            self.slots[index] = Slot()
        return self.jobs.remove(job)

    def leave(self, job: int, members: Iterable[Endpoint]) -> tuple[int, int]:
        """The control interface: `members` leave `job` (`JobTable.leave`): (how many were members, how many
        remain). The last member's leave removes the job as `remove` does; until then its slots stay as they
        are (a member that left still gets the results of the slots it contributed to)."""
        base, entry = self.jobs.bases.get(job), self.jobs.entries.get(job)
        left, remaining = self.jobs.leave(job, members)
        if base is not None and entry is not None and not remaining:
            for index in range(base, base + entry.slots):
                self.slots[index] = Slot()
        return left, remaining

    def takes_version(self, version: int) -> bool:
        if version == JOB_VERSION:
            return self.config.registered
        return version in OPEN_VERSIONS and self.config.unregistered

    def entry(self, header: np.void) -> JobEntry | None:
        """The tables of a version 3 frame's job, None when it is not registered."""
        return self.jobs.entries.get(int(header["job"]))

    def job_of(self, header: np.void) -> JobEntry:
        entry = self.entry(header)
        assert entry is not None, "checked before (DROP_JOB)"
        return entry

    def route(self, header: np.void) -> CliqueRoute:
        """A version 3 frame's clique route at this aggregator (flat and rooted here for other versions)."""
        if header["version"] != JOB_VERSION:
            return FLAT
        return self.job_of(header).route(int(header["clique"]))

    def source_allowed(self, frame: bytes, header: np.void) -> bool:
        source = (frame_field(frame, "ip_src"), frame_field(frame, "udp_sport"))
        opcode = header["opcode"]
        route = self.route(header)
        if opcode == Opcode.PARTIAL:
            held = route.children.get(source)
            return held is not None and tree_fields(header).members & ~held == 0
        if opcode == Opcode.RESULT:
            return route.parent == source
        return source in self.job_of(header).members

    def members_valid(self, header: np.void) -> bool:
        """Members within the level, and the level within the clique (sender < fan-in is checked before); a
        result coming down holds members of the whole clique."""
        tree = tree_fields(header, self.route(header))
        clique = clique_mask(header["fanin"])
        if header["opcode"] == Opcode.RESULT:
            return tree.members & ~clique == 0
        return tree.members & ~tree.level == 0 and tree.level & ~clique == 0

    def group_valid(self, header: np.void) -> bool:
        if header["version"] == JOB_VERSION:
            return int(header["group"]) == self.job_of(header).group
        return is_multicast_group(header["group"])

    def slot_valid(self, header: np.void) -> bool:
        if header["version"] == JOB_VERSION:
            return int(header["slot"]) < self.job_of(header).slots
        return int(header["slot"]) < self.config.slots and not self.jobs.holds(int(header["slot"]))

    def route_valid(self, frame: bytes, header: np.void) -> bool:
        if header["version"] == JOB_VERSION:
            return not any(int(header[name]) for name in ("expect", "hop1", "hop1_expect", "hop2", "hop2_expect"))
        return _route_allowed(self.config, frame_field(frame, "ip_src"), tree_fields(header))

    def slot_of(self, header: np.void) -> Slot:
        """The aggregator slot a frame names: for version 3, within its job's range."""
        index = int(header["slot"])
        if header["version"] == JOB_VERSION:
            index += self.jobs.bases[int(header["job"])]
        return self.slots[index]

    def process(self, frame: bytes | bytearray | memoryview, now: int | None = None) -> list[bytes]:
        """Feed one frame (bytes, without FCS) that arrived at `now` (lease ticks; None: no time passed
        since the previous frame); returns the list of frames sent in answer (0 or 1)."""
        if not isinstance(frame, (bytes, bytearray, memoryview)):
            raise TypeError(f"a frame is bytes, got {type(frame).__name__}")
        self.advance(now)
        disposition, output = self._classify_and_act(bytes(frame))
        self.counters["frames_in"] += 1
        self.counters[disposition.name.lower()] += 1
        return output

    def advance(self, now: int | None) -> None:
        """Set the time of the next frame; None leaves it as it is."""
        if now is None:
            return
        if not isinstance(now, (int, np.integer)) or isinstance(now, bool):
            raise TypeError(f"a frame's arrival time is an integer count of ticks, got {now!r}")
        self.now = int(now) % 2**TIME_BITS

    def stats(self) -> dict[str, int]:
        """Counters as a dict, in COUNTERS order."""
        return dict(self.counters)

    def lease_expired(self, slot: Slot) -> bool:
        """Whether `slot` has seen no accepted contribution for the lease, as of the current time."""
        lease = self.config.lease
        return lease != 0 and (self.now - slot.stamp) % 2**TIME_BITS >= lease

    def cut_through_abort(self, frame: bytes | bytearray | memoryview, data_width: int,
                          now: int | None = None) -> bytes | None:
        """The bytes of an answer that a cut-through aggregator sends whole before it aborts the answer
        because `frame`'s length is wrong, or None when it starts no answer; call it before `process(frame)`.

        The gateware decides at the end of the 128-byte header and answers while the frame still comes in.
        A request's whole length is known there, but a contribution's is not: when a contribution that holds
        the whole header would be answered (its IPv4 and UDP lengths agree with its count) and yet ends early
        or runs past its expected end, the answer's beats go out up to the output beat that matches the input
        beat where the length is found wrong, and that beat ends the frame with an abort (tuser, content not
        defined). It is the frame's last beat when the frame is short, the one holding its expected last byte
        when it is long. The frame itself is DROP_LENGTH and changes nothing, as `process` says. `now` is
        the frame's arrival time, as for `process`.
        """
        frame = bytes(frame)
        if len(frame) < FRAME_HEADER_BYTES or not self._addressed_to_me(frame):
            return None
        header = parse_header(frame)
        if header["magic"] != MAGIC or not self.takes_version(int(header["version"])) \
                or header["opcode"] not in SUMMED_OPCODES:
            return None
        expected = frame_bytes(int(header["count"]), int(header["opcode"]))
        if len(frame) == expected:
            return None
        as_announced = frame[:expected].ljust(expected, b"\0")
        ahead = copy.deepcopy(self)
        ahead.advance(now)
        disposition, answers = ahead._classify_and_act(as_announced)
        if disposition == Disposition.FORWARDED or not answers:
            return None
        wrong_beat = (min(len(frame), expected) - 1) // data_width
        return answers[0][:wrong_beat * data_width]

    def _classify_and_act(self, frame: bytes) -> tuple[Disposition, list[bytes]]:
        header: Any = None  # parsed once the checks reach the aggregation header
        for disposition, _condition, applies in FRAME_CHECKS:
            if disposition == Disposition.DROP_VERSION:
                # Every check from here on reads the aggregation header, which the frame now holds whole.
                header = parse_header(frame)
            if applies(self, frame, header):
                if disposition == Disposition.FORWARDED:
                    return disposition, [frame]
                if disposition == Disposition.ANSWERED:
                    return disposition, [self._stats_reply(header)]
                return disposition, []
        source = (frame_field(frame, "ip_src"), frame_field(frame, "udp_sport"))
        if header["opcode"] == Opcode.RESULT_REQUEST:
            return self._result_request(header, source)
        count = int(header["count"])
        elements = np.frombuffer(frame, dtype=ELEMENT_DTYPE, count=count, offset=FRAME_HEADER_BYTES)
        carried = (header["opcode"] in (Opcode.PARTIAL, Opcode.RESULT)
                   and int.from_bytes(frame[-RESULT_TRAILER_BYTES:], "big") & STATUS_OVERFLOW)
        if header["opcode"] == Opcode.RESULT:
            return self._relay(header, elements, bool(carried))
        return self._contribution(header, elements, bool(carried), source)

    def _addressed_to_me(self, frame: bytes) -> bool:
        return (frame_field(frame, "eth_type") == ETHERTYPE_IPV4 and frame_field(frame, "ip_proto") == IP_PROTO_UDP
                and frame_field(frame, "ip_dst") == self.config.ip
                and frame_field(frame, "udp_dport") == self.config.port)

    def _contribution(self, header: np.void, elements: np.ndarray, carried: bool,
                      source: Endpoint) -> tuple[Disposition, list[bytes]]:
        """Sum a contribution or partial from `source`; `carried` is a partial's overflow flag, set by a level
        below."""
        slot = self.slot_of(header)
        key = _key(header)
        route = self.route(header)
        members = tree_fields(header, route).members
        if slot.key == key:
            if (slot.fanin, slot.group, slot.count, slot.exponent, slot.level) != _shape(header, route):
                return Disposition.DROP_MISMATCH, []
            if slot.complete:
                return Disposition.ANSWERED, self._answer(header, slot, source)
            if slot.bitmap & members:
                return Disposition.DROP_DUPLICATE, []
        elif slot.key is None:
            self._claim(slot, header, route)
        elif is_older(key, slot.key) and not self.lease_expired(slot):
            return Disposition.DROP_STALE, []
        elif slot.complete:
            self._claim(slot, header, route)
        elif header["job"] == slot.key[0] and round_is_newer(int(header["round"]), slot.key[1]):
            self.counters["slots_reclaimed"] += 1
            self._claim(slot, header, route)
        elif self.lease_expired(slot):
            self.counters["leases_expired"] += 1
            self._claim(slot, header, route)
        else:
            return Disposition.DROP_COLLISION, []

        total = slot.sums + elements
        saturated = (total > INT32_MAX) | (total < INT32_MIN)
        if saturated.any():
            self.counters["saturations"] += 1
            slot.overflow = True
        slot.overflow |= carried
        slot.sums = np.clip(total, INT32_MIN, INT32_MAX)
        slot.bitmap |= members
        slot.stamp = self.now
        if header["version"] == JOB_VERSION:
            if header["opcode"] == Opcode.PARTIAL:
                slot.children.add(source)
            else:
                slot.sources[int(header["sender"])] = source
        if slot.bitmap != slot.level:
            return Disposition.ACCUMULATED, []
        slot.complete = True
        if header["version"] != JOB_VERSION:
            return Disposition.ACCUMULATED, [self._output(header, slot)]
        if route.parent is not None:
            return Disposition.ACCUMULATED, [self._partial_up(header, slot, route.parent)]
        return Disposition.ACCUMULATED, self._down(header, slot)

    def _result_request(self, header: np.void, source: Endpoint) -> tuple[Disposition, list[bytes]]:
        slot = self.slot_of(header)
        if slot.complete and slot.key == _key(header):
            if header["version"] != JOB_VERSION:
                return Disposition.ANSWERED, [self._output(header, slot)]
            if self.route(header).parent is None or slot.final:
                return Disposition.ANSWERED, [self._result_to(header, slot, source)]
        return Disposition.DROP_NO_RESULT, []

    def _relay(self, header: np.void, elements: np.ndarray, carried: bool) -> tuple[Disposition, list[bytes]]:
        """A version 3 result from the clique's parent: stored in the slot whose partial it answers, and sent
        down once; the slot's later retransmissions are answered with it, here, without going up again."""
        slot = self.slot_of(header)
        if slot.key != _key(header) or not slot.complete:
            return Disposition.DROP_NO_RESULT, []
        if (slot.fanin, slot.count, slot.exponent) != (int(header["fanin"]), int(header["count"]),
                                                        int(header["exponent"])):
            return Disposition.DROP_MISMATCH, []
        if slot.final:
            return Disposition.DROP_DUPLICATE, []
        slot.sums = elements.astype(np.int64)
        slot.bitmap = tree_fields(header).members
        slot.overflow = carried
        slot.final = True
        return Disposition.RELAYED, self._down(header, slot, relayed=True)

    def _claim(self, slot: Slot, header: np.void, route: CliqueRoute = FLAT) -> None:
        slot.key = _key(header)
        slot.fanin, slot.group, slot.count, slot.exponent, slot.level = _shape(header, route)
        slot.bitmap = 0
        slot.overflow = False
        slot.complete = False
        slot.final = False
        slot.sources = {}
        slot.children = set()
        slot.asked = 0
        slot.asked_children = set()
        slot.sums = np.zeros(slot.count, dtype=np.int64)

    def _answer(self, header: np.void, slot: Slot, source: Endpoint) -> list[bytes]:
        """The answer to a contribution or partial for a completed slot: for versions 1 and 2 its output
        again; for version 3 below the root the partial again until the result came down, else the result,
        to the frame's source alone."""
        if header["version"] != JOB_VERSION:
            return [self._output(header, slot)]
        parent = self.route(header).parent
        if parent is not None and not slot.final:
            if header["opcode"] == Opcode.PARTIAL:
                if source in slot.children:
                    slot.asked_children.add(source)
            elif int(header["sender"]) in slot.sources:
                slot.asked |= 1 << int(header["sender"])
            return [self._partial_up(header, slot, parent)]
        return [self._result_to(header, slot, source)]

    def _down(self, header: np.void, slot: Slot, relayed: bool = False) -> list[bytes]:
        """A version 3 result sent down from this aggregator: from the root, to the job's group; else a copy to
        each address a contribution the slot took here came from (members by index; one copy an address, however
        many members sent from it) and to each child aggregator whose partial it took. A result `relayed` from
        the parent of a job with a group answers retransmissions (the root sent it to the group already): its
        copies go only to those whose retransmission sent the partial up again (`Slot.asked`), so that the
        group does not get it twice; an aggregator that sends no copies (`JobLimits.unicast_results` False, as
        the gateware, one frame per result) sends it to the group again."""
        entry = self.job_of(header)
        if entry.group and (not relayed or not self.config.limits.unicast_results):
            return [self._v3_frame(header, slot, Opcode.RESULT, multicast_mac(entry.group), (entry.group,
                                                                                           self.config.port))]
        indices = [index for index in sorted(slot.sources) if not entry.group or slot.asked >> index & 1]
        children = sorted(slot.asked_children if entry.group else slot.children)
        destinations = [slot.sources[index] for index in indices] + children
        return [self._result_to(header, slot, destination) for destination in dict.fromkeys(destinations)]

    def _result_to(self, header: np.void, slot: Slot, destination: Endpoint) -> bytes:
        return self._v3_frame(header, slot, Opcode.RESULT, self.config.gateway_mac, destination)

    def _partial_up(self, header: np.void, slot: Slot, parent: Endpoint) -> bytes:
        return self._v3_frame(header, slot, Opcode.PARTIAL, self.config.gateway_mac, parent)

    def _v3_frame(self, header: np.void, slot: Slot, opcode: Opcode, eth_dst: int, destination: Endpoint) -> bytes:
        """A version 3 output of `slot` to `destination` (from the job's tables), for the frame `header`."""
        self.counters["partials_emitted" if opcode == Opcode.PARTIAL else "results_emitted"] += 1
        assert slot.key is not None, "only a claimed slot has an output"
        job, round_, clique, chunk = slot.key
        entry = self.job_of(header)
        frame = build_frames(
            slot.sums.astype(np.int32), eth_src=self.config.mac, eth_dst=eth_dst, ip_src=self.config.ip,
            ip_dst=destination[0], udp_sport=self.config.port, udp_dport=destination[1], version=JOB_VERSION,
            opcode=opcode, sender=int(header["sender"]), fanin=slot.fanin, exponent=slot.exponent,
            contributors=slot.bitmap.bit_count(), job=job, round=round_, clique=clique, slot=int(header["slot"]),
            chunk=chunk, group=entry.group, bitmap=slot.bitmap, token=entry.token,
            status=STATUS_OVERFLOW if slot.overflow else 0,
        )
        return bytes(frame[0])

    def _output(self, header: np.void, slot: Slot) -> bytes:
        """The completed slot's output; `header` is the frame that completed or asked for it and says where
        it goes: below the root (`hop1` set), a partial to `hop1`, its hops moved up one level; at the root,
        the result, multicast to the slot's group."""
        tree = tree_fields(header)
        if tree.hop1:
            self.counters["partials_emitted"] += 1
            route = dict(opcode=Opcode.PARTIAL, eth_dst=self.config.gateway_mac, ip_dst=tree.hop1,
                         expect=tree.hop1_expect, hop1=tree.hop2, hop1_expect=tree.hop2_expect)
        else:
            self.counters["results_emitted"] += 1
            route = dict(opcode=Opcode.RESULT, eth_dst=multicast_mac(slot.group), ip_dst=slot.group)
        assert slot.key is not None, "only a claimed slot has an output"
        job, round_, clique, chunk = slot.key
        frame = build_frames(
            slot.sums.astype(np.int32), eth_src=self.config.mac, ip_src=self.config.ip,
            udp_sport=self.config.port, udp_dport=self.config.port, version=int(header["version"]),
            sender=int(header["sender"]), fanin=slot.fanin, exponent=slot.exponent,
            contributors=slot.bitmap.bit_count(), job=job, round=round_, clique=clique,
            slot=int(header["slot"]), chunk=chunk, group=slot.group, bitmap=slot.bitmap,
            status=STATUS_OVERFLOW if slot.overflow else 0, **route,
        )
        return bytes(frame[0])

    def _stats_reply(self, header: np.void) -> bytes:
        """Counters as uint32 elements, sent back to the requester; they count every frame before it."""
        snapshot = np.array([self.counters[name] & 0xFFFFFFFF for name in COUNTERS], dtype=np.uint32)
        frame = build_frames(
            snapshot.view(np.int32),
            eth_dst=header["eth_src"], eth_src=self.config.mac,
            ip_src=self.config.ip, ip_dst=int(header["ip_src"]),
            udp_sport=self.config.port, udp_dport=int(header["udp_sport"]),
            opcode=Opcode.STATS_REPLY, version=int(header["version"]), sender=int(header["sender"]),
            job=int(header["job"]),
        )
        return bytes(frame[0])


def _key(header: np.void) -> tuple[int, int, int, int]:
    return (int(header["job"]), int(header["round"]), int(header["clique"]), int(header["chunk"]))


def _shape(header: np.void, route: CliqueRoute = FLAT) -> tuple[int, int, int, int, int]:
    return (int(header["fanin"]), int(header["group"]), int(header["count"]), int(header["exponent"]),
            tree_fields(header, route).level)


@dataclass(frozen=True)
class TreeFields:
    """A frame's place in a reduction tree, with the defaults resolved."""
    members: int
    """The members it holds: `bitmap`, or its sender alone when that is 0 or the frame is version 1."""
    level: int
    """The members the receiving aggregator gathers: `expect`, or the whole clique when that is 0."""
    hop1: int
    hop1_expect: int
    hop2: int
    hop2_expect: int


def tree_fields(header: np.void, route: CliqueRoute = FLAT) -> TreeFields:
    """The reduction-tree fields of a parsed header; a version 1 frame reads as if they were all 0. A version
    3 frame's level is its clique's `route` at the aggregator, and it names no hops."""
    fanin = int(header["fanin"])
    if int(header["version"]) == JOB_VERSION:
        return TreeFields(int(header["bitmap"]) or 1 << int(header["sender"]), route.resolved_level(fanin),
                          0, 0, 0, 0)
    if int(header["version"]) == 1:
        return TreeFields(1 << int(header["sender"]), clique_mask(fanin), 0, 0, 0, 0)
    bitmap, expect = int(header["bitmap"]), int(header["expect"])
    return TreeFields(bitmap or 1 << int(header["sender"]), expect or clique_mask(fanin),
                      int(header["hop1"]), int(header["hop1_expect"]), int(header["hop2"]), int(header["hop2_expect"]))
