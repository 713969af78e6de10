"""The fast software aggregator: `model.Aggregator`'s decisions taken on the UDP payload itself.

`inwire serve` receives UDP payloads. The golden path wraps each one in the Ethernet/IPv4/UDP header it
would have carried and hands the frame to the model; this path skips the frame. What the wrapping makes
certain is not checked again: a wrapped datagram is always IPv4/UDP addressed to the service, its IPv4
header is 0x45, not a fragment and its checksum is right (`datagram.wrap` computed it). Everything else
is checked in the model's order, so every datagram gets the model's disposition and output, bit for bit,
and the model's counters. The model stays the definition: `tests/test_fastpath.py` feeds both the same
random and adversarial streams and compares every output, destination and counter.

Where the time goes, and what is done about it:
- one `struct` unpack of the 40 bytes of the aggregation header that carry fields (not a numpy record);
- sums live in a preallocated int64 buffer per slot, updated in place and clipped per contribution
  (clipping once at the end is not the model: MAX + MAX - MAX must give 0 with the overflow flag);
- a result's header is packed once when its slot completes and kept with its elements; answering a
  retransmission patches the one byte that differs (the asker's sender index);
- counters are a list indexed by disposition;
- slot leases: each slot's stamp is the arrival time of its last accepted contribution, compared only
  when another owner wants an unfinished slot.

The per-element work (saturating sum, big-endian encoding) runs in `inwire._fastpath` when that C
extension was built (`make setup`), else in numpy. Both are run by the same differential tests.
"""

import os
import struct

import numpy as np

from .datagram import PAYLOAD_HEADER_BYTES, PAYLOAD_OFFSET
from .model import TIME_BITS
from .protocol import (
    AGGREGATION_FIELDS,
    COUNTERS,
    ELEMENT_BYTES,
    FRAME_HEADER_BYTES,
    FRAME_OFFSETS,
    INT32_MAX,
    INT32_MIN,
    IPV4_BYTES,
    MAGIC,
    MIN_FRAME_BYTES,
    MULTICAST_MASK,
    MULTICAST_PREFIX,
    RESULT_TRAILER_BYTES,
    STATUS_OVERFLOW,
    UDP_BYTES,
    VERSION,
    Disposition,
    Opcode,
)

try:
    from . import _fastpath as compiled
except ImportError:  # the extension is optional: numpy does the same work
    compiled = None

_FIELDS = AGGREGATION_FIELDS[:-1]
"""The aggregation header's fields up to its zero padding (the table's last field)."""
_UNSIGNED_CODES = {1: "B", 2: "H", 4: "I", 8: "Q"}
HEADER = struct.Struct("!" + "".join(_UNSIGNED_CODES[field.nbytes].lower() if field.signed
                                     else _UNSIGNED_CODES[field.nbytes] for field in _FIELDS))
"""The fields as one struct, in table order: magic, version, opcode, sender, ..., group, bitmap."""
SENDER_AT = FRAME_OFFSETS["sender"] - PAYLOAD_OFFSET
"""Offset of the sender byte within a payload: the one byte a stored result's answers differ in."""
RUNT_PAYLOAD = MIN_FRAME_BYTES - PAYLOAD_OFFSET
"""Payloads shorter than this make frames shorter than 60 bytes."""
MAX_PAYLOAD = 0xFFFF - IPV4_BYTES - UDP_BYTES
"""Longest payload whose IPv4 total length fits 16 bits; a longer one wraps the length field."""
STATS_REPLY_COUNT = len(COUNTERS)
_CONTRIBUTION, _RESULT_REQUEST, _STATS_REQUEST = Opcode.CONTRIBUTION, Opcode.RESULT_REQUEST, Opcode.STATS_REQUEST
_COUNTER_INDEX = {name: index for index, name in enumerate(COUNTERS)}
_FRAMES_IN, _RESULTS, _RECLAIMED, _SATURATIONS, _EXPIRED = (_COUNTER_INDEX[name] for name in (
    "frames_in", "results_emitted", "slots_reclaimed", "saturations", "leases_expired"))
