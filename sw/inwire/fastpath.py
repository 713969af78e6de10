"""The fast software aggregator: `model.Aggregator`'s decisions taken on the UDP payload itself.

`inwire serve` receives UDP payloads. The golden path wraps each one in the Ethernet/IPv4/UDP header it
would have carried and hands the frame to the model; this path skips the frame. What the wrapping makes
certain is not checked again: a wrapped datagram is always IPv4/UDP addressed to the service, its IPv4
header is 0x45, not a fragment and its checksum is right (`datagram.wrap` computed it). Version 1 and
version 2 datagrams are taken, as the model takes them (a version 1 one is a flat one-member contribution,
answered in version 1). Everything else
is checked in the model's order, so every datagram gets the model's disposition and output, bit for bit,
and the model's counters. The model stays the definition: `tests/test_fastpath.py` feeds both the same
random and adversarial streams and compares every output, destination and counter.

Where the time goes, and what is done about it:
- one `struct` unpack of the 48 bytes of the aggregation header that a decision reads (not a numpy
  record); the hops are not unpacked: a partial's route is its asker's hop bytes moved up one level;
- sums live in a preallocated int64 buffer per slot, updated in place and clipped per contribution
  (clipping once at the end is not the model: MAX + MAX - MAX must give 0 with the overflow flag);
- a slot's output (result or partial) is packed once when the slot completes and kept with its elements;
  answering a retransmission or request patches what its asker decides (version, opcode, sender index and
  route: a partial to the asker's hop1, or the result), and nothing when the asker is like the completer;
- counters are a list indexed by disposition;
- slot leases: each slot's stamp is the arrival time of its last accepted contribution, compared only
  when another owner wants an unfinished slot.

Two backends. "numpy" is the Python above (the per-element work in numpy): it is the fast path's
definition. "c" (the default where the compiled kernel `inwire._kernel` was built, `make setup`) hands each
datagram to its `Decider`, which holds the slot table and takes the same decisions in the same order in C,
one call per datagram; for `inwire serve` it also keeps serve.py's learning table (who sent each slot's
contributions and partials) and makes a result's unicast copies. No disposition, opcode, header offset,
counter index or other protocol number is written in the C code: `decider_parameters` passes them in from
the protocol tables. Both backends run the same differential tests against the golden model, and the C one
is shown to fail them when one of its numbers is wrong.
"""

import os
import struct
from types import ModuleType

import numpy as np

from .datagram import HEADER, PAYLOAD_HEADER_BYTES, PAYLOAD_OFFSET, SENDER_AT, header_struct, ip_int
from .datagram import payload_at as _at
from .kernel import compiled
from .model import TIME_BITS, _prefix_mask
from .protocol import (
    AGGREGATION_FIELDS,
    COUNTERS,
    ELEMENT_BYTES,
    FIELDS_BY_NAME,
    FRAME_HEADER_BYTES,
    INT32_MAX,
    INT32_MIN,
    IPV4_BYTES,
    MAGIC,
    MAX_FANIN,
    MIN_FRAME_BYTES,
    MULTICAST_MASK,
    MULTICAST_PREFIX,
    RESULT_TRAILER_BYTES,
    STATUS_OVERFLOW,
    UDP_BYTES,
    VERSION,
    VERSIONS,
    Disposition,
    Opcode,
    clique_mask,
)

DECISION = header_struct("magic", "expect")
"""The fields a decision reads: HEADER's and `expect`. The hops are read only when a slot's output is made,
as bytes."""
VERSION_AT, OPCODE_AT = _at("version"), _at("opcode")
"""The bytes besides the route in which a stored output's answers differ: each carries its asker's."""
ROUTE_AT, ROUTE_END = _at("expect"), _at("reserved")
"""The route of an output: `expect`, `hop1`, `hop1_expect`, `hop2`, `hop2_expect`."""
HOP1_AT, HOP1_EXPECT_AT, HOP2_AT, HOP2_EXPECT_AT = _at("hop1"), _at("hop1_expect"), _at("hop2"), _at("hop2_expect")
_MOVED_UP = ROUTE_END - HOP1_EXPECT_AT
"""A partial's route is its asker's from `hop1_expect` on, moved to `expect`: the fields are laid out so
that one level up is one copy (expect <- hop1_expect, hop1 <- hop2, hop1_expect <- hop2_expect)."""
assert (_at("hop2") - HOP1_EXPECT_AT, _at("hop2_expect") - HOP1_EXPECT_AT) == (HOP1_AT - ROUTE_AT,
                                                                                HOP1_EXPECT_AT - ROUTE_AT)
