"""One member of a clique: everything an island does to sum one vector through inwire, written once.

`inwire stream`'s islands and the torch integration (`inwire.train.averaging`: the model averager and the
DDP communication hook) are thin users of this module, as SwitchML's client library is of its core:

- `slot` and `SLOT_POOLS`: which aggregator slot chunk j of clique c in round r uses. Four pools: two
  alternate between rounds (the last round's results stay for late retransmissions, SwitchML's shadow copy)
  and, within a round, two alternate between windows: a member sends chunk j only once it holds chunk
  j - W's result, so chunk j + 2W claims a slot again only after every member holds its previous result.
  Any vector length works with 4 x cliques x W slots.
- `contributions`: the UDP payloads of one member's quantized vector, one per chunk, with its clique's
  fields and its place in a reduction tree (bitmap, level, hops).
- `MemberSum`: the member's side of one sum, without I/O: a bounded window of chunks in flight that
  refills as results arrive, timeouts and retransmission, every result read and checked (owner, chunk,
  count, header, status), the sums gathered in place. A driver feeds it time and datagrams and sends what
  it returns: the stream's asyncio islands do, over any transport; `UdpMember` does over a blocking socket.
  `CompiledMemberSum` (what `member_sum` makes where the kernel is built) reads results in the compiled
  kernel, a batch per call, over the same state: `MemberSum.on_result` stays the definition.
- `RollCall`: who of a stalled sum's clique is there, asked of the aggregator with one-member records and
  result requests, so that a sum that fails names the members whose contributions never arrived.
- `UdpMember`: one island's socket to its aggregators (one address, or one per city for reduction trees),
  bound to the local address that routes to them (never 127.0.0.1 unless the aggregator is there), its
  receive buffer sized for the window; `sum` runs one `MemberSum` to its end, `average` adds the codec's
  shared exponent and the overflow re-send at twice the bound (`inwire.codec_average`), `gather` collects every
  member's words exactly (what a clique agrees on before its first averaging, `agreement_round`). With the
  compiled kernel (`inwire._kernel`, as `inwire serve` and the stream's transport use it) datagrams are read
  with recvmmsg and sent with sendmmsg, a window's payloads as UDP GSO runs; the payloads are made as the
  window takes them (`Contributions`) and the average is decoded from the sums as they came off the wire.
"""

import select
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, cast

import numpy as np
import numpy.typing as npt

from .codec_average import ATTEMPTS, AVERAGING_ATTEMPTS, AveragingError, Pieces, decode, encode
from .datagram import HEADER as RESULT_HEADER
from .datagram import (
    MAX_DATAGRAM,
    PAYLOAD_HEADER_BYTES,
    PAYLOAD_OFFSET,
    Address,
    header_struct,
    ip_int,
    ip_str,
    payloads_of,
    set_receive_buffer,
    socket_drops,
)
from .errors import InwireError
from .jobs import Endpoint, JobEntry
from .kernel import compiled
from .packets import build_frames
from .plan.schedule_file import member_paths
from .protocol import (
    DEFAULT_SLOTS,
    ELEMENT_BYTES,
    ELEMENT_DTYPE,
    FIELDS_BY_NAME,
    FRAME_OFFSETS,
    JOB_VERSION,
    MAGIC,
    RESULT_TRAILER_BYTES,
    ROUTE_HOPS,
    STATUS_OVERFLOW,
    VERSION,
    Opcode,
)

SLOT_POOLS = 4
FAST_RETRANSMIT = 3
"""A chunk in flight counts as lost when the result of a chunk this many after it is in (adaptive timeouts)."""
PROBE_SRTTS = 2
"""A tail-loss probe goes out this many smoothed round trips after the last result (TCP's TLP, RFC 8985); a
chunk sent again because later results came back goes out once more this many round trips later."""
MIN_TIMEOUT_S = 0.02
"""The shortest adaptive retransmission timeout `UdpMember` uses: a loss is usually found sooner by the
results of later chunks; below this, a loaded host's scheduling delays read as losses (2 ms made a
three-island run on two busy cores send 5 % of its datagrams again for nothing)."""
DEFAULT_CHUNK = 256
DEFAULT_WINDOW = 4
DEFAULT_TIMEOUT_S = 0.2
DEFAULT_RETRIES = 25
GROUP_PREFIX = ip_int("239.73.0.0")
"""Clique c of schedule round p multicasts to 239.73.p.c."""
PRESENCE_CHUNK = 0xFFFFFFFF
"""The `chunk` of a roll call's records (`RollCall`): an offset no vector reaches, so no sum reads their results."""
ROLL_CALL_TIMEOUTS = 5
"""A sum that got no result for this many of its longest retransmission timeouts (`timeout_s`, the longest
round trip it allows for; or for a quarter of its deadline, if shorter) calls the roll."""
RESULT_MIN_BYTES = PAYLOAD_HEADER_BYTES + RESULT_TRAILER_BYTES
"""A result payload without elements: header and status trailer."""
KERNEL_BYTES_PER_DATAGRAM = 1280
"""What the kernel charges a socket's receive buffer per datagram beyond its payload (about 1.2 KiB)."""
RECEIVE_BATCH = 64
"""Datagrams `UdpMember` reads per recvmmsg (with the compiled kernel, `inwire._kernel`)."""
RECEIVE_SLOT = MAX_DATAGRAM + 1
"""Room for any datagram in the receive buffer, so that an oversized result is read whole and reported."""


class ClientError(InwireError):
    """A sum could not finish; the message says which chunk, of which clique, and what was tried. `missing`:
    the members (names where the caller gave them, else indices) whose contributions never arrived, as
    the roll call found them; empty when it found none or could not tell."""

    def __init__(self, message: str, missing: Sequence[str | int] = ()) -> None:
        super().__init__(message)
        self.missing = tuple(missing)


class RouteError(InwireError):
    """A clique's reduction tree cannot be carried by a frame; the message names the member and its path."""


def slots_needed(max_cliques: int, window: int) -> int:
    """Slots the schedule needs at an aggregator: every pool of every clique of a round, a window each."""
    return SLOT_POOLS * max_cliques * window