_TIME_MASK = 2**TIME_BITS - 1
_STATUS = (bytes(RESULT_TRAILER_BYTES), STATUS_OVERFLOW.to_bytes(RESULT_TRAILER_BYTES, "big"))
_PADDING = bytes(AGGREGATION_FIELDS[-1].nbytes)
_BACKENDS = ("numpy", "c")


def default_backend():
    """'c' when the compiled kernel is importable, else 'numpy'; INWIRE_FASTPATH=numpy forces numpy."""
    wanted = os.environ.get("INWIRE_FASTPATH", "")
    if wanted == "numpy" or compiled is None:
        return "numpy"
    return "c"


class FastAggregator:
    """`handle(payload, now)` -> (disposition, answer payload or None) with the model's state and counters.

    The state per slot: key (job, round, clique, chunk) or None, fan-in, group, count, exponent, bitmap,
    overflow, complete, the running sums, the completed result (payload) once there is one, and the
    arrival time of the last accepted contribution (lease stamp).
    """

    def __init__(self, config, backend=None):
        backend = backend or default_backend()
        if backend not in _BACKENDS:
            raise ValueError(f"fast path backend must be one of {', '.join(_BACKENDS)}, got {backend!r}")
        if backend == "c" and compiled is None:
            raise ValueError("the compiled fast path (inwire._fastpath) is not built; run `make setup`")
        self.backend = backend
        self.config = config
        slots = config.slots
        self.keys = [None] * slots
        self.shapes = [None] * slots
        """(fanin, group, count, exponent) of the slot's owner."""
        self.bitmaps = [0] * slots
        self.overflow = [False] * slots
        self.results = [None] * slots
        """The completed slot's result payload (bytes); None while the slot is unfinished."""
        self.sums = [None] * slots
        self.stamps = [0] * slots
        self.now = 0
        """Arrival time of the latest datagram, in lease ticks modulo 2**TIME_BITS (as the model's)."""
        self.counts = [0] * len(COUNTERS)
        self._accumulate = self._accumulate_c if backend == "c" else self._accumulate_numpy

    def stats(self):
        return dict(zip(COUNTERS, self.counts, strict=True))

    def slot_key(self, slot):
        return self.keys[slot]

    def handle(self, payload, now=None):
        """Disposition and answer (a payload, or None) of one datagram that arrived at `now` (lease ticks;
        None: no time passed since the previous one); counts it."""
        if now is not None:
            self.now = now & _TIME_MASK
        disposition, answer = self._decide(payload)
        counts = self.counts
        counts[disposition] += 1
        counts[_FRAMES_IN] += 1
        return disposition, answer

    def _decide(self, payload):
        length = len(payload)
        if length < RUNT_PAYLOAD:
            return Disposition.DROP_RUNT, None
        if length < PAYLOAD_HEADER_BYTES:
            return Disposition.DROP_LENGTH, None
        (magic, version, opcode, sender, fanin, exponent, _, job, round_, clique, slot, chunk, count, _, group,
         _) = HEADER.unpack_from(payload)
        if magic != MAGIC or version != VERSION:
            return Disposition.DROP_VERSION, None
        if opcode == _CONTRIBUTION:
            expected = PAYLOAD_HEADER_BYTES + ELEMENT_BYTES * count
        elif opcode == _RESULT_REQUEST or opcode == _STATS_REQUEST:
            expected = PAYLOAD_HEADER_BYTES
        else:
            return Disposition.DROP_OPCODE, None
        if length != expected or length > MAX_PAYLOAD:
            return Disposition.DROP_LENGTH, None
        if opcode == _STATS_REQUEST:
            return Disposition.ANSWERED, self._stats_reply(sender, job)
        config = self.config
        if not 1 <= fanin <= config.max_fanin:
            return Disposition.DROP_FANIN, None
        if sender >= fanin:
            return Disposition.DROP_SENDER, None
        if not 1 <= count <= config.max_elements:
            return Disposition.DROP_COUNT, None
        if group & MULTICAST_MASK != MULTICAST_PREFIX:
            return Disposition.DROP_GROUP, None
        if slot >= config.slots:
            return Disposition.DROP_SLOT, None
        key = (job, round_, clique, chunk)
        current = self.keys[slot]
        if opcode == _RESULT_REQUEST:
            if current == key and self.results[slot] is not None:
                return Disposition.ANSWERED, self._answer(slot, sender)
            return Disposition.DROP_NO_RESULT, None

        shape = (fanin, group, count, exponent)
        if current == key:
            if self.shapes[slot] != shape:
                return Disposition.DROP_MISMATCH, None
            if self.results[slot] is not None:
                return Disposition.ANSWERED, self._answer(slot, sender)
            if self.bitmaps[slot] >> sender & 1:
                return Disposition.DROP_DUPLICATE, None
        elif current is None or self.results[slot] is not None:
            self._claim(slot, key, shape)
        elif job == current[0] and 0 < ((round_ - current[1]) & 0xFFFFFFFF) < 2**31:
            self.counts[_RECLAIMED] += 1
            self._claim(slot, key, shape)
        elif config.lease and (self.now - self.stamps[slot]) & _TIME_MASK >= config.lease:
            self.counts[_EXPIRED] += 1
            self._claim(slot, key, shape)
        else:
            return Disposition.DROP_COLLISION, None

        if self._accumulate(self.sums[slot], payload, count):
            self.counts[_SATURATIONS] += 1
            self.overflow[slot] = True
        bitmap = self.bitmaps[slot] | 1 << sender
        self.bitmaps[slot] = bitmap
        self.stamps[slot] = self.now
        if bitmap.bit_count() < fanin:
            return Disposition.ACCUMULATED, None
        return Disposition.ACCUMULATED, self._complete(slot, sender, key, shape, bitmap)

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

    def _accumulate_c(self, sums, payload, count):
        return compiled.accumulate(sums, payload, PAYLOAD_HEADER_BYTES, count)

    def _complete(self, slot, sender, key, shape, bitmap):
        """The result payload, packed once; later answers patch its sender byte."""
        fanin, group, count, exponent = shape
        job, round_, clique, chunk = key
        header = HEADER.pack(MAGIC, VERSION, Opcode.RESULT, sender, fanin, exponent, bitmap.bit_count(), job,
                             round_, clique, slot, chunk, count, 0, group, bitmap)
        status = _STATUS[self.overflow[slot]]
        if self.backend == "c":
            result = compiled.encode_result(header + _PADDING, self.sums[slot], status)
        else:
            result = b"".join((header, _PADDING, self.sums[slot].astype(">i4").tobytes(), status))
        self.results[slot] = result
        self.counts[_RESULTS] += 1
        return result

    def _answer(self, slot, sender):
        """The stored result of a completed slot, as sent to the frame with `sender` that asked for it."""
        self.counts[_RESULTS] += 1
        result = self.results[slot]
        if result[SENDER_AT] == sender:
            return result
        patched = bytearray(result)
        patched[SENDER_AT] = sender
        return bytes(patched)

    def _stats_reply(self, sender, job):
        """Counters before this request, as uint32 elements; every other field is zero, as the model's."""
        header = HEADER.pack(MAGIC, VERSION, Opcode.STATS_REPLY, sender, 0, 0, 0, job, 0, 0, 0, 0,
                             STATS_REPLY_COUNT, 0, 0, 0)
        values = struct.pack(f"!{STATS_REPLY_COUNT}I", *(value & 0xFFFFFFFF for value in self.counts))
        return header + _PADDING + values


assert FRAME_HEADER_BYTES - PAYLOAD_OFFSET == PAYLOAD_HEADER_BYTES