_NO_HOP = bytes(HOP1_EXPECT_AT - HOP1_AT)
_ROOT_ROUTE = bytes(ROUTE_END - ROUTE_AT)
_HOP_PADDING = bytes(ROUTE_END - ROUTE_AT - _MOVED_UP)
RUNT_PAYLOAD = MIN_FRAME_BYTES - PAYLOAD_OFFSET
"""Payloads shorter than this make frames shorter than 60 bytes."""
MAX_PAYLOAD = 0xFFFF - IPV4_BYTES - UDP_BYTES
"""Longest payload whose IPv4 total length fits 16 bits; a longer one wraps the length field."""
STATS_REPLY_COUNT = len(COUNTERS)
_CONTRIBUTION, _PARTIAL, _RESULT, _RESULT_REQUEST, _STATS_REQUEST = (int(opcode) for opcode in (
    Opcode.CONTRIBUTION, Opcode.PARTIAL, Opcode.RESULT, Opcode.RESULT_REQUEST, Opcode.STATS_REQUEST))
_V1 = VERSIONS[0]
_DISPOSITION = ModuleType("dispositions", "The disposition table's members by name, as ints.")
_DISPOSITION.__dict__.update({member.name: int(member) for member in Disposition})
"""`_DISPOSITION.DROP_RUNT` is `int(Disposition.DROP_RUNT)`, bound once from the table: CPython looks up a
module's attribute about as fast as a global (about 2 ns more, measured), a member on the enum class about
65 ns more, as much as several of a decision's checks."""
_COUNTER_INDEX = {name: index for index, name in enumerate(COUNTERS)}
_FRAMES_IN, _RESULTS, _RECLAIMED, _SATURATIONS, _EXPIRED, _PARTIALS = (_COUNTER_INDEX[name] for name in (
    "frames_in", "results_emitted", "slots_reclaimed", "saturations", "leases_expired", "partials_emitted"))
_CLIQUES = [clique_mask(fanin) for fanin in range(MAX_FANIN + 1)]
_TIME_MASK = 2**TIME_BITS - 1
assert STATUS_OVERFLOW < 0x100, "a partial's carried overflow is read from the trailer's last byte"
assert MAX_FANIN <= 8 * FIELDS_BY_NAME["bitmap"].nbytes, "a member bitmap holds every member"
_STATUS = (bytes(RESULT_TRAILER_BYTES), STATUS_OVERFLOW.to_bytes(RESULT_TRAILER_BYTES, "big"))
_PADDING = bytes(AGGREGATION_FIELDS[-1].nbytes)
_BACKENDS = ("numpy", "c")


def decider_parameters(config):
    """(fields, constants, config) of the compiled `Decider` for `config`: each aggregation header field's
    (offset within the payload, width), and every number it decides with, named as `_fastpath.c` reads them,
    from the protocol tables."""
    fields = {field.name: (_at(field.name), field.nbytes) for field in AGGREGATION_FIELDS}
    constants = {
        "header_bytes": PAYLOAD_HEADER_BYTES, "element_bytes": ELEMENT_BYTES, "trailer_bytes": RESULT_TRAILER_BYTES,
        "runt_payload": RUNT_PAYLOAD, "max_payload": MAX_PAYLOAD, "max_members": MAX_FANIN, "magic": MAGIC,
        "version": VERSION, "version_1": _V1, "multicast_mask": MULTICAST_MASK, "multicast_prefix": MULTICAST_PREFIX,
        "status_overflow": STATUS_OVERFLOW, "time_mask": _TIME_MASK, "counters": len(COUNTERS),
        **{opcode.name.lower(): int(opcode) for opcode in Opcode},
        **{member.name.lower(): int(member) for member in Disposition},
        **{name: _COUNTER_INDEX[name] for name in ("frames_in", "results_emitted", "slots_reclaimed", "saturations",
                                                    "leases_expired", "partials_emitted")}}
    return fields, constants, _decider_config(config)


def _decider_config(config):
    network, length = config.upstream_prefix
    return {"slots": config.slots, "max_fanin": config.max_fanin, "max_elements": config.max_elements,
            "lease": config.lease, "ip": config.ip, "upstream_network": network,
            "upstream_mask": _prefix_mask(length)}


