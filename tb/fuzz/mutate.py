"""Random and mutated frames for the aggregator, reproducible from a seed.

A stream mixes well-formed traffic (cliques of contributions, some of them reduction trees with partials
from a level below or partials sent up, result and stats requests, foreign frames)
with mutants of it: bit flips, truncations, extensions, header fields set to the limits of their range or
of the aggregator's configuration, elements at the int32 limits, frames of random bytes, recent frames
with forged hops (to the aggregator itself, back to their source, outside the upstream prefix, hop2
without or equal to hop1 or the aggregator), and delayed copies of earlier frames, which by then are
mostly older than their slot's owner (an earlier round, or an earlier chunk of the same round). Mutants
mostly keep a valid IPv4 checksum and consistent lengths, so that they reach the checks behind those.
Frames are between 1 and MAX_FRAME bytes (an AXI4-Stream frame has at least one byte).
"""

import collections
import random

import numpy as np

from inwire.protocol import (
    AGGREGATION_FIELDS,
    ETHERNET_BYTES,
    FIELDS_BY_NAME,
    FRAME_HEADER_BYTES,
    INT32_MAX,
    INT32_MIN,
    IPV4_BYTES,
    Opcode,
)
from inwire_hdl.cocotb.traffic import ABOVE_IP, BELOW_IP, Traffic, below, patch

MAX_FRAME = 1600
KINDS = ("good", "foreign", "request", "stats", "bit_flip", "truncate", "extend", "field_limit",
         "count_limit", "element_limit", "random_bytes", "forged_route", "stale_copy")
WEIGHTS = (30, 6, 5, 2, 14, 10, 8, 16, 2, 5, 4, 3, 4)
RECENT = 64
"""Well-formed frames remembered for forged hops and delayed copies."""
CHECKED_FIELDS = ("ip_ver_ihl", "ip_frag", "ip_len", "ip_proto", "udp_dport", "udp_len", "eth_type") + tuple(
    field.name for field in AGGREGATION_FIELDS if field.name not in ("reserved", "bitmap", "contributors"))