def slot(round_: int, clique: int, chunk: int, window: int, max_cliques: int) -> int:
    """The slot of chunk `chunk` of clique `clique` in round `round_` (see the module's docstring)."""
    pool = (round_ % 2) * 2 + (chunk // window) % 2
    return pool * max_cliques * window + clique * window + chunk % window


def agreement_round(round_index: int) -> int:
    """The protocol round where the clique of averaging round `round_index` agrees on what it averages, before
    its first sum (`UdpMember.gather`): the one just before that sum's, which no averaging takes (the last of
    round `round_index` - 1's stride, `codec_average.AVERAGING_ATTEMPTS`; before round 0 the last of all 32-bit
    rounds, past every round's stride), so that the averaging's first chunks are newer and take its slots
    (`agreement_key`: which slots)."""
    return (round_index * ATTEMPTS - 1) % 2**32


def averaging_round(protocol_round: int) -> int:
    """The averaging round whose attempt, or agreement (`agreement_round`), protocol round `protocol_round` is."""
    return (protocol_round + 1) % 2**32 // ATTEMPTS


def clique_group(period_round: int, clique: int) -> int:
    return GROUP_PREFIX | (period_round << 8) | clique


def clique_routes(members: Sequence[str], root: str, tree: Mapping[str, str] | None, address: Callable[[str], int],
                  where: str = "schedule") -> dict[str, tuple[str, dict[str, int]]]:
    """member -> (aggregator city it sends to, the tree fields of its contributions), for one clique whose
    schedule tree is `tree` ({city: up}, docs/schedule.md); `address(city)` is an aggregator's IPv4 address
    as an int. A member's path may climb at most three aggregators: a frame names two above its own."""
    paths = member_paths(members, root, tree)
    level: dict[str, int] = {}
    for index, member in enumerate(members):
        path = paths[member]
        if len(path) > 1 + ROUTE_HOPS:
            raise RouteError(f"{where}: {member}'s contribution climbs {len(path)} aggregators "
                              f"({' -> '.join(path)}); a frame names at most {1 + ROUTE_HOPS} levels")
        for city in path:
            level[city] = level.get(city, 0) | 1 << index
    level[root] = 0  # the whole clique
    routes = {}
    for index, member in enumerate(members):
        path = paths[member]
        fields = {"bitmap": 1 << index, "expect": level[path[0]]}
        for hop in range(1, 1 + ROUTE_HOPS):
            above = path[hop] if hop < len(path) else None
            fields[f"hop{hop}"] = 0 if above is None else address(above)
            fields[f"hop{hop}_expect"] = 0 if above is None else level[above]
        routes[member] = (path[0], fields)
    return routes


@dataclass(frozen=True)
class CliqueKey:
    """What every member of a clique agrees on for one sum."""
    job: int
    round: int
    clique: int
    group: int
    fanin: int
    exponent: int
    max_cliques: int = 1
    """Most cliques in a round of the schedule: the slot layout's stride."""
    token: int = 0
    """The registered job's token (`jobs.JobEntry.token`): nonzero makes the sum's frames version 3
    (`protocol.JOB_VERSION`), whose results count only with this token; 0: version 2, unregistered (the frame
    carries the route: trees through hop fields, the lab)."""
    layout_round: int | None = None
    """None: the sum's chunks take the slots of its own round (`slot`). An agreement's (`agreement_key`): the
    protocol round of the averaging it precedes, whose slots a window further along it takes."""

    @property
    def version(self) -> int:
        return JOB_VERSION if self.token else VERSION

    def slot(self, chunk: int, window: int) -> int:
        """The slot of the sum's chunk `chunk` with window `window`."""
        if self.layout_round is None:
            return slot(self.round, self.clique, chunk, window, self.max_cliques)
        return slot(self.layout_round, self.clique, chunk + window, window, self.max_cliques)


def agreement_key(key: CliqueKey) -> CliqueKey:
    """The key of the agreement (`UdpMember.gather`) before the sum of averaging round `key.round`, in
    protocol round `agreement_round(key.round)`. Its chunk j takes the slot of that averaging's chunk j + W
    (in its round's pool, its window's other half), never a slot of the round before: an island with no
    clique in a round goes on to the next round's agreement while the others still sum the round, and an
    agreement in the round before's pool took their slot as a newer round and stalled them. Chunk j + W is
    sent only by a member that holds chunk j's result, for which every member had finished the agreement,
    so the averaging takes no agreement result a member may still ask for (while the agreement has at most
    W chunks: the window's member words, W * chunk / LAYOUT_WORDS members)."""
    return replace(key, round=agreement_round(key.round), exponent=0, layout_round=key.round * ATTEMPTS % 2**32)


def contributions(quantized: npt.NDArray[np.integer] | Sequence[int], member: int, key: CliqueKey, chunk: int,
                  window: int, route: Mapping[str, int] | None = None) -> list[bytes]:
    """UDP payloads of member `member`'s int32 vector `quantized`, one per chunk of `chunk` elements, with the
    clique's fields `key` and, in a reduction tree, the member's `route` fields (bitmap, expect, hops)."""
    return list(Contributions(quantized, member, key, chunk, window, route))


class Contributions(Sequence[bytes]):
    """`contributions` as a sequence whose payloads are made when they are asked for (`UdpMember` sends
    them so): only the window's payloads exist at a time, and the allocator reuses their memory instead of
    taking fresh pages for a whole vector of them (a 100 MB vector: 25,000 page faults less).

    One header is built with the protocol's builder for each chunk length (a full chunk, the last one); the
    chunks' headers differ only in `chunk` and `slot`, patched at their table offsets, and the elements are
    converted to big-endian once for the whole vector: a 100 MB vector costs two passes, not ten. A vector
    already big-endian int32 (`codec_average.encode` makes it so for `UdpMember.average`) is used as it is,
    not copied."""

    def __init__(self, quantized: npt.NDArray[np.integer] | Sequence[int], member: int, key: CliqueKey,
                 chunk: int, window: int, route: Mapping[str, int] | None = None) -> None:
        if not (isinstance(quantized, np.ndarray) and quantized.dtype == ELEMENT_DTYPE):
            quantized = np.asarray(quantized, dtype=np.int32).astype(ELEMENT_DTYPE)
        self.elements, self.chunk, self.window, self.key = len(quantized), chunk, window, key
        self.chunks = -(-self.elements // chunk)
        if key.token and route:
            raise ValueError("a registered job's frames carry no route: its aggregators' tables hold it")
        self.common = dict(opcode=Opcode.CONTRIBUTION, sender=member, fanin=key.fanin, exponent=key.exponent,
                           job=key.job, round=key.round, clique=key.clique, group=key.group, version=key.version,
                           token=key.token, **(route or {}))
        self.wire = np.ascontiguousarray(quantized).data.cast("B")
        self.templates: dict[int, bytes] = {}

    def __len__(self) -> int:
        return self.chunks

    # Chunks are asked for one at a time: no slices (Sequence's other overload).
    def __getitem__(self, index: int) -> bytes:  # type: ignore[override]
        if not 0 <= index < self.chunks:
            raise IndexError(f"chunk {index} of {self.chunks}")
        first = index * self.chunk
        count = min(self.chunk, self.elements - first)
        key = self.key
        header = bytearray(self.template(count))
        _CHUNK_FIELD.pack_into(header, _CHUNK_AT, first)
        _SLOT_FIELD.pack_into(header, _SLOT_AT, key.slot(index, self.window))
        return b"".join((header, self.wire[ELEMENT_BYTES * first:ELEMENT_BYTES * (first + count)]))

    def template(self, count: int) -> bytes:
        """The header of a chunk of `count` elements, its `chunk` and `slot` 0."""
        template = self.templates.get(count)
        if template is None:
            frame = build_frames(np.zeros((1, count), dtype=np.int32), chunk=0, slot=0, **self.common)
            template = self.templates[count] = payloads_of(frame)[0][:PAYLOAD_HEADER_BYTES]
        return template


_CHUNK_AT, _SLOT_AT, _OPCODE_AT, _TOKEN_AT = (FRAME_OFFSETS[name] - PAYLOAD_OFFSET
                                              for name in ("chunk", "slot", "opcode", "token"))
_CHUNK_FIELD, _SLOT_FIELD, _TOKEN_FIELD = (header_struct(name, name) for name in ("chunk", "slot", "token"))


def _ours(payload: bytes | memoryview, version: int, want_version: int, token: int) -> bool:
    """Whether a result (its header whole) of `version` is of the sum's version, and with a registered job's
    `token` (nonzero) carries it."""
    return version == want_version and (not token or _TOKEN_FIELD.unpack_from(payload, _TOKEN_AT)[0] == token)


def job_slots(max_cliques: int, window: int, max_fanin: int) -> int:
    """The quota a registered job needs: the schedule's slots and a roll-call record per member per clique."""
    return slots_needed(max_cliques, window) + max_fanin * max_cliques


def presence_slot(member: int, key: CliqueKey, window: int) -> int:
    """The slot of member `member`'s roll-call record for clique `key.clique`: past every slot of the
    schedule's layout (`slots_needed`), one per member per clique of a round."""
    return slots_needed(key.max_cliques, window) + member * key.max_cliques + key.clique


@dataclass(frozen=True)
class Nearby:
    """Where members of this sum's clique sit in another averaging round `round` (protocol round
    `protocol_round`), should they be at that round instead: clique `clique` there, `positions` {member
    index here: its index there}. A roll call asks for their records there too, so that islands resumed from
    checkpoints of different rounds are told so instead of blaming each other as missing."""
    round: int
    protocol_round: int
    clique: int
    positions: Mapping[int, int]


def _presence_payloads(key: CliqueKey, round_: int, clique: int, slots: Sequence[int]) -> list[bytes]:
    """One-member, one-element roll-call records of clique `clique` at protocol round `round_`, in `slots`."""
    frames = build_frames(np.ones((len(slots), 1), dtype=np.int32), opcode=Opcode.CONTRIBUTION, sender=0, fanin=1,
                          exponent=0, job=key.job, round=round_, clique=clique, group=key.group,
                          slot=np.array(slots), chunk=PRESENCE_CHUNK, version=key.version, token=key.token)
    return payloads_of(frames)


def _request(record: bytes) -> bytes:
    """The result request of a record: its header (a request carries no elements), opcode changed."""
    request = bytearray(record[:PAYLOAD_HEADER_BYTES])
    request[_OPCODE_AT] = Opcode.RESULT_REQUEST
    return bytes(request)


class RollCall:
    """Which members of a stalled sum's clique are there, asked of the aggregator in the protocol's terms.

    The aggregator does not tell who has contributed to an unfinished slot, so each member records its
    presence as a one-member sum of its own (fan-in 1, `chunk` PRESENCE_CHUNK) in its `presence_slot`, and
    asks for the others' records with result requests: the aggregator answers a request only for a record it
    holds, and stays silent otherwise. `datagrams()` is one call: this member's record until the aggregator
    has answered it, and one request per member not heard of yet (and one per `nearby` place it may sit in
    instead); the aggregator answers each with at most one result, so nothing is amplified. `read(payload)`
    notes the members whose records a result shows: `seen`, and in `elsewhere` {member: averaging round}
    those found at a `nearby` round. Its slots lie beyond the schedule's: an aggregator with no more slots
    than `slots_needed` answers none (then `seen` stays without this member, and nothing can be told).

    In a registered tree (`tree`: (the records' clique, `here`), from `UdpMember._tree_place`) each
    aggregator's route of the clique gathers a level, which a one-member record is not, so the records name a
    clique no route names (each aggregator keeps them as sums of their own), and the roll call asks only for
    the members that send to this member's aggregator (`here`, a bitmap): the others' records are kept at
    theirs."""

    def __init__(self, key: CliqueKey, member: int, window: int, nearby: Sequence[Nearby] = (),
                 tree: tuple[int, int] | None = None) -> None:
        self.member, self.fanin, self.max_cliques = member, key.fanin, key.max_cliques
        record_clique, self.here = tree if tree is not None else (key.clique, (1 << key.fanin) - 1)
        self.owner = (key.job, key.round, record_clique)
        self.first = presence_slot(0, key, window)
        self.records = _presence_payloads(key, key.round, record_clique,
                                          [presence_slot(m, key, window) for m in range(key.fanin)])
        self.requests = [_request(record) for record in self.records]
        self.seen: set[int] = set()
        self.elsewhere: dict[int, int] = {}
        self.places: dict[tuple[int, int, int, int], tuple[int, int]] = {}
        """(job, protocol round, clique, slot) of a nearby record -> (member here, averaging round)."""
        self.nearby_requests: dict[int, list[bytes]] = {}
        for place in nearby:
            there = CliqueKey(key.job, place.protocol_round, place.clique, key.group, key.fanin, 0, key.max_cliques,
                              key.token)
            members = [m for m in place.positions if m != member and 0 <= m < key.fanin]
            slots = [presence_slot(place.positions[m], there, window) for m in members]
            clique = place.clique if tree is None else record_clique
            for m, slot_, record in zip(members, slots, _presence_payloads(key, place.protocol_round, clique, slots)):
                self.places[(key.job, place.protocol_round, clique, slot_)] = (m, place.round)
                self.nearby_requests.setdefault(m, []).append(_request(record))
        self.calls = 0
        self.version, self.token = key.version, key.token

    def datagrams(self) -> list[bytes]:
        self.calls += 1
        sends = [] if self.member in self.seen else [self.records[self.member]]
        unheard = [m for m in range(self.fanin) if m != self.member and m not in self.seen and self.here >> m & 1]
        return (sends + [self.requests[m] for m in unheard]
                + [request for m in unheard if m not in self.elsewhere for request in self.nearby_requests.get(m, ())])

    def read(self, payload: bytes | memoryview) -> None:
        if len(payload) < RESULT_MIN_BYTES:
            return
        fields = RESULT_HEADER.unpack_from(payload)
        opcode = fields[2]
        job, round_, clique, slot_, offset = fields[7:12]
        if opcode != Opcode.RESULT or offset != PRESENCE_CHUNK or not _ours(payload, fields[1], self.version,
                                                                             self.token):
            return
        if (job, round_, clique) != self.owner:
            found = self.places.get((job, round_, clique, slot_))
            if found is not None:
                self.elsewhere[found[0]] = found[1]
            return
        member, rest = divmod(slot_ - self.first, self.max_cliques)
        if rest == 0 and 0 <= member < self.fanin:
            self.seen.add(member)


def _state() -> Any:
    """A field of MemberSum's running state: set by `__post_init__`, not an argument, not compared."""
    return field(init=False, repr=False, compare=False)


@dataclass(slots=True)
class MemberSum:
    """One member's side of one clique sum, without I/O.

    `start(now)` returns the first window of payloads to send; `on_result(payload, now)` takes any datagram
    (ignoring what is not a result of this sum) and returns the payloads the window frees; `due(now)` returns
    the retransmissions due by `now`, and sets `failed_chunk` once a chunk has run out of retries. `done`
    when every chunk's result is in: `received` holds the sums as big-endian int32 bytes, `overflow` whether
    any result saturated (`overflowed_chunks`: which), `wrong_chunks` those whose result did not say what
    the clique expects (members, count, exponent, fan-in). Times are in seconds on any monotonic clock.

    Retransmission: with `min_timeout_s` None, every chunk's timeout is `timeout_s`. With `min_timeout_s`
    set, the timeout adapts to the round trips measured (RFC 6298's smoothed estimate, from chunks sent once
    only, Karn's rule), between `min_timeout_s` and `timeout_s`; a chunk retransmitted again waits twice as
    long each time (up to `timeout_s`); and any chunk in flight is sent again at once (once) when the result
    of a chunk FAST_RETRANSMIT or more after it has come back, since results of one member come back in the
    order its chunks went out unless one was lost (SACK's duplicate threshold, RFC 6675: every gap below
    the highest result, not only the oldest, or a window with several losses waits out its first, long
    timeout for all but one). Such a chunk is due again PROBE_SRTTS smoothed round trips later rather than
    a floored timeout later, and its later waits double from there (`_recovery_wait`): the window waits
    behind it, so no later result reveals that its retransmission, or the result, was lost too. No later
    result reveals a loss among the last chunks in flight (the tail), so when results stop with chunks
    outstanding, the newest of them is sent again
    PROBE_SRTTS smoothed round trips (or smoothed intervals between results, if longer: results of a queue
    that drains slowly have not stopped) after the last result, if that is sooner than the next timeout (a
    tail-loss probe, as TCP's TLP): its result, or the gap it leaves, shows what was lost. One probe per
    stall: the next one waits for a new result, so probes never outnumber results. `retries` None: no
    limit (the driver's deadline rules)."""
    payloads: Sequence[bytes]
    key: CliqueKey
    elements: int
    chunk: int = DEFAULT_CHUNK
    window: int = DEFAULT_WINDOW
    timeout_s: float = DEFAULT_TIMEOUT_S
    retries: int | None = DEFAULT_RETRIES
    min_timeout_s: float | None = None
    retransmits: int = 0
    checked: int = 0
    results_refused: int = 0
    """Results a registered job's sum (`key.token` set) refused: another version, or another token."""
    failed_chunk: int | None = None
    wrong_chunks: set[int] = field(default_factory=set)
    overflowed_chunks: set[int] = field(default_factory=set)
    received: bytearray | memoryview | None = None
    """Where the sums go: a writable buffer of 4 x `elements` bytes; None: a new bytearray."""
    # The running state, declared: each is a slot, and `CompiledMemberSum`'s lane reads and writes those it
    # needs at their slots' offsets (`compiled.member_state` below finds them by name when this module loads).
    done_chunks: bytearray = _state()
    remaining: int = _state()
    deadline: dict[int, float] = _state()
    tries: dict[int, int] = _state()
    next: int = _state()
    sent_at: dict[int, float] = _state()
    backoff: dict[int, float] = _state()
    fast_resent: set[int] = _state()
    srtt: float | None = _state()
    rttvar: float | None = _state()
    rto: float = _state()
    progress_at: float = _state()
    probed: bool = _state()
    result_at: float | None = _state()
    interval: float | None = _state()
    expected_header: tuple[int, int, int, int] = _state()
    owner: tuple[int, int, int] = _state()

    def __post_init__(self) -> None:
        if self.received is None:
            self.received = bytearray(ELEMENT_BYTES * self.elements)
        elif len(self.received) != ELEMENT_BYTES * self.elements:
            raise ValueError(f"received holds {len(self.received)} bytes, the sums {ELEMENT_BYTES * self.elements}")
        self.done_chunks = bytearray(len(self.payloads))
        self.remaining = len(self.payloads)
        self.deadline, self.tries, self.next = {}, {}, 0
        self.sent_at, self.backoff, self.fast_resent = {}, {}, set()
        self.srtt = self.rttvar = None
        self.rto = self.timeout_s
        self.progress_at = 0.0
        """When the last new result came back (or the sum started)."""
        self.probed = False
        """Whether the tail-loss probe of the current stall went out (cleared by a new result)."""
        self.result_at = self.interval = None
        """When the last result came back; the smoothed interval between results (read at different times)."""
        fanin = self.key.fanin
        self.expected_header = (self.key.exponent, fanin, (1 << fanin) - 1, fanin)
        self.owner = (self.key.job, self.key.round, self.key.clique)

    @property
    def done(self) -> bool:
        return self.remaining == 0

    @property
    def overflow(self) -> bool:
        return bool(self.overflowed_chunks)

    def sums(self) -> npt.NDArray[np.int32]:
        """The sums as int32 (valid once `done`)."""
        assert self.received is not None  # `__post_init__` made it
        return np.frombuffer(self.received, dtype=ELEMENT_DTYPE)

    def start(self, now: float) -> list[bytes]:
        self.progress_at = now
        return self._refill(now)

    def _refill(self, now: float) -> list[bytes]:
        window, payloads, done = self.window, self.payloads, self.done_chunks
        chunk, end = self.next, len(payloads)
        sends: list[bytes] = []
        if chunk < end and (chunk < window or done[chunk - window]):
            deadline = now + self.rto
            adaptive = self.min_timeout_s is not None
            while chunk < end and (chunk < window or done[chunk - window]):
                self.tries[chunk] = 0
                self.deadline[chunk] = deadline
                if adaptive:
                    self.sent_at[chunk] = now
                sends.append(payloads[chunk])
                chunk += 1
            self.next = chunk
        return sends

    def next_deadline(self) -> float | None:
        timeout = self._timeout_at()
        probe = self._probe_at()
        # A probe is due only with chunks in flight, which have a timeout too.
        return probe if probe is not None and (timeout is None or probe < timeout) else timeout

    def _timeout_at(self) -> float | None:
        """When the next retransmission timeout falls due; None with nothing in flight."""
        soonest = min(self.deadline.values(), default=None)
        if self.sent_at:
            # As TCP's retransmission timer: the oldest chunk sent once is due one current timeout after the
            # last result came back, however long the timeout was when it went out. A loss among the last
            # chunks of a large window is found a round trip after the results stop, not after the first,
            # unmeasured timeout; chunks queued behind others are not timed while results still flow.
            early = self.progress_at + self.rto
            soonest = early if soonest is None else min(soonest, early)
        return soonest

    def _probe_at(self) -> float | None:
        """When the tail-loss probe of the current stall is due; None when there is none to send."""
        if (self.probed or self.srtt is None or self.interval is None or self.min_timeout_s is None
                or not self.deadline):
            return None
        return self.progress_at + max(PROBE_SRTTS * max(self.srtt, self.interval), self.min_timeout_s)

    def due(self, now: float) -> list[bytes]:
        sends: list[bytes] = []
        timeout, probe = self._timeout_at(), self._probe_at()
        if probe is not None and probe <= now and (timeout is None or now < timeout):
            newest = next(reversed(self.deadline))
            if self.retries is None or self.tries[newest] < self.retries:
                self.tries[newest] += 1
                self.retransmits += 1
                self.sent_at.pop(newest, None)  # Karn: no round trip is measured from a chunk sent twice
                self.deadline[newest] = now + self.rto  # the probe's own timeout, as TCP re-arms its timer
                sends.append(self.payloads[newest])
        if self.sent_at and self.progress_at + self.rto <= now:
            oldest = next(iter(self.sent_at))  # sent_at keeps send order
            self.deadline[oldest] = min(self.deadline[oldest], self.progress_at + self.rto)
            self.progress_at = now  # one such retransmission per timeout while nothing comes back
        for chunk, deadline in list(self.deadline.items()):
            if now < deadline:
                continue
            if self.retries is not None and self.tries[chunk] >= self.retries:
                self.failed_chunk = chunk
                return sends
            self.tries[chunk] += 1
            self.retransmits += 1
            if self.min_timeout_s is None:
                wait = self.timeout_s
            else:
                wait = self.backoff[chunk] = min(2 * self.backoff.get(chunk, self.rto), self.timeout_s)
                self.sent_at.pop(chunk, None)  # Karn: no round trip is measured from a retransmitted chunk
            self.deadline[chunk] = now + wait
            sends.append(self.payloads[chunk])
        if sends:
            self.probed = True  # a probe or a timeout's retransmission: the stall's one probe is spent
        return sends

    def _measured(self, chunk: int, now: float) -> list[bytes]:
        """Fold a chunk's round trip into the timeout; the chunks in flight that look lost, each once."""
        sent = self.sent_at.pop(chunk, None)
        # Round trips are measured only with an adaptive timeout (`min_timeout_s` set).
        if sent is not None and self.min_timeout_s is not None:
            sample = now - sent
            if self.srtt is None or self.rttvar is None:
                self.srtt, self.rttvar = sample, sample / 2
            else:
                self.rttvar = 0.75 * self.rttvar + 0.25 * abs(self.srtt - sample)
                self.srtt = 0.875 * self.srtt + 0.125 * sample
            self.rto = min(max(self.srtt + 4 * self.rttvar, self.min_timeout_s), self.timeout_s)
        self.backoff.pop(chunk, None)
        lost: list[int] = []
        wait = self._recovery_wait()
        for earlier in self.deadline:  # chunks enter the dict in ascending order and keep their place
            if chunk - earlier < FAST_RETRANSMIT:
                break
            if earlier not in self.fast_resent:
                lost.append(earlier)
        for earlier in lost:
            self.fast_resent.add(earlier)
            self.tries[earlier] += 1
            self.retransmits += 1
            self.sent_at.pop(earlier, None)
            self.deadline[earlier] = now + wait
            self.backoff[earlier] = wait
        return [self.payloads[earlier] for earlier in lost]

    def _recovery_wait(self) -> float:
        """How long a chunk sent again on the evidence of later results waits before it goes out once more:
        PROBE_SRTTS smoothed round trips (or intervals between results, if longer), at most the timeout. The
        window is blocked behind it, so no later result can reveal that it was lost again, and the timeout's
        floor (`min_timeout_s`, tens of round trips on a fast path) stalled every member that long. Each
        later re-send waits twice as long as the one before (`due`), from this wait up to `timeout_s`: a
        result lost on the way back as well is not waited for at the floor either, and a member whose chunk
        waits for another member's re-send sends a few duplicates at most (log2 of the floor over this
        wait) before its waits pass the timeout."""
        if self.srtt is None:
            return self.rto
        return min(self.rto, PROBE_SRTTS * max(self.srtt, self.interval or 0.0))

    def on_result(self, payload: bytes | memoryview, now: float) -> Sequence[bytes]:
        """A datagram (bytes, or a view valid only during the call); the payloads it lets out."""
        if len(payload) < RESULT_MIN_BYTES:
            return ()
        (magic, version, opcode, _, fanin, exponent, contributors, job, round_, clique, _, offset, count, _, _,
         bitmap) = RESULT_HEADER.unpack_from(payload)
        if magic != MAGIC or opcode != Opcode.RESULT:
            return ()
        if not _ours(payload, version, self.key.version, self.key.token):
            # A registered job's member counts what it refuses: its aggregator sends it none of these.
            self.results_refused += self.key.token != 0
            return ()
        if len(payload) != RESULT_MIN_BYTES + ELEMENT_BYTES * count:
            return ()
        if (job, round_, clique) != self.owner:
            return ()
        chunk, partial = divmod(offset, self.chunk)
        if partial or chunk not in self.deadline:
            return ()
        want = min(self.chunk, self.elements - offset)
        self.checked += 1
        if int.from_bytes(payload[-RESULT_TRAILER_BYTES:], "big") & STATUS_OVERFLOW:
            self.overflowed_chunks.add(chunk)
        if count != want or (exponent, fanin, bitmap, contributors) != self.expected_header:
            self.wrong_chunks.add(chunk)
        got = min(count, want)
        start = ELEMENT_BYTES * offset
        assert self.received is not None  # `__post_init__` made it
        self.received[start:start + ELEMENT_BYTES * got] = payload[PAYLOAD_HEADER_BYTES:
                                                                   PAYLOAD_HEADER_BYTES + ELEMENT_BYTES * got]
        del self.deadline[chunk]
        self.done_chunks[chunk] = 1
        self.remaining -= 1
        self.progress_at = now
        if self.min_timeout_s is None:
            return self._refill(now)
        self.probed = False
        if self.result_at is not None and now > self.result_at:
            interval = now - self.result_at
            self.interval = interval if self.interval is None else 0.875 * self.interval + 0.125 * interval
        self.result_at = now
        return (*self._measured(chunk, now), *self._refill(now))

    def on_results(self, buffer: bytes | bytearray | memoryview, sizes: Sequence[int], slot_size: int,
                   now: float) -> list[bytes]:
        """`on_result` of each datagram of `sizes`, the i-th at buffer[i * slot_size:] (as `_receive` reads
        them); the payloads they let out, in order."""
        view, sends = memoryview(buffer), list[bytes]()
        for index, size in enumerate(sizes):
            sends += self.on_result(view[index * slot_size:index * slot_size + size], now)
        return sends


_LANE_FIELDS = ("magic", "version", "opcode", "fanin", "exponent", "contributors", "job", "round", "clique", "chunk",
                "count", "bitmap", "token")
"""The result fields the compiled lane reads, in the order of its `enum LaneField` (inwire/_client.c)."""


def _field_at(name: str) -> tuple[int, int]:
    """(offset in the payload, bytes) of an aggregation header field."""
    return FRAME_OFFSETS[name] - PAYLOAD_OFFSET, FIELDS_BY_NAME[name].nbytes


def _field_contents(name: str, value: int) -> int | None:
    """`value` as the unsigned contents of field `name`; None when the field cannot hold it."""
    bits = FIELDS_BY_NAME[name].bits
    low = -(1 << (bits - 1)) if FIELDS_BY_NAME[name].signed else 0
    return value & ((1 << bits) - 1) if low <= value < low + (1 << bits) else None


if compiled is not None:
    compiled.member_state(MemberSum)


class CompiledMemberSum(MemberSum):
    """`MemberSum` whose results are read by the compiled kernel (`inwire._kernel.member_result`, _client.c):
    the same steps as `MemberSum.on_result`, which stays the definition, over the same state (the instance's
    slots, dicts and sets), so that `start`, `due` and `next_deadline` run unchanged in Python between
    results. A full chunk's payload is made in the kernel too when `payloads` is a `Contributions` of this
    sum. tests/test_member_lane.py drives both with the same result streams and compares every payload and
    every piece of state. A sum the kernel cannot take (no kernel; a key or vector no header field can hold,
    which no result could match) reads its results in Python."""

    __slots__ = ("lane",)

    def __post_init__(self) -> None:
        super().__post_init__()
        self.lane = self._lane()

    def _lane(self) -> Any:
        key, payloads = self.key, self.payloads
        if compiled is None or len(payloads) != -(-self.elements // self.chunk):
            return None
        wanted = dict(magic=MAGIC, version=key.version, opcode=Opcode.RESULT, fanin=key.fanin, exponent=key.exponent,
                      contributors=key.fanin, job=key.job, round=key.round, clique=key.clique,
                      bitmap=(1 << key.fanin) - 1)
        if key.token:  # compared, and a result without it counted as refused (`on_result`)
            wanted["token"] = key.token
        expected = tuple(_field_contents(name, wanted[name]) if name in wanted else None for name in _LANE_FIELDS)
        if any(expected[_LANE_FIELDS.index(name)] is None for name in wanted):
            return None
        build = None
        if (isinstance(payloads, Contributions) and (payloads.elements, payloads.chunk) == (self.elements, self.chunk)
                and _field_contents("chunk", max(self.elements - 1, 0)) is not None):
            slots = tuple(payloads.key.slot(index, payloads.window) for index in range(2 * payloads.window))
            if all(_field_contents("slot", value) is not None for value in slots):
                build = (payloads.template(self.chunk), payloads.wire, _field_at("chunk"), _field_at("slot"), slots)
        return compiled.member_lane(
            tuple(_field_at(name) for name in _LANE_FIELDS), expected,
            (PAYLOAD_HEADER_BYTES, RESULT_TRAILER_BYTES, ELEMENT_BYTES, STATUS_OVERFLOW, self.chunk, self.elements,
             self.window, FAST_RETRANSMIT, PROBE_SRTTS), (self.timeout_s, self.min_timeout_s), self.received,
            self.done_chunks, payloads, build)

    def on_result(self, payload: bytes | memoryview, now: float) -> Sequence[bytes]:
        if self.lane is None:
            return super().on_result(payload, now)
        return compiled.member_result(self.lane, self, payload, now)

    def on_results(self, buffer: bytes | bytearray | memoryview, sizes: Sequence[int], slot_size: int,
                   now: float) -> list[bytes]:
        if self.lane is None:
            return super().on_results(buffer, sizes, slot_size, now)
        return compiled.member_results(self.lane, self, buffer, list(sizes), slot_size, now)


def member_sum(*args: Any, **kwargs: Any) -> MemberSum:
    """A `MemberSum(*args, **kwargs)`, its results read by the compiled kernel where it is built."""
    return (MemberSum if compiled is None else CompiledMemberSum)(*args, **kwargs)


def _receive(sock: socket.socket, buffer: bytearray, slot: int, source: Endpoint | None) -> tuple[list[int], int]:
    """Sizes of the datagrams waiting at `sock`, read without blocking into `buffer`, the i-th at i * slot:
    with the compiled kernel up to RECEIVE_BATCH with one recvmmsg, else one; [] when none is waiting. With a
    `source` (IPv4 address as an int, port), a datagram from any other peer gets size 0 and is counted: (sizes,
    refused)."""
    if compiled is not None:
        if source is None:
            return compiled.recv_batch(sock.fileno(), buffer, slot, False), 0
        return compiled.recv_batch(sock.fileno(), buffer, slot, source)
    try:
        size, (host, port) = sock.recvfrom_into(buffer, slot, socket.MSG_DONTWAIT)
    except BlockingIOError:
        return [], 0
    if source is None or (ip_int(host), port) == source:
        return [size], 0
    return [0], 1


def local_address_towards(address: Address) -> str:
    """The local IPv4 address the kernel sends from to reach `address` (host, port): a connected UDP
    socket's own address (no datagram is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect(tuple(address))
        return str(probe.getsockname()[0])


def _round(key: CliqueKey, averaging: bool) -> str:
    """The round a message names: the averaging's own (as the averager counts them) for an attempt of an
    averaging, with the attempt when it is a re-send at a raised bound, or for its agreement; else the key's."""
    if not averaging:
        return f"round {key.round}"
    round_index = averaging_round(key.round)
    if key.round == agreement_round(round_index):
        return f"round {round_index} (agreement on what is averaged)"
    attempt = key.round - round_index * ATTEMPTS
    return f"round {round_index}" + (f" (attempt {attempt + 1} of {AVERAGING_ATTEMPTS})" if attempt else "")


class UdpMember:
    """One island's link to inwire over a blocking UDP socket.

    `aggregators` is one aggregator's (host, port), or a dict city -> (host, port) (every city on one port,
    as reduction trees need, `inwire stream --target udp:FILE`); `route(city)` picks the member's. The socket
    binds `bind` if given, else the local address that routes to the (first) aggregator, port 0; with
    `multicast`, results are received on the group's port (joined per sum), else the aggregator sends each
    member its copy (`inwire serve --unicast`). Its receive buffer holds the window's results of every clique
    it takes part in. Timeouts adapt to the measured round trip (`MemberSum`, from MIN_TIMEOUT_S up to
    `timeout_s`); members of a clique may arrive far apart (islands that compute at different speeds), so
    only `deadline_s` ends a sum, unless `retries` bounds each chunk's retransmissions too. A sum that got
    no result for ROLL_CALL_TIMEOUTS x `timeout_s` (or a quarter of `deadline_s`) calls the roll at the
    clique's root aggregator (`RollCall`) every `timeout_s` until it ends, so that its failure names the
    missing members. `loss` drops that fraction of outgoing datagrams on purpose (seeded by `seed`), for
    measurements and tests.

    `entry` (or `join(entry)` later): the registered job (`jobs.JobEntry`, as `control.new_job` makes it) this
    member belongs to; every sum then carries its id, token and group in version 3 frames without a route,
    and takes a result only from the aggregator (host, port) it sent to and with the job's token; anything
    else is ignored and counted (`results_refused`). Without one (or a key without a token) the sums are version 2, for
    unregistered aggregators (trees through hop fields, the lab)."""

    def __init__(self, aggregators: Address | Mapping[str, Address], job: int = 1, chunk: int = DEFAULT_CHUNK,
                 window: int = DEFAULT_WINDOW, timeout_s: float = DEFAULT_TIMEOUT_S, retries: int | None = None,
                 deadline_s: float = 30.0, bind: Address | None = None, multicast: bool = False, loss: float = 0.0,
                 seed: int = 0, entry: JobEntry | None = None) -> None:
        if not (chunk >= 1 and window >= 1 and timeout_s > 0 and deadline_s > 0) or (retries is not None
                                                                                    and retries < 1):
            raise ValueError("chunk, window, timeout_s, retries and deadline_s must be positive")
        if not 0 <= loss < 1:
            raise ValueError(f"loss must lie in [0, 1), got {loss}")
        self.loss, self.loss_rng = loss, np.random.default_rng([seed, 0x1055])
        self.loss_gap = self._next_loss_gap()
        """Datagrams the loss injection lets through before it drops the next one."""
        self.aggregators: dict[str | None, Address] = (dict(aggregators) if isinstance(aggregators, dict)
                                                        else {None: cast(Address, tuple(aggregators))})
        self.entry = entry
        self.job = job if entry is None else entry.job
        self.chunk, self.window = chunk, window
        self.results_refused = 0
        """Datagrams this member refused as results of a registered job's sums: from another address than the
        aggregator's it sent to, or (counted by the sums) without the job's version and token."""
        self.timeout_s, self.retries, self.deadline_s = timeout_s, retries, deadline_s
        first = next(iter(self.aggregators.values()))
        self.socket = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            self.socket.bind(tuple(bind) if bind else (local_address_towards(first), 0))
        except OSError as error:
            self.socket.close()
            raise ClientError(f"cannot bind an island socket towards {first[0]}:{first[1]}: {error.strerror}") \
                from None
        set_receive_buffer(self.socket, max(1 << 18, 4 * window * (RESULT_MIN_BYTES + ELEMENT_BYTES * chunk
                                                                    + KERNEL_BYTES_PER_DATAGRAM)))
        self.multicast = multicast
        self.listener: socket.socket | None = None
        if multicast:
            self.listener = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self.listener.bind(("0.0.0.0", first[1]))
        self.retransmits = 0
        self.buffer = bytearray(RECEIVE_SLOT * (1 if compiled is None else RECEIVE_BATCH))
        self.view = memoryview(self.buffer)

    @property
    def address(self) -> Address:
        return self.socket.getsockname()

    def join(self, entry: JobEntry) -> None:
        """Become a member of registered job `entry` (see the class): its tables must name this member's
        socket, whose address is known once the member is made (`address`)."""
        if (ip_int(self.address[0]), self.address[1]) not in entry.members:
            raise ClientError(f"job {entry.job} does not name this member's socket {self.address[0]}:"
                              f"{self.address[1]} among its members, so the aggregator would drop its frames")
        self.entry, self.job = entry, entry.job

    def close(self) -> None:
        self.socket.close()
        if self.listener is not None:
            self.listener.close()

    def kernel_drops(self) -> int | None:
        """Datagrams the kernel dropped at this island's socket (receive buffer full), where the OS says."""
        return socket_drops(self.socket)

    def sum(self, key: CliqueKey, member: int, quantized: npt.NDArray[np.integer] | Sequence[int],
            city: str | None = None, route: Mapping[str, int] | None = None,
            members: Sequence[str] | None = None) -> tuple[npt.NDArray[np.int32], bool]:
        """The clique's int32 sums of every member's `quantized` vector, and the overflow flag: this member is
        number `member`, sending to the aggregator of `city` with tree fields `route`. `members` (names, for
        messages) says who the others are."""
        run = self._run(key, member, quantized, city, route, members)
        return run.sums().astype(np.int32), run.overflow

    def _run(self, key: CliqueKey, member: int, quantized: npt.NDArray[np.integer] | Sequence[int], city: str | None,
             route: Mapping[str, int] | None, members: Sequence[str] | None, in_place: bool = False,
             nearby: Sequence[Nearby] = (), averaging: bool = False) -> MemberSum:
        """`sum`'s work: the finished `MemberSum`, its sums still big-endian as they came. `in_place`: the sums
        overwrite `quantized` (big-endian int32), chunk by chunk as their results come: a chunk whose result
        is in is never sent again, and one buffer the size of the vector is faulted in, not two. `averaging`:
        `key.round` is an attempt of an averaging (`average`) or its agreement (`gather`), and messages name the
        averaging's round."""
        return self._run_many([(key, quantized)], member, city, route, members, in_place, nearby, averaging)[0]

    def _run_many(self, sums: Sequence[tuple[CliqueKey, npt.NDArray[np.integer] | Sequence[int]]], member: int,
                  city: str | None, route: Mapping[str, int] | None, members: Sequence[str] | None,
                  in_place: bool = False, nearby: Sequence[Nearby] = (), averaging: bool = False,
                  then: "Callable[[int, MemberSum], tuple[CliqueKey, npt.NDArray[np.integer]] | None] | None" = None
                  ) -> list[MemberSum]:
        """`_run` of several sums of one clique's members at once, each (key, quantized) with its own key (slots
        of their own: another round or clique), all in flight together on this member's socket: every result
        goes to every sum, and each takes only its own (`MemberSum.on_result`). `then(i, run)`, called as sum i
        finishes, may give the next sum in its place (an averaging's re-send), which starts at once: no sum
        waits for another's. Each sum's deadline counts from its own start; the first sum that stalls calls the
        roll, the first that fails raises. The last `MemberSum` of each, in order."""
        host, port = self.aggregators.get(city) or next(iter(self.aggregators.values()))
        destination = (host, port) if compiled is None else (socket.gethostbyname(host), port)
        sockets = [self.socket] if self.listener is None else [self.socket, self.listener]
        memberships: list[bytes] = []
        buffer, view, slot = self.buffer, self.view, RECEIVE_SLOT
        send = self._sender(destination)
        runs: list[MemberSum] = []
        began: list[float] = []

        def start(index: int, key: CliqueKey, quantized: npt.NDArray[np.integer] | Sequence[int]) -> None:
            if self.entry is not None:
                key = replace(key, job=self.entry.job, token=self.entry.token, group=self.entry.group)
            payloads = Contributions(quantized, member, key, self.chunk, self.window, route)
            # The sums in numpy's memory, which takes huge pages for large arrays: a bytearray of 100 MB costs
            # 25,000 page faults as it fills.
            received = payloads.wire if in_place else np.empty(ELEMENT_BYTES * len(quantized), dtype=np.uint8).data
            run = member_sum(payloads, key, len(quantized), self.chunk, self.window, self.timeout_s, self.retries,
                             min(MIN_TIMEOUT_S, self.timeout_s), received=received)
            if self.listener is not None:
                membership = key.group.to_bytes(4, "big") + socket.inet_aton(self.address[0])
                if membership not in memberships:
                    self.listener.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP, membership)
                    memberships.append(membership)
            now = time.monotonic()
            if index < len(runs):
                self.retransmits += runs[index].retransmits
                self.results_refused += runs[index].results_refused
                runs[index], began[index] = run, now
            else:
                runs.append(run)
                began.append(now)
            send(run.start(now))

        def finished(index: int) -> None:
            """Sum `index` is done: its wrong results refused, its next sum started if `then` gives one."""
            run = runs[index]
            if run.wrong_chunks:
                raise ClientError(f"{_round(run.key, averaging)}, clique {run.key.clique}: results of chunks "
                                  f"{sorted(run.wrong_chunks)[:5]} do not hold the whole clique of {run.key.fanin} "
                                  f"at exponent {run.key.exponent} (another job's traffic in these slots?)")
            following = then(index, run) if then is not None else None
            if following is not None:
                start(index, *following)

        roll: RollCall | None = None
        roll_of: MemberSum | None = None
        roll_send: Callable[[Sequence[bytes]], None] | None = None
        roll_next: float | None = None
        quiet = min(ROLL_CALL_TIMEOUTS * self.timeout_s, self.deadline_s / 4)
        try:
            for index, (key, quantized) in enumerate(sums):
                start(index, key, quantized)
            # A registered job's results count only from the aggregator its contributions went to.
            source = (ip_int(socket.gethostbyname(host)), port) if runs and runs[0].key.token else None
            for index, run in enumerate(runs):
                if run.done:
                    finished(index)
            while not all(run.done for run in runs):
                now = time.monotonic()
                for run in runs:
                    send(run.due(now))
                # The sum that calls the roll and names a failure: the first that failed, else the first unfinished.
                failed = [i for i, run in enumerate(runs) if run.failed_chunk is not None]
                index = failed[0] if failed else next(i for i, run in enumerate(runs) if not run.done)
                run = runs[index]
                if run.failed_chunk is not None or now - began[index] > self.deadline_s:
                    message, missing = self._failure(run, run.key, member, members, now - began[index],
                                                     roll if roll_of is run else None, (host, port), averaging)
                    raise ClientError(message, missing)
                # Stalled: ask the aggregator who is there, so that a failure can name who is not.
                roll_at = (run.result_at or began[index]) + quiet
                if roll_next is not None and roll_of is run:
                    roll_at = max(roll_at, roll_next)
                if now >= roll_at:
                    if roll is None or roll_send is None or roll_of is not run:
                        roll, roll_of = RollCall(run.key, member, self.window, nearby, self._tree_place(run.key)), run
                        roll_send = self._sender(self._root(host, port, route))
                    roll_send(roll.datagrams())
                    roll_next = roll_at = now + min(self.timeout_s, quiet)
                due = [deadline for deadline in (run.next_deadline() for run in runs if not run.done)
                       if deadline is not None]
                ends = [began[i] + self.deadline_s for i, run in enumerate(runs) if not run.done]
                wait = max(0.0, min(min(due, default=now), *ends, roll_at) - now)
                for ready in select.select(sockets, [], [], wait)[0]:
                    while True:
                        sizes, refused = _receive(ready, buffer, slot, source)
                        if not sizes:
                            break
                        self.results_refused += refused
                        now = time.monotonic()
                        for index, run in enumerate(runs):
                            if not run.done:
                                send(run.on_results(view, sizes, slot, now))
                                if run.done:
                                    finished(index)
                        if roll is not None:
                            for index, size in enumerate(sizes):
                                roll.read(view[index * slot:index * slot + size])
        finally:
            if self.listener is not None:
                for membership in memberships:
                    self.listener.setsockopt(socket.IPPROTO_IP, socket.IP_DROP_MEMBERSHIP, membership)
            for run in runs:
                self.retransmits += run.retransmits
                self.results_refused += run.results_refused
        return runs

    def _sender(self, destination: Address) -> Callable[[Sequence[bytes]], None]:
        """send(payloads) to `destination`: with the compiled kernel one sendmmsg per call (equal-sized runs as
        UDP GSO messages), else datagram by datagram; `loss` drops its share first."""
        sock, loss = self.socket, self.loss

        def send(payloads: Sequence[bytes]) -> None:
            if loss:
                payloads = self._survivors(payloads)
            if not payloads:
                return
            if compiled is None:
                for payload in payloads:
                    sock.sendto(payload, destination)
                return
            messages = [(payload, destination) for payload in payloads]
            start = 0
            while start < len(messages):
                start, refused = compiled.send_batch(sock.fileno(), messages, start)
                if refused:
                    # The kernel refused a datagram (no route, a broadcast address, ...): sending one again
                    # with sendto raises its error, as the datagram-by-datagram path does (a passing error:
                    # a duplicate, which the aggregator drops).
                    sock.sendto(*messages[0])
                if start < len(messages):
                    select.select([], [sock], [])  # a full send buffer, waited out as a blocking sendto would
        return send

    def _tree_place(self, key: CliqueKey) -> tuple[int, int] | None:
        """For a clique that the registered job's tables route along a tree: (a clique no route names, where the
        roll call's records go; the members that send to this member's aggregator: its level without its
        children's), else None."""
        entry = self.entry
        route = entry.routes.get(key.clique) if entry is not None else None
        if entry is None or route is None:
            return None
        below = 0
        for held in route.children.values():
            below |= held
        free = next(clique for clique in range(0xFFFF, -1, -1) if clique not in entry.routes)
        return free, route.resolved_level(key.fanin) & ~below

    def _next_loss_gap(self) -> int:
        """How many datagrams pass before the loss injection drops one: geometric, so that each datagram is
        dropped independently with probability `loss`."""
        return int(self.loss_rng.geometric(self.loss)) - 1 if self.loss else 0

    def _survivors(self, payloads: Sequence[bytes]) -> Sequence[bytes]:
        """`payloads` less those the loss injection drops. One draw per drop, not one per datagram: a draw per
        datagram cost a lossy run's islands about 12 ms of CPU each per 100 MB that the lossless run they
        are compared with did not spend, on cores the islands and the service share."""
        if self.loss_gap >= len(payloads):
            self.loss_gap -= len(payloads)
            return payloads
        kept: list[bytes] = []
        start = 0
        while self.loss_gap < len(payloads) - start:
            dropped = start + self.loss_gap
            kept += payloads[start:dropped]
            start = dropped + 1
            self.loss_gap = self._next_loss_gap()
        self.loss_gap -= len(payloads) - start
        return kept + list(payloads[start:])

    def _root(self, host: str, port: int, route: Mapping[str, int] | None) -> Address:
        """The (host, port) of the clique's root aggregator, where the roll call is kept: the member's own
        aggregator, or the topmost hop its route names (the aggregators of a tree share one port)."""
        hops = [route.get(f"hop{hop}", 0) for hop in range(1, 1 + ROUTE_HOPS)] if route else []
        top = next((address for address in reversed(hops) if address), None)
        host = host if top is None else ip_str(top)
        return (host, port) if compiled is None else (socket.gethostbyname(host), port)

    def _failure(self, run: MemberSum, key: CliqueKey, member: int, members: Sequence[str] | None, elapsed: float,
                 roll: RollCall | None, aggregator: Address, averaging: bool) -> tuple[str, list[str | int]]:
        """The message of a sum that failed, and the members the roll call found missing. `aggregator`: the
        (host, port) the contributions went to."""
        chunk = run.failed_chunk if run.failed_chunk is not None else min(run.deadline, default=0)
        tries = run.tries.get(chunk, 0)
        names: list[str | int] = list(members) if members else list(range(key.fanin))
        named = [str(name) if members else f"member {name}" for name in names]
        drops = self.kernel_drops()
        dropped = f"; the kernel dropped {drops} datagrams at this island's socket" if drops else ""
        missing: list[int] = []
        unreached = f"the aggregator's results do not reach this island at {self.address[0]}"
        if roll is None:
            cause = f"a member of the clique never contributed it, or {unreached}"
        elif member not in roll.seen:
            needed = presence_slot(key.fanin - 1, key, self.window) + 1
            # The slots matter only when the roll call's records lie past what a default service keeps.
            slots = (f", whose records need {needed} slots, more than inwire serve's default {DEFAULT_SLOTS} "
                     f"(--slots)" if needed > DEFAULT_SLOTS else "")
            cause = (f"the aggregator answered neither the sum nor any of {roll.calls} roll calls{slots}: it is not "
                     f"running there, a member of the clique never contributed, or {unreached}")
            if not key.token:
                cause += (" (or it takes registered jobs only, as inwire serve does unless --unregistered, and this "
                          "island sends unregistered frames: give it its job, entry= or $INWIRE_JOB)")
        else:
            missing = [m for m in range(key.fanin) if m not in roll.seen and roll.here >> m & 1]
            # In a registered tree the roll call sees only the members that send to this island's aggregator.
            beyond = [named[m] for m in range(key.fanin) if not roll.here >> m & 1]
            absent = [named[m] for m in missing if m not in roll.elsewhere]
            if missing:
                cause = f"no contribution of {', '.join(named[m] for m in missing)} arrived"
            elif beyond:
                cause = (f"every member that sends to this aggregator answered the roll call; {', '.join(beyond)} "
                         f"send{'s' if len(beyond) == 1 else ''} to other aggregators of the registered tree, whose "
                         f"roll-call records this island cannot see: one of them never contributed, or {unreached}")
            else:
                cause = f"every member answered the roll call, yet {unreached}"
            if absent:
                cause += f" (the aggregator holds no roll-call record of {'it' if len(absent) == 1 else 'them'})"
            behind = [f"{named[m]} at round {roll.elsewhere[m]}" for m in missing if m in roll.elsewhere]
            if behind:
                cause += (f": {', '.join(behind)} answered the roll call, this island at round "
                          f"{averaging_round(key.round)}"
                          f" (checkpoints of different rounds: resume every island from the same round)")
        return (f"{_round(key, averaging)}, clique {key.clique} ({', '.join(map(str, named))}): no result for "
                f"chunk {chunk} of {len(run.payloads)} from the aggregator at {aggregator[0]}:{aggregator[1]} after "
                f"{tries} retransmissions in {elapsed:.1f} s: {cause}{dropped}", [names[m] for m in missing])

    def average(self, key: CliqueKey, member: int, vector: npt.ArrayLike | Pieces, bound: float,
                city: str | None = None, route: Mapping[str, int] | None = None, members: Sequence[str] | None = None,
                nearby: Sequence[tuple[int, int, Mapping[int, int]]] = ()) -> tuple[npt.NDArray[np.float32], float]:
        """The clique's average of float32 `vector` (or of its `Pieces`, quantized straight from each):
        quantized at the exponent every member derives from `bound` (`key.exponent` is ignored), re-sent at a
        raised bound when a sum saturates or a member's values do not fit (`codec_average`). Returns (average,
        the bound that worked): float32 over the one buffer the elements, their sums and the average share.
        `key.round` counts averagings; `nearby`: (another averaging round, clique there, {member index here:
        index there}) where a stalled sum's roll call also looks for the members it does not find (`Nearby`)."""
        return self.average_many([(key, vector)], member, bound, city, route, members, nearby)[0]

    def average_many(self, averagings: Sequence[tuple[CliqueKey, npt.ArrayLike | Pieces]], member: int, bound: float,
                     city: str | None = None, route: Mapping[str, int] | None = None,
                     members: Sequence[str] | None = None, nearby: Sequence[tuple[int, int, Mapping[int, int]]] = (),
                     words: Sequence[npt.ArrayLike | None] = (),
                     agree: Callable[[int, npt.NDArray[np.int32]], None] | None = None
                     ) -> list[tuple[npt.NDArray[np.float32], float]]:
        """`average` of several vectors of one clique's members, each (key, vector) with its own key (another
        round or clique, so slots of its own), their sums in flight together (`_run_many`); a re-send starts as
        soon as its sums are in, whatever the others do. `words[i]`, unless None: averaging i is preceded by its
        clique's agreement on them (`gather`), whose rows `agree(i, rows)` checks (raising to stop every
        averaging) before averaging i's first sum starts. (average, bound) of each, in order."""
        keys = [key for key, _ in averagings]
        agreeing = [index < len(words) and words[index] is not None for index in range(len(keys))]
        pieces = [vector if isinstance(vector, Pieces) else Pieces.of(np.asarray(vector, dtype=np.float32).reshape(-1))
                  for _, vector in averagings]
        # One buffer for every attempt: a re-send quantizes the vector again over the sums it could not use.
        buffers = [np.empty(each.count + 1, dtype=ELEMENT_DTYPE) for each in pieces]
        attempts = [0] * len(keys)
        bounds = [bound] * len(keys)
        done: list[tuple[npt.NDArray[np.float32], float] | None] = [None] * len(keys)

        def attempt(index: int) -> tuple[CliqueKey, npt.NDArray[np.integer]]:
            """Averaging `index`'s next attempt: its vector quantized at the exponent of its bound."""
            key = keys[index]
            exponent, buffers[index] = encode(pieces[index], bounds[index], key.fanin, ELEMENT_DTYPE,
                                              out=buffers[index])
            return CliqueKey(key.job, key.round * ATTEMPTS + attempts[index], key.clique, key.group, key.fanin,
                             exponent, key.max_cliques, key.token), buffers[index]

        def then(index: int, run: MemberSum) -> tuple[CliqueKey, npt.NDArray[np.integer]] | None:
            """After averaging `index`'s agreement, its first attempt; after an attempt, its sums decoded, or its
            re-send at a raised bound when they overflowed."""
            if agreeing[index]:
                agreeing[index] = False
                if agree is not None:
                    agree(index, run.sums().astype(np.int32).reshape(keys[index].fanin, -1))
                return attempt(index)
            # Decoded in place too: the average is float32 over the sums' memory (one vector's pages in all).
            average, bounds[index] = decode(run.sums(), run.overflow, run.key.exponent, keys[index].fanin,
                                            bounds[index], out=buffers[index].view(np.float32)[:-1])
            if average is not None:
                done[index] = (average, bounds[index])
                return None
            attempts[index] += 1
            if attempts[index] == AVERAGING_ATTEMPTS:
                raise AveragingError(f"round {keys[index].round}: sums still overflow at a bound of {bounds[index]}")
            return attempt(index)

        firsts = []
        for index, key in enumerate(keys):
            agreed_on = words[index] if agreeing[index] else None
            firsts.append(attempt(index) if agreed_on is None else _agreement(key, member, agreed_on))
        self._run_many(firsts, member, city, route, members, in_place=True, nearby=_places(nearby), averaging=True,
                       then=then)
        return cast(list[tuple[npt.NDArray[np.float32], float]], done)

    def gather(self, key: CliqueKey, member: int, words: npt.ArrayLike, city: str | None = None,
               route: Mapping[str, int] | None = None, members: Sequence[str] | None = None,
               nearby: Sequence[tuple[int, int, Mapping[int, int]]] = ()) -> npt.NDArray[np.int32]:
        """Every member's int32 `words` (as many on every member), row m member m's: the clique of averaging
        round `key.round` agrees on them before its first sum, at `agreement_round`. One sum through the
        aggregator: each member sends its words at its own positions and zeros elsewhere, so every element
        adds one member's word to zeros, which neither saturates nor depends on the order of arrival; the
        codec is not involved. The other arguments are `average`'s."""
        agreement, vector = _agreement(key, member, words)
        run = self._run(agreement, member, vector, city, route, members, nearby=_places(nearby), averaging=True)
        return run.sums().astype(np.int32).reshape(key.fanin, -1)


def _agreement(key: CliqueKey, member: int, words: npt.ArrayLike) -> tuple[CliqueKey, npt.NDArray[np.int32]]:
    """(key, vector) of member `member`'s part in the agreement on `words` before averaging `key` (`gather`):
    its words at its own positions, zeros elsewhere."""
    words = np.asarray(words, dtype=np.int32)
    width = len(words)
    vector = np.zeros(key.fanin * width, dtype=np.int32)
    vector[member * width:(member + 1) * width] = words
    return agreement_key(key), vector


def _places(nearby: Sequence[tuple[int, int, Mapping[int, int]]]) -> list[Nearby]:
    """Where a roll call looks for members of the clique at other averaging rounds (`UdpMember.average`'s
    `nearby`): at those rounds' first sums and at their agreements, where a member that starts its averagings
    there waits first."""
    return [Nearby(round_, protocol_round, clique, positions) for round_, clique, positions in nearby
            for protocol_round in (round_ * ATTEMPTS, agreement_round(round_))]