def default_backend():
    """'c' when the compiled kernel is importable, else 'numpy'; INWIRE_FASTPATH=numpy forces numpy."""
    wanted = os.environ.get("INWIRE_FASTPATH", "")
    if wanted == "numpy" or compiled is None:
        return "numpy"
    return "c"


class FastAggregator:
    """`handle(payload, now)` -> (disposition, answer payload or None) with the model's state and counters.

    The state per slot: key (job, round, clique, chunk) or None, shape (fan-in, group, count, exponent,
    level), member bitmap, overflow, the running sums, the completed output (payload) once there is one,
    and the arrival time of the last accepted contribution (lease stamp).
    """

    def __init__(self, config, backend=None):
        backend = backend or default_backend()
        if backend not in _BACKENDS:
            raise ValueError(f"fast path backend must be one of {', '.join(_BACKENDS)}, got {backend!r}")
        if backend == "c" and compiled is None:
            raise ValueError("the compiled fast path (inwire._kernel) is not built; run `make setup`")
        self.backend = backend
        self.learns = backend == "c"
        """Whether `handle` also learns serve's table (given a peer), `copies` makes unicast copies and `serve`
        (one datagram) and `serve_batch` (a recvmmsg batch) take serve's common case (`_kernel.Decider`)."""
        if backend == "c":
            self._config = config
            self._decider = compiled.Decider(*decider_parameters(config))
            # The compiled methods themselves: no Python frame around them, once per datagram.
            self.handle = self._decider.handle
            self.serve = self._decider.serve
            self.serve_batch = self._decider.serve_batch
            self.copies = self._decider.copies
            self.learned = self._decider.learned
            return
        self._config = config
        slots = config.slots
        self.keys = [None] * slots
        self.shapes = [None] * slots
        """(fanin, group, count, exponent, level) of the slot's owner, level resolved as the model's."""
        self.bitmaps = [0] * slots
        self.overflow = [False] * slots
        self.results = [None] * slots
        """The completed slot's output payload (bytes), as first sent; None while the slot is unfinished."""
        self.sums = [None] * slots
        self.stamps = [0] * slots
        self.now = 0
        """Arrival time of the latest datagram, in lease ticks modulo 2**TIME_BITS (as the model's)."""
        self.counts = [0] * len(COUNTERS)

    @property
    def config(self):
        return self._config

    @config.setter
    def config(self, config):
        """Another configuration (addresses, limits, lease) for the same number of slots; the state stays."""
        if config.slots != self._config.slots:
            raise ValueError(f"the fast path has {self._config.slots} slots; a configuration cannot change that")
        if self.backend == "c":
            self._decider.configure(_decider_config(config))
        self._config = config

    def stats(self):
        counts = self._decider.counts() if self.backend == "c" else self.counts
        return dict(zip(COUNTERS, counts, strict=True))

    def slot_key(self, slot):
        return self._decider.slot_key(slot) if self.backend == "c" else self.keys[slot]

    def handle(self, payload, now=None, source=0):
        """Disposition and answer (a payload, or None) of one datagram that arrived at `now` (lease ticks;
        None: no time passed since the previous one) from IPv4 address `source` (an int, or a dotted string
        as a socket gives it, read only when the datagram names a next hop); counts it. The compiled
        backend's `handle` takes a fourth argument, the peer to learn for serve (see `learns`)."""
        if now is not None:
            self.now = now & _TIME_MASK
        disposition, answer = self._decide(payload, source)
        counts = self.counts
        counts[disposition] += 1
        counts[_FRAMES_IN] += 1
        return disposition, answer

    def _decide(self, payload, source):
        length = len(payload)
        if length < RUNT_PAYLOAD:
            return _DISPOSITION.DROP_RUNT, None
        if length < PAYLOAD_HEADER_BYTES:
            return _DISPOSITION.DROP_LENGTH, None
        (magic, version, opcode, sender, fanin, exponent, _, job, round_, clique, slot, chunk, count, _, group,
         bitmap, expect) = DECISION.unpack_from(payload)
        if magic != MAGIC or (version != VERSION and version != _V1):
            return _DISPOSITION.DROP_VERSION, None
        if opcode == _CONTRIBUTION:
            expected = PAYLOAD_HEADER_BYTES + ELEMENT_BYTES * count
        elif opcode == _PARTIAL:
            expected = PAYLOAD_HEADER_BYTES + ELEMENT_BYTES * count + RESULT_TRAILER_BYTES
        elif opcode == _RESULT_REQUEST or opcode == _STATS_REQUEST:
            expected = PAYLOAD_HEADER_BYTES
        else:
            return _DISPOSITION.DROP_OPCODE, None
        if length != expected or length > MAX_PAYLOAD:
            return _DISPOSITION.DROP_LENGTH, None
        if opcode == _STATS_REQUEST:
            return _DISPOSITION.ANSWERED, self._stats_reply(version, sender, job)
        config = self.config
        if not 1 <= fanin <= config.max_fanin:
            return _DISPOSITION.DROP_FANIN, None
        if sender >= fanin:
            return _DISPOSITION.DROP_SENDER, None
        whole = _CLIQUES[fanin]
        if version == _V1:
            # Whatever its tree bytes hold: one member, the whole clique, the root.
            members, level = 1 << sender, whole
        else:
            members, level = bitmap or 1 << sender, expect or whole
            # members within the level, the level within the clique (whole is all ones below fan-in); without
            # `~`, whose negative ints cost more
            if members | level != level or level > whole:
                return _DISPOSITION.DROP_SENDER, None
        if not 1 <= count <= config.max_elements:
            return _DISPOSITION.DROP_COUNT, None
        if group & MULTICAST_MASK != MULTICAST_PREFIX:
            return _DISPOSITION.DROP_GROUP, None
        if slot >= config.slots:
            return _DISPOSITION.DROP_SLOT, None
        if version != _V1:
            hop1 = payload[HOP1_AT:HOP1_EXPECT_AT]
            if hop1 != _NO_HOP:
                if not self._route_allowed(hop1, payload[HOP2_AT:HOP2_EXPECT_AT], source):
                    return _DISPOSITION.DROP_ROUTE, None
            elif payload[HOP2_AT:HOP2_EXPECT_AT] != _NO_HOP:
                return _DISPOSITION.DROP_ROUTE, None
        key = (job, round_, clique, chunk)
        current = self.keys[slot]
        if opcode == _RESULT_REQUEST:
            if current == key and self.results[slot] is not None:
                return _DISPOSITION.ANSWERED, self._answer(slot, payload, version, sender)
            return _DISPOSITION.DROP_NO_RESULT, None

        shape = (fanin, group, count, exponent, level)
        if current == key:
            if self.shapes[slot] != shape:
                return _DISPOSITION.DROP_MISMATCH, None
            if self.results[slot] is not None:
                return _DISPOSITION.ANSWERED, self._answer(slot, payload, version, sender)
            if self.bitmaps[slot] & members:
                return _DISPOSITION.DROP_DUPLICATE, None
        elif current is None:
            self._claim(slot, key, shape)
        elif (job == current[0]
              and (0 < ((current[1] - round_) & 0xFFFFFFFF) < 2**31 if round_ != current[1]
                   else clique == current[2] and chunk < current[3])
              and not (config.lease and (self.now - self.stamps[slot]) & _TIME_MASK >= config.lease)):
            # An older frame of the owner's job (a delayed copy) never evicts the slot while its lease runs.
            return _DISPOSITION.DROP_STALE, None
        elif self.results[slot] is not None:
            self._claim(slot, key, shape)
        elif job == current[0] and 0 < ((round_ - current[1]) & 0xFFFFFFFF) < 2**31:
            self.counts[_RECLAIMED] += 1
            self._claim(slot, key, shape)
        elif config.lease and (self.now - self.stamps[slot]) & _TIME_MASK >= config.lease:
            self.counts[_EXPIRED] += 1
            self._claim(slot, key, shape)
        else:
            return _DISPOSITION.DROP_COLLISION, None

        if self._accumulate_numpy(self.sums[slot], payload, count):
            self.counts[_SATURATIONS] += 1
            self.overflow[slot] = True
        if opcode == _PARTIAL and payload[length - 1] & STATUS_OVERFLOW:
            # Saturated at a level below: carried into this slot's status, not counted here.
            self.overflow[slot] = True
        bitmap = self.bitmaps[slot] | members
        self.bitmaps[slot] = bitmap
        self.stamps[slot] = self.now
        if bitmap != level:
            return _DISPOSITION.ACCUMULATED, None
        return _DISPOSITION.ACCUMULATED, self._complete(slot, payload, version, sender, key, shape, bitmap)

    def _route_allowed(self, hop1, hop2, source):
        """The model's route rule (`model._route_allowed`) on hop1's and hop2's bytes, hop1 not 0."""
        config = self.config
        hop1 = int.from_bytes(hop1, "big")
        hop2 = int.from_bytes(hop2, "big")
        if isinstance(source, str):
            source = ip_int(source)
        return (hop1 != config.ip and hop1 != source and config.is_upstream(hop1)
                and hop2 != hop1 and hop2 != config.ip)

    def _claim(self, slot, key, shape):
        self.keys[slot] = key
        self.shapes[slot] = shape
        self.bitmaps[slot] = 0
        self.overflow[slot] = False
        self.results[slot] = None
        count = shape[2]
        sums = self.sums[slot]
        if sums is None or len(sums) != count:
            self.sums[slot] = np.zeros(count, dtype=np.int64)
        else:
            sums.fill(0)

    def _accumulate_numpy(self, sums, payload, count):
        """Add the payload's elements into `sums`, clipping at the int32 limits; True when any clipped."""
        np.add(sums, np.frombuffer(payload, ">i4", count, PAYLOAD_HEADER_BYTES), out=sums)
        if sums.max() > INT32_MAX or sums.min() < INT32_MIN:
            np.clip(sums, INT32_MIN, INT32_MAX, out=sums)
            return True
        return False

    def _count_output(self, opcode):
        self.counts[_PARTIALS if opcode == _PARTIAL else _RESULTS] += 1

    def _complete(self, slot, payload, version, sender, key, shape, bitmap):
        """The slot's output for the datagram that completed it, packed once; later answers patch it."""
        fanin, group, count, exponent, _ = shape
        job, round_, clique, chunk = key
        opcode, route = _route(payload, version)
        header = b"".join((HEADER.pack(MAGIC, version, opcode, sender, fanin, exponent, bitmap.bit_count(), job,
                                       round_, clique, slot, chunk, count, 0, group, bitmap), route, _PADDING))
        output = b"".join((header, self.sums[slot].astype(">i4").tobytes(), _STATUS[self.overflow[slot]]))
        self.results[slot] = output
        self._count_output(opcode)
        return output

    def _answer(self, slot, payload, version, sender):
        """The stored output of a completed slot, as sent to the datagram `payload` that asked for it: in its
        version, with its sender index, and where its route says (a partial up to its hop1, or the result)."""
        opcode, route = _route(payload, version)
        self._count_output(opcode)
        output = self.results[slot]
        if (output[SENDER_AT] == sender and output[OPCODE_AT] == opcode and output[VERSION_AT] == version
                and output[ROUTE_AT:ROUTE_END] == route):
            return output
        patched = bytearray(output)
        patched[VERSION_AT], patched[OPCODE_AT], patched[SENDER_AT] = version, opcode, sender
        patched[ROUTE_AT:ROUTE_END] = route
        return bytes(patched)

    def _stats_reply(self, version, sender, job):
        """Counters before this request, as uint32 elements; every other field is zero, as the model's."""
        header = HEADER.pack(MAGIC, version, Opcode.STATS_REPLY, sender, 0, 0, 0, job, 0, 0, 0, 0,
                             STATS_REPLY_COUNT, 0, 0, 0)
        values = struct.pack(f"!{STATS_REPLY_COUNT}I", *(value & 0xFFFFFFFF for value in self.counts))
        return b"".join((header, _ROOT_ROUTE, _PADDING, values))


def next_hop(payload):
    """The IPv4 address (an int) that a partial answering datagram `payload` goes to: the payload's hop1
    (to the aggregators' common port). Only meaningful when the answer is a partial."""
    return int.from_bytes(payload[HOP1_AT:HOP1_EXPECT_AT], "big")


def _route(payload, version):
    """(opcode, route bytes) of the output that datagram `payload` causes: below the root (its hop1 set, and
    only version 2 has hops) a partial whose route is the payload's moved up one level, else the result."""
    if version != _V1 and payload[HOP1_AT:HOP1_EXPECT_AT] != _NO_HOP:
        return _PARTIAL, b"".join((payload[HOP1_EXPECT_AT:ROUTE_END], _HOP_PADDING))
    return _RESULT, _ROOT_ROUTE


assert FRAME_HEADER_BYTES - PAYLOAD_OFFSET == PAYLOAD_HEADER_BYTES
