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

Given the registered jobs the aggregator holds (`fuzz_jobs`, installed by the caller), the stream adds version 3
traffic: cliques of each job from its members' addresses within its quota, with retransmissions, result
requests, and partials and results no route allows; and forgeries of recent ones: another or an unknown job, a
wrong token, a source that is no member (or another job's), a slot at or past the quota, another group, hops or
`expect` set, another opcode or version (a version 1 or 2 frame in a job's range). The mutations above (bit
flips, truncations, field limits, ...) take version 3 frames as their base too.
"""

import collections
import random

import numpy as np

from inwire.jobs import JobEntry, JobTable
from inwire.packets import build_frames, frame_field
from inwire.protocol import (
    AGGREGATION_FIELDS,
    ETHERNET_BYTES,
    FIELDS_BY_NAME,
    FRAME_HEADER_BYTES,
    INT32_MAX,
    INT32_MIN,
    IPV4_BYTES,
    JOB_VERSION,
    Opcode,
)
from inwire_hdl.cocotb.traffic import ABOVE_IP, BELOW_IP, HOST_IP, Traffic, below, patch

MAX_FRAME = 1600
KINDS = ("good", "foreign", "request", "stats", "bit_flip", "truncate", "extend", "field_limit",
         "count_limit", "element_limit", "random_bytes", "forged_route", "stale_copy")
WEIGHTS = (30, 6, 5, 2, 14, 10, 8, 16, 2, 5, 4, 3, 4)
JOB_KINDS = ("job_good", "job_forged")
JOB_WEIGHTS = (20, 14)
"""Added to KINDS when the aggregator holds registered jobs."""
RECENT = 64
"""Well-formed frames remembered for forged hops and delayed copies."""
STRANGER_IP = HOST_IP + 0x10
"""An address no job's member sends from."""
CHECKED_FIELDS = ("ip_ver_ihl", "ip_frag", "ip_len", "ip_proto", "udp_dport", "udp_len", "eth_type") + tuple(
    field.name for field in AGGREGATION_FIELDS if field.name not in ("reserved", "bitmap", "contributors"))


class Mutator:
    """`frames(n)` yields (kind, frame) pairs for `config`, from `seed`. `jobs`: the registered jobs the
    aggregator holds, installed in this order on empty tables (so that their slot ranges are the ones the
    Mutator's own table gives them)."""

    def __init__(self, config, seed=0, jobs=()):
        self.config = config
        self.jobs = tuple(jobs)
        """The registered jobs the aggregator holds (`fuzz_jobs`): version 3 traffic is theirs."""
        self.kinds, self.weights = (KINDS + JOB_KINDS, WEIGHTS + JOB_WEIGHTS) if self.jobs else (KINDS, WEIGHTS)
        self.random = random.Random(seed)
        self.traffic = Traffic(config, seed)
        self.pending = []
        self.job = 1 + self.random.randrange(4)
        self.rounds = [1] * config.slots
        self.cliques = [0] * config.slots
        self.chunks = [0] * config.slots
        self.recent = collections.deque(maxlen=RECENT)
        self.job_pending = []
        self.job_recent = collections.deque(maxlen=RECENT)
        self.job_rounds = collections.defaultdict(int)
        held = JobTable(config.slots, config.limits)
        for entry in self.jobs:
            held.install(entry)
        self.free_slots = [slot for slot in range(config.slots) if not held.holds(slot)] if self.jobs else []

    def frames(self, count):
        if count:
            # A clique of one on an empty slot: claimed and completed by one frame.
            count -= 1
            yield "good", self.traffic.contribution(self.traffic.elements(3), fanin=1, slot=0, job=self.job,
                                                    round=self.rounds[0])
        for _ in range(count):
            kind = self.random.choices(self.kinds, self.weights)[0]
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
            if self.free_slots and rnd.random() < 0.8:
                # Mostly beside the registered jobs' ranges, where versions 1 and 2 are dropped.
                slot = rnd.choice(self.free_slots)
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
        makers = (self._good, self._good, self._request, self._foreign) + ((self._job_good,) * 2 if self.jobs else ())
        return bytearray(self.random.choice(makers)())

    # Version 3: the registered jobs' traffic, and forgeries of it.
    def _job_good(self):
        if not self.job_pending:
            self.job_pending = self._job_clique(self.random.choice(self.jobs))
        frame = self.job_pending.pop()
        self.job_recent.append(frame)
        return frame

    def _job_clique(self, entry):
        """A clique of `entry` on a slot of its quota, each member index sending from one of the job's members
        (several indices may share one); some retransmit, some ask for the result, and now and then a member
        sends a partial or a result, which no route of the job allows."""
        rnd, cfg, traffic = self.random, self.config, self.traffic
        members = sorted(entry.members)
        fanin = rnd.randint(1, min(cfg.max_fanin, 5))
        count = rnd.randint(1, min(cfg.max_elements, 24))
        slot = rnd.randrange(entry.slots)
        self.job_rounds[entry.job, slot] += 1
        round_ = self.job_rounds[entry.job, slot]
        if rnd.random() < 0.1:
            round_ = (round_ - 2) & 0xFFFFFFFF
        fields = dict(version=JOB_VERSION, job=entry.job, token=entry.token, group=entry.group, slot=slot,
                      round=round_, clique=rnd.randrange(2), chunk=rnd.randrange(2) * count, fanin=fanin,
                      exponent=rnd.randint(-4, 4))

        def source(sender):
            address, port = members[sender % len(members)]
            return dict(ip_src=address, udp_sport=port)

        vectors = [traffic.elements(count) for _ in range(fanin)]
        if rnd.random() < 0.1:
            vectors = [traffic.elements(count, 2**30, INT32_MAX) * rnd.choice((1, -1)) for _ in range(fanin)]
        frames = [traffic.contribution(vectors[s], sender=s, **source(s), **fields) for s in range(fanin)]
        extra = [rnd.choice(frames) for _ in range(rnd.randrange(2))]
        asker = rnd.randrange(fanin)
        if rnd.random() < 0.3:
            extra.append(traffic.request(count=count, sender=asker, **source(asker), **fields))
        if rnd.random() < 0.15:
            opcode = rnd.choice((Opcode.PARTIAL, Opcode.RESULT))
            header = traffic.header(**{**fields, "opcode": opcode}, bitmap=1 << asker, sender=asker, **source(asker))
            extra.append(bytes(build_frames(vectors[asker], status=0, **header)[0]))
        frames += extra
        rnd.shuffle(frames)
        return frames

    def _job_forged(self):
        """A recent version 3 frame with one thing its job's tables do not allow, or another opcode or version."""
        rnd = self.random
        frame = bytearray(rnd.choice(self.job_recent) if self.job_recent else self._job_good())
        job = frame_field(frame, "job") if len(frame) >= FRAME_HEADER_BYTES else 0
        entry = next((entry for entry in self.jobs if entry.job == job), self.jobs[0])
        others = [other for other in self.jobs if other.job != entry.job] or [entry]
        other = rnd.choice(others)
        members = sorted(entry.members)
        stranger_ports = sorted({port + 1000 for _, port in members})
        forged = rnd.choice((
            dict(job=other.job), dict(job=(entry.job + 1) & 0xFFFFFFFF), dict(job=rnd.randrange(1 << 32)),
            dict(job=other.job, token=other.token),
            dict(token=entry.token ^ 1 << rnd.randrange(64)), dict(token=0), dict(token=other.token),
            dict(udp_sport=rnd.choice(stranger_ports)), dict(ip_src=STRANGER_IP),
            dict(ip_src=members[0][0], udp_sport=rnd.choice(sorted(other.members))[1] + 1),
            dict(ip_src=rnd.choice(sorted(other.members))[0], udp_sport=rnd.choice(sorted(other.members))[1]),
            dict(slot=entry.slots), dict(slot=entry.slots + 1), dict(slot=self.config.slots), dict(slot=0xFFFF),
            dict(group=other.group), dict(group=entry.group + 1), dict(group=0),
            dict(hop1=ABOVE_IP), dict(hop2=ABOVE_IP), dict(expect=1), dict(hop1_expect=1), dict(hop2_expect=1),
            dict(opcode=rnd.choice((Opcode.RESULT, Opcode.PARTIAL, Opcode.RESULT_REQUEST, Opcode.STATS_REQUEST,
                                    Opcode.STATS_REPLY, 0, 7))),
            dict(version=rnd.choice((1, 2))), dict(version=rnd.choice((0, 4))),
        ))
        return bytes(patch(frame, **forged))

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


def fuzz_jobs(config, seed):
    """The registered jobs a fuzz run installs at an aggregator of `config` that holds job tables (none without):
    two jobs with a group each, of two quotas, members on a few ports of the host's address and one elsewhere;
    their tokens drawn from `seed`."""
    if not config.registered:
        return []
    rnd = random.Random(seed)
    return [JobEntry(job=0x5EED_F001, token=rnd.getrandbits(64) | 1, slots=min(3, config.slots),
                     members={(HOST_IP, 40001), (HOST_IP, 40002), (HOST_IP, 40003), (HOST_IP + 2, 40001)},
                     group=0xEF_F0_00_01),
            JobEntry(job=0x5EED_F002, token=rnd.getrandbits(64) | 1, slots=min(2, config.slots),
                     members={(HOST_IP, 40011), (HOST_IP + 3, 40012)}, group=0xEF_F0_00_02)]


def clean_round(model, traffic, seed):
    """One clique per slot that completes whatever state the slot is in: a free or completed slot is
    claimed, an unfinished one is reclaimed by a newer round of its job; a slot in a registered job's range
    by that job's members, in version 3. Returns the frames."""
    rnd = random.Random(seed)
    ranges = {model.jobs.bases[entry.job] + offset: (entry, offset) for entry in model.jobs
              for offset in range(entry.slots)}
    frames = []
    for index, slot in enumerate(model.slots):
        fanin = rnd.randint(1, min(4, model.config.max_fanin))
        count = rnd.randint(1, min(model.config.max_elements, 16))
        if index in ranges:
            entry, offset = ranges[index]
            members = sorted(entry.members)
            round_ = (slot.key[1] + 1) & 0xFFFFFFFF if slot.key else 1
            fields = dict(version=JOB_VERSION, job=entry.job, token=entry.token, group=entry.group, slot=offset,
                          round=round_, clique=9, chunk=0, fanin=fanin)
            sources = [members[sender % len(members)] for sender in range(fanin)]
            frames += [traffic.contribution(traffic.elements(count), sender=sender, ip_src=address, udp_sport=port,
                                            **fields) for sender, (address, port) in enumerate(sources)]
            continue
        job, round_ = (slot.key[0], (slot.key[1] + 1) & 0xFFFFFFFF) if slot.key else (77, 1)
        frames += traffic.clique(count, fanin, slot=index, job=job, round=round_, clique=9, chunk=0,
                                 group=0xEF_77_00_00 + index)
    return frames