class Mutator:
    """`frames(n)` yields (kind, frame) pairs for `config`, from `seed`."""

    def __init__(self, config, seed=0):
        self.config = config
        self.random = random.Random(seed)
        self.traffic = Traffic(config, seed)
        self.pending = []
        self.job = 1 + self.random.randrange(4)
        self.rounds = [1] * config.slots
        self.cliques = [0] * config.slots
        self.chunks = [0] * config.slots
        self.recent = collections.deque(maxlen=RECENT)

    def frames(self, count):
        if count:
            # A clique of one on an empty slot: claimed and completed by one frame.
            count -= 1
            yield "good", self.traffic.contribution(self.traffic.elements(3), fanin=1, slot=0, job=self.job,
                                                    round=self.rounds[0])
        for _ in range(count):
            kind = self.random.choices(KINDS, WEIGHTS)[0]
            yield kind, getattr(self, f"_{kind}")()

    # Well-formed traffic: members of a few cliques, in a shuffled order, so that slots fill and complete.
    def _good(self):
        if not self.pending:
            rnd, cfg = self.random, self.config
            fanin = rnd.randint(1, min(cfg.max_fanin, 6))
            count = rnd.randint(1, min(cfg.max_elements, 24))
            # Mostly the next round of the slot's job, which claims or reclaims it; sometimes a later chunk
            # of the slot's round and clique (as a stream's chunk j + 2W takes chunk j's slot); sometimes an
            # older round (stale) or another job (a collision).
            slot = rnd.randrange(cfg.slots)
            if rnd.random() < 0.15:
                self.chunks[slot] += count
            else:
                self.rounds[slot] += 1
                self.cliques[slot], self.chunks[slot] = rnd.randrange(3), rnd.randrange(2) * count
            job, round_ = self.job, self.rounds[slot]
            if rnd.random() < 0.15:
                job, round_ = rnd.choice(((self.job + 1, round_), (self.job, (round_ - 2) & 0xFFFFFFFF)))
            fields = dict(slot=slot, job=job, round=round_, clique=self.cliques[slot], chunk=self.chunks[slot],
                          exponent=rnd.randint(-4, 4), group=0xEF_00_00_00 | rnd.randrange(1, 1 << 24))
            # One clique in ten near the int32 limits, so that sums saturate and results carry the flag.
            vectors = None
            if rnd.random() < 0.1:
                vectors = [self.traffic.elements(count, 2**30, INT32_MAX) * rnd.choice((1, -1)) for _ in range(fanin)]
            if fanin >= 2 and rnd.random() < 0.2:
                self.pending = self._tree(count, fanin, vectors, fields)
            else:
                self.pending = self.traffic.clique(count, fanin, vectors, **fields)
            # Some members retransmit, some requests ask for the result.
            extra = [rnd.choice(self.pending) for _ in range(rnd.randrange(2))]
            if rnd.random() < 0.3:
                extra.append(self.traffic.request(count=count, fanin=fanin, **fields))
            self.pending += extra
            rnd.shuffle(self.pending)
        frame = self.pending.pop()
        self.recent.append(frame)
        return frame

    def _tree(self, count, fanin, vectors, fields):
        """A clique as a reduction tree: members 0 .. k - 1 reach the aggregator in one partial from a level
        below (a model at another address), the others directly; or the aggregator is the level below for
        members 0 .. k - 1 and sends their partial up."""
        rnd, traffic = self.random, self.traffic
        vectors = vectors or [traffic.elements(count) for _ in range(fanin)]
        k = rnd.randint(1, fanin - 1)
        if rnd.random() < 0.5:
            return [traffic.contribution(vectors[s], sender=s, fanin=fanin, expect=(1 << k) - 1, hop1=ABOVE_IP,
                                         **fields) for s in range(k)]
        leaves = [traffic.contribution(vectors[s], sender=s, fanin=fanin, ip_dst=BELOW_IP, expect=(1 << k) - 1,
                                       hop1=self.config.ip, **fields) for s in range(k)]
        return below(self.config, BELOW_IP, leaves) + [
            traffic.contribution(vectors[s], sender=s, fanin=fanin, **fields) for s in range(k, fanin)]

    def _forged_route(self):
        """A recent well-formed frame whose hops would send a partial where none may go (drop_route)."""
        rnd, me = self.random, self.config.ip
        frame = bytearray(rnd.choice(self.recent) if self.recent else self._good())
        forged = rnd.choice((
            dict(hop1=me), dict(ip_src=ABOVE_IP, hop1=ABOVE_IP), dict(hop1=rnd.randrange(1, 1 << 32)),
            dict(hop1=0, hop2=ABOVE_IP), dict(hop1=ABOVE_IP, hop2=ABOVE_IP), dict(hop1=ABOVE_IP, hop2=me)))
        return bytes(patch(frame, **forged))

    def _stale_copy(self):
        """A delayed copy of a frame sent a while ago: by now mostly older than its slot's owner."""
        return self.random.choice(self.recent) if self.recent else self._good()

    def _foreign(self):
        return self.random.choice(self.traffic.foreign())

    def _request(self):
        cfg = self.config
        return self.traffic.request(count=self.random.randint(1, cfg.max_elements), slot=self.random.randrange(
            cfg.slots), job=self.job, fanin=self.random.randint(1, cfg.max_fanin))

    def _stats(self):
        return self.traffic.request(opcode=Opcode.STATS_REQUEST, count=0, job=self.random.randrange(1 << 32))

    def _base(self):
        return bytearray(self.random.choice((self._good, self._good, self._request, self._foreign))())

    def _bit_flip(self):
        frame = self._base()
        span = min(len(frame), FRAME_HEADER_BYTES) if self.random.random() < 0.8 else len(frame)
        for _ in range(self.random.choice((1, 1, 2, 3, 8))):
            position = self.random.randrange(span)
            frame[position] ^= 1 << self.random.randrange(8)
        if self.random.random() < 0.5 and len(frame) >= 34:
            patch(frame)
        return bytes(frame)

    def _truncate(self):
        frame = self._base()
        cut = self.random.choice((
            self.random.randrange(1, len(frame)), 59, 60, FRAME_HEADER_BYTES - 1, FRAME_HEADER_BYTES,
            len(frame) - 1, len(frame) - 4))
        return bytes(frame[:max(1, min(cut, len(frame)))])

    def _extend(self):
        frame = self._base()
        extra = self.random.choice((1, 3, 4, 8, 64, self.random.randrange(1, 300)))
        frame += bytes(self.random.randrange(256) for _ in range(extra))
        if self.random.random() < 0.3:
            # Lengths that agree with the longer frame: the count alone is now wrong.
            patch(frame, ip_len=(len(frame) - ETHERNET_BYTES) & 0xFFFF,
                  udp_len=(len(frame) - ETHERNET_BYTES - IPV4_BYTES) & 0xFFFF)
        return bytes(frame[:MAX_FRAME])

    def limits(self, name):
        """Values of field `name` at the edges of its range and of the aggregator's configuration."""
        field = FIELDS_BY_NAME[name]
        top = (1 << field.bits) - 1
        values = {0, 1, top, top - 1, 1 << (field.bits - 1), (1 << (field.bits - 1)) - 1}
        cfg = self.config
        values |= {
            "fanin": {cfg.max_fanin, cfg.max_fanin + 1, 64, 65},
            "sender": {cfg.max_fanin - 1, cfg.max_fanin, 63, 64},
            "slot": {cfg.slots - 1, cfg.slots},
            "count": {cfg.max_elements, cfg.max_elements + 1},
            "group": {0xEF000000, 0xEFFFFFFF, 0xEE_FF_FF_FF, 0xF0000000, 0xE0000001},
            "opcode": set(range(7)),
            "ip_ver_ihl": {0x45, 0x44, 0x46, 0x55, 0x4F},
            "ip_frag": {0x4000, 0x2000, 0x0001, 0x1FFF},
            "round": {0xFFFFFFFF, 0x7FFFFFFF, 0x80000000, 0x80000001},
        }.get(name, set())
        return sorted(v for v in values if 0 <= v <= top)

    def _field_limit(self):
        frame = self._base()
        if len(frame) < FRAME_HEADER_BYTES:
            frame += bytes(FRAME_HEADER_BYTES - len(frame))
        for _ in range(self.random.choice((1, 1, 2))):
            name = self.random.choice(CHECKED_FIELDS)
            value = self.random.choice(self.limits(name))
            patch(frame, fix_checksum=False, **{name: value})
            if name == "count" and self.random.random() < 0.7:
                # A count at a limit with the frame and lengths that match it, so the count check is reached.
                count = min(value, (MAX_FRAME - FRAME_HEADER_BYTES) // 4)
                frame = frame[:FRAME_HEADER_BYTES] + bytes(4 * count)
                patch(frame, fix_checksum=False, ip_len=len(frame) - ETHERNET_BYTES,
                      udp_len=len(frame) - ETHERNET_BYTES - IPV4_BYTES)
        if self.random.random() < 0.9:
            patch(frame)
        return bytes(frame[:MAX_FRAME])

    def _count_limit(self):
        """A contribution whose count (and length) is 0 or one past the maximum, all else valid."""
        count = self.random.choice((0, self.config.max_elements + 1))
        return self.traffic.contribution(self.traffic.elements(count), fanin=2, sender=1, job=self.job,
                                         slot=self.random.randrange(self.config.slots))

    def _element_limit(self):
        rnd = self.random
        pick = (INT32_MAX, INT32_MIN, 2**30, -2**30, 1, -1, 0)
        elements = np.array([rnd.choice(pick) for _ in range(rnd.randint(1, min(8, self.config.max_elements)))])
        fanin = rnd.randint(1, min(3, self.config.max_fanin))
        return self.traffic.contribution(elements, fanin=fanin, sender=rnd.randrange(fanin),
                                         slot=rnd.randrange(self.config.slots), job=self.job, round=7)

    def _random_bytes(self):
        length = self.random.choice((self.random.randint(1, 59), self.random.randint(60, 300)))
        frame = bytearray(self.random.randrange(256) for _ in range(length))
        if length >= FRAME_HEADER_BYTES and self.random.random() < 0.5:
            # Random bytes that are addressed to the aggregator: the header checks see them.
            patch(frame, eth_type=0x0800, ip_ver_ihl=0x45, ip_proto=17, ip_dst=self.config.ip,
                  udp_dport=self.config.port)
        return bytes(frame)


def clean_round(model, traffic, seed):
    """One clique per slot that completes whatever state the slot is in: a free or completed slot is
    claimed, an unfinished one is reclaimed by a newer round of its job. Returns the frames."""
    rnd = random.Random(seed)
    frames = []
    for index, slot in enumerate(model.slots):
        job, round_ = (slot.key[0], (slot.key[1] + 1) & 0xFFFFFFFF) if slot.key else (77, 1)
        fanin = rnd.randint(1, min(4, model.config.max_fanin))
        count = rnd.randint(1, min(model.config.max_elements, 16))
        frames += traffic.clique(count, fanin, slot=index, job=job, round=round_, clique=9, chunk=0,
                                 group=0xEF_77_00_00 + index)
    return frames
