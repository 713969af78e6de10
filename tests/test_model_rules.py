"""Every rule of docs/protocol.md's "What the aggregator does with a frame", held against the golden model.

The reference here is written from that document's sentences, not from the model's code: a dict per slot
(owner, shape, members summed, sums, overflow flag, completion, lease stamp), the counters, the checks in
the document's order, and the frames the rules say go out. Random streams drive the model and the
reference side by side: every tree field random (levels with members 32-63, hops inside and outside the
upstream prefix, own address, the frame's source, nonzero hop levels), timers started just below 2**16
and crossing it (idle times of a whole wrap included), stale and newer rounds and chunks, version 1
frames with stray bytes in their tree fields, damaged frames. Where the aggregator holds job tables, most
frames are version 3 frames of registered jobs (a flat job, one with a group, one with tree routes):
from members, strangers, children and the parent, with wrong tokens, jobs, groups, slots beyond the quota,
results coming down once and again; the job rules are restated from the design of registered jobs (issue
36: tables decide level, route and sources; outputs only to table addresses). After every frame every counter must
equal the reference's and every output frame its bytes. Targeted cases pin what a stream reaches only
by chance, and a tampered model (one rule changed) shows that the comparison fails when a rule does.
"""

import dataclasses
import inspect
import random
import textwrap

import numpy as np
import pytest

from inwire import model
from inwire.jobs import CliqueRoute, JobEntry
from inwire.model import Aggregator, AggregatorConfig
from inwire.packets import build_frames
from inwire.protocol import COUNTERS, FIELDS_BY_NAME, FRAME_OFFSETS, Disposition

INT32_MIN, INT32_MAX = -2**31, 2**31 - 1
WRAP = 2**16
"""The lease timer and stamps are 16 bits wide."""
MASK32 = 2**32 - 1
CONTRIBUTION, RESULT, RESULT_REQUEST, STATS_REQUEST, STATS_REPLY, PARTIAL = 1, 2, 3, 4, 5, 6
"""The opcodes, as protocol.md's table numbers them."""

# A port other than the default, so that a reply or partial sent from or to the default port is caught.
OWN = AggregatorConfig(ip=0x0A_07_00_01, mac=0x02_00_00_07_00_01, gateway_mac=0x02_00_00_07_00_FE, port=0x4958,
                       slots=4, max_elements=6, lease=20)
UPSTREAM = [0x0A_07_00_02, 0x0A_07_00_03, 0x0A_07_00_FE]
"""Within OWN's default upstream prefix, 10.7.0.0/24."""
OUTSIDE = [0x0A_07_01_02, 0x0A_08_00_02, 0xC0_A8_00_01]
"""Outside 10.7.0.0/24; the first two inside 10.0.0.0/8."""
SOURCES = [0x0A_00_00_05, 0x0A_00_00_06, UPSTREAM[0]]
"""Where frames come from: two hosts and an aggregator that a route may also name (hop1 == source)."""
MEMBERS = [(SOURCES[0], 41000), (SOURCES[1], 41001), (SOURCES[1], 41002)]
"""Where registered jobs' members send from: two sockets share a host, so the port tells them apart."""
CHILDREN = [(0x0A_07_00_0B, 0x4958), (0x0A_07_00_0C, 0x4959)]
PARENT = (UPSTREAM[0], 0x4958)
STRANGERS = [(SOURCES[0], 41003), (0x0A_00_00_09, 41000), (SOURCES[1], 41000), PARENT, CHILDREN[0]]
"""Sources outside a job's members: another port of a member's host, a member's port on another host, a
member's port on the other member host, the parent and a child aggregator (members of no job)."""
JOBS = (
    JobEntry(job=7, token=0x0123_4567_89AB_CDEF, slots=2, members=MEMBERS, group=0),
    JobEntry(job=8, token=0xFEDC_BA98_7654_3210, slots=1, members={MEMBERS[0], MEMBERS[2]}, group=0xEF_00_00_08),
    JobEntry(job=2**32 - 1, token=2**64 - 1, slots=2, members=MEMBERS[1:], group=0, routes={
        0: CliqueRoute(level=0b0111, parent=PARENT, children={CHILDREN[0]: 0b0100}),
        1: CliqueRoute(children={CHILDREN[0]: 0b1100, CHILDREN[1]: 0b0010}),
        2: CliqueRoute(parent=PARENT)}),
)
"""Registered jobs: flat with unicast results (job 7 also the version 2 traffic's job), a group, and a tree:
clique 0 a level below PARENT with a child, clique 1 rooted here with two children, clique 2 all below PARENT."""
REGISTERED = dataclasses.replace(OWN, slots=8, registered=True)
"""Job ranges 0-1, 2 and 3-4; versions 1 and 2 have 5-7."""
CONFIGS = {
    "lease_20": OWN,
    "no_lease_upstream_8": dataclasses.replace(OWN, lease=0, upstream=(0x0A_00_00_00, 8), max_fanin=40),
    "lease_1_one_parent": dataclasses.replace(OWN, lease=1, upstream=(UPSTREAM[0], 32), slots=2),
    "registered_lease_20": REGISTERED,
    "registered_only_no_lease": dataclasses.replace(REGISTERED, slots=5, unregistered=False, lease=0, max_fanin=40),
}


def popcount(value):
    return bin(value).count("1")


# --- the reference, from docs/protocol.md -------------------------------------------------------------

class Reference:
    """What docs/protocol.md says an aggregator with `config` does (and, for version 3, the design of
    registered jobs); frames are given as the fields they were built from (`build`), the frame's bytes only
    for their length."""

    def __init__(self, config):
        self.config = config
        self.slots = {}
        self.counters = dict.fromkeys(COUNTERS, 0)
        self.now = 0
        self.jobs = {}
        """job id -> its tables: token, quota, first slot of its range, members, group, routes."""

    def install(self, entry):
        """Hold the tables of a new job (`entry`, a JobEntry, read as data); its range is the lowest run of
        `entry.slots` slots that no job holds, emptied. Returns the range's first slot."""
        held = {index for job in self.jobs.values() for index in range(job["base"], job["base"] + job["slots"])}
        base = next(first for first in range(self.config.slots - entry.slots + 1)
                    if not held & set(range(first, first + entry.slots)))
        routes = {clique: (route.level, route.parent, dict(route.children)) for clique, route in entry.routes.items()}
        self.jobs[entry.job] = dict(token=entry.token, slots=entry.slots, base=base, members=set(entry.members),
                                    group=entry.group, routes=routes)
        for index in range(base, base + entry.slots):
            self.slots.pop(index, None)  # a new job starts with empty slots, whatever used them while free
        return base

    def in_a_job(self, index):
        return any(job["base"] <= index < job["base"] + job["slots"] for job in self.jobs.values())

    def upstream(self, address):
        network, length = self.config.upstream or (self.config.ip & 0xFFFFFF00, 24)
        mask = MASK32 ^ ((1 << (32 - length)) - 1)
        return address & mask == network

    def expired(self, slot):
        lease = self.config.lease
        return lease != 0 and (self.now - slot["stamp"]) % WRAP >= lease

    def process(self, f, frame, now):
        """(disposition, expected outputs) of one frame; an output is bytes, or ("stats", the request's fields,
        the counters before it)."""
        if now is not None:
            self.now = now % WRAP
        disposition, outputs = self.decide(f, frame)
        self.counters[disposition.name.lower()] += 1
        self.counters["frames_in"] += 1
        return disposition, outputs

    def decide(self, f, frame):
        c, length, opcode = self.config, len(frame), f["opcode"]
        if length < 60:
            return Disposition.DROP_RUNT, []
        if f["eth_type"] != 0x0800 or f["ip_proto"] != 17 or f["ip_dst"] != c.ip or f["udp_dport"] != c.port:
            return Disposition.FORWARDED, [frame]
        if f["ip_ver_ihl"] != 0x45:
            return Disposition.DROP_IP_HEADER, []
        if f["ip_frag"] & 0x3FFF:
            return Disposition.DROP_IP_FRAGMENT, []
        if f.get("bad_checksum"):
            return Disposition.DROP_IP_CHECKSUM, []
        if length < 128:
            return Disposition.DROP_LENGTH, []
        v3 = f["version"] == 3
        if f["magic"] != 0x4957 or not (c.registered if v3 else f["version"] in (1, 2) and c.unregistered):
            return Disposition.DROP_VERSION, []
        if opcode not in (CONTRIBUTION, PARTIAL, RESULT_REQUEST, STATS_REQUEST) and not (v3 and opcode == RESULT):
            return Disposition.DROP_OPCODE, []
        count = f["count"]
        trailer = opcode in (PARTIAL, RESULT)
        expected = 128 if opcode in (RESULT_REQUEST, STATS_REQUEST) else 128 + 4 * count + 4 * trailer
        built = 128 + 4 * len(f["elements"]) + 4 * (f.get("status") is not None)
        if length != expected or built != expected:  # the IPv4 and UDP lengths say `built`
            return Disposition.DROP_LENGTH, []
        fanin, sender = f["fanin"], f["sender"]
        source = (f["ip_src"], f["udp_sport"])
        if v3:
            job = self.jobs.get(f["job"])
            if job is None:
                return Disposition.DROP_JOB, []
            if f.get("token", 0) != job["token"]:
                return Disposition.DROP_TOKEN, []
            own_level, parent, children = job["routes"].get(f["clique"], (0, None, {}))
            held = f["bitmap"] or 1 << sender
            if opcode == PARTIAL:
                allowed = source in children and held & ~children[source] == 0
            elif opcode == RESULT:
                allowed = parent is not None and source == parent
            else:
                allowed = source in job["members"]
            if not allowed:
                return Disposition.DROP_MEMBER, []
        if opcode == STATS_REQUEST:  # version 3: only its job's members are answered (the reply is larger)
            return Disposition.ANSWERED, [("stats", f, dict(self.counters))]
        if not 1 <= fanin <= c.max_fanin:
            return Disposition.DROP_FANIN, []
        whole = (1 << fanin) - 1
        if f["version"] == 1:  # read as version 2 with bitmap, expect and hops 0
            members, level, hop1, hop1_expect, hop2, hop2_expect = 1 << sender, whole, 0, 0, 0, 0
        else:  # version 3: the level is the clique's at this aggregator, and the frame names no route
            members, level = f["bitmap"] or 1 << sender, (own_level if v3 else f["expect"]) or whole
            hop1, hop1_expect, hop2, hop2_expect = f["hop1"], f["hop1_expect"], f["hop2"], f["hop2_expect"]
        if opcode == RESULT:  # coming down: it holds members of the whole clique, whatever this level is
            outside = members & ~whole
        else:
            outside = members & ~level or level & ~whole
        if sender >= fanin or outside:
            return Disposition.DROP_SENDER, []
        if not 1 <= count <= c.max_elements:
            return Disposition.DROP_COUNT, []
        if (f["group"] != job["group"]) if v3 else f["group"] >> 24 != 239:
            return Disposition.DROP_GROUP, []
        if f["slot"] >= (job["slots"] if v3 else c.slots) or not v3 and self.in_a_job(f["slot"]):
            return Disposition.DROP_SLOT, []
        if v3:
            refused = bool(f["expect"] or hop1 or hop1_expect or hop2 or hop2_expect)
        elif hop1:
            refused = (hop1 in (c.ip, f["ip_src"]) or not self.upstream(hop1) or hop2 in (hop1, c.ip))
        else:
            refused = hop2 != 0
        if refused:
            return Disposition.DROP_ROUTE, []
        route = (hop1, hop1_expect, hop2, hop2_expect)
        key = (f["job"], f["round"], f["clique"], f["chunk"])
        index = job["base"] + f["slot"] if v3 else f["slot"]
        slot = self.slots.get(index)
        owner = slot and slot["owner"]
        if opcode == RESULT:
            if not (slot and slot["complete"] and owner == key):
                return Disposition.DROP_NO_RESULT, []
            if (slot["shape"][0], slot["shape"][2], slot["shape"][3]) != (fanin, count, f["exponent"]):
                return Disposition.DROP_MISMATCH, []
            if slot["final"]:
                return Disposition.DROP_DUPLICATE, []
            slot.update(sums=list(f["elements"]), members=members, overflow=bool(f["status"] & 1), final=True)
            return Disposition.RELAYED, self.down(f, job, slot, relayed=True)
        if opcode == RESULT_REQUEST:
            if slot and slot["complete"] and owner == key:
                if not v3:
                    return Disposition.ANSWERED, [self.output(f, route, slot)]
                if parent is None or slot["final"]:
                    return Disposition.ANSWERED, [self.job_output(f, job, slot, RESULT, source)]
            return Disposition.DROP_NO_RESULT, []
        shape = (fanin, f["group"], count, f["exponent"], level)
        if owner == key:
            if slot["shape"] != shape:
                return Disposition.DROP_MISMATCH, []
            if slot["complete"]:
                if not v3:
                    return Disposition.ANSWERED, [self.output(f, route, slot)]
                if parent is not None and not slot["final"]:  # noted: the result that comes down answers it
                    if opcode == PARTIAL:
                        slot["asked_children"] |= {source} & slot["children"]
                    elif sender in slot["sources"]:
                        slot["asked"] |= 1 << sender
                    return Disposition.ANSWERED, [self.job_output(f, job, slot, PARTIAL, parent)]
                return Disposition.ANSWERED, [self.job_output(f, job, slot, RESULT, source)]
            if slot["members"] & members:
                return Disposition.DROP_DUPLICATE, []
        elif slot:
            if older(key, owner) and not self.expired(slot):
                return Disposition.DROP_STALE, []
            if not slot["complete"]:
                if f["job"] == owner[0] and newer(f["round"], owner[1]):
                    self.counters["slots_reclaimed"] += 1
                elif self.expired(slot):
                    self.counters["leases_expired"] += 1
                else:
                    return Disposition.DROP_COLLISION, []
            slot = None
        if slot is None:
            slot = self.slots[index] = dict(owner=key, shape=shape, members=0, sums=[0] * count, overflow=False,
                                            complete=False, final=False, sources={}, children=set(), asked=0,
                                            asked_children=set())
        sums = [s + e for s, e in zip(slot["sums"], f["elements"], strict=True)]
        if any(not INT32_MIN <= s <= INT32_MAX for s in sums):
            self.counters["saturations"] += 1
            slot["overflow"] = True
        if opcode == PARTIAL and f["status"] & 1:
            slot["overflow"] = True
        slot["sums"] = [min(max(s, INT32_MIN), INT32_MAX) for s in sums]
        slot["members"] |= members
        slot["stamp"] = self.now
        if v3 and opcode == PARTIAL:
            slot["children"].add(source)
        elif v3:
            slot["sources"][sender] = source
        if slot["members"] != level:
            return Disposition.ACCUMULATED, []
        slot["complete"] = True
        if not v3:
            return Disposition.ACCUMULATED, [self.output(f, route, slot)]
        if parent is not None:
            return Disposition.ACCUMULATED, [self.job_output(f, job, slot, PARTIAL, parent)]
        return Disposition.ACCUMULATED, self.down(f, job, slot)

    def down(self, f, job, slot, relayed=False):
        """A version 3 result going down from here: from the root, to the job's group; else one copy to each
        member index's source (by index; an address that several indices sent from only once, at its first)
        and to each child whose partial was summed (in address order). With a group the root sent it to the
        group, so a result relayed from the parent goes only to those indices and children whose retransmission
        sent the partial up again."""
        if job["group"] and not relayed:
            return [self.job_output(f, job, slot, RESULT, (job["group"], self.config.port),
                                    eth_dst=0x01_00_5E_00_00_00 | job["group"] & 0x7FFFFF)]
        asked = slot["asked"] if job["group"] else ~0
        children = slot["asked_children"] if job["group"] else slot["children"]
        where = []
        for destination in ([slot["sources"][index] for index in sorted(slot["sources"]) if asked >> index & 1]
                            + sorted(children)):
            if destination not in where:
                where.append(destination)
        return [self.job_output(f, job, slot, RESULT, destination) for destination in where]

    def job_output(self, f, job, slot, opcode, destination, eth_dst=None):
        """A version 3 frame of the slot to `destination`, an address of the job's tables: the job's token and
        group, the asking frame's relative slot and sender, no route."""
        c = self.config
        fanin, group, count, exponent, _ = slot["shape"]
        job_id, round_, clique, chunk = slot["owner"]
        self.counters["partials_emitted" if opcode == PARTIAL else "results_emitted"] += 1
        return bytes(build_frames(
            np.array(slot["sums"], dtype=np.int64), status=1 if slot["overflow"] else 0, eth_src=c.mac,
            eth_dst=c.gateway_mac if eth_dst is None else eth_dst, ip_src=c.ip, ip_dst=destination[0],
            udp_sport=c.port, udp_dport=destination[1], version=3, opcode=opcode, sender=f["sender"], fanin=fanin,
            exponent=exponent, contributors=popcount(slot["members"]), job=job_id, round=round_, clique=clique,
            slot=f["slot"], chunk=chunk, group=job["group"], bitmap=slot["members"], token=job["token"])[0])

    def output(self, f, route, slot):
        """The completed slot's output for the asking frame `f`: a partial to its hop1 with its route moved
        up one level, or at the root the result to the group, tree fields 0."""
        c = self.config
        fanin, group, count, exponent, _ = slot["shape"]
        job, round_, clique, chunk = slot["owner"]
        hop1, hop1_expect, hop2, hop2_expect = route
        if hop1:
            self.counters["partials_emitted"] += 1
            where = dict(opcode=PARTIAL, eth_dst=c.gateway_mac, ip_dst=hop1, expect=hop1_expect, hop1=hop2,
                         hop1_expect=hop2_expect)
        else:
            self.counters["results_emitted"] += 1
            where = dict(opcode=RESULT, eth_dst=0x01_00_5E_00_00_00 | group & 0x7FFFFF, ip_dst=group)
        return bytes(build_frames(
            np.array(slot["sums"], dtype=np.int64), status=1 if slot["overflow"] else 0, eth_src=c.mac,
            ip_src=c.ip, udp_sport=c.port, udp_dport=c.port, version=f["version"], sender=f["sender"],
            fanin=fanin, exponent=exponent, contributors=popcount(slot["members"]), job=job, round=round_,
            clique=clique, slot=f["slot"], chunk=chunk, group=group, bitmap=slot["members"], **where)[0])


def newer(candidate, current):
    """32-bit serial-number order (RFC 1982): a distance of exactly 2**31 is neither newer nor older."""
    return 0 < (candidate - current) % 2**32 < 2**31


def older(key, owner):
    job, round_, clique, chunk = key
    if job != owner[0]:
        return False
    if round_ != owner[1]:
        return newer(owner[1], round_)
    return clique == owner[2] and chunk < owner[3]


# --- reading output frames by the protocol table --------------------------------------------------------

def field(frame, name):
    at = FRAME_OFFSETS[name]
    return int.from_bytes(frame[at:at + FIELDS_BY_NAME[name].nbytes], "big")


def header_fields(frame):
    return {name: field(frame, name) for name in FRAME_OFFSETS} if len(frame) >= 128 else {}


def checksum_ok(frame):
    words = sum(int.from_bytes(frame[at:at + 2], "big") for at in range(14, 34, 2))
    while words >> 16:
        words = (words & 0xFFFF) + (words >> 16)
    return words == 0xFFFF


def stats_reply_problems(reply, request, counters, config):
    """What is wrong with a stats reply to `request`: it goes back where the request came from, from the
    aggregator's addresses, in the request's version with its sender index, and holds the counters before
    it as uint32 elements in COUNTERS order. (protocol.md does not say what its other fields hold.)"""
    want = dict(eth_dst=request["eth_src"], eth_src=config.mac, ip_src=config.ip, ip_dst=request["ip_src"],
                udp_sport=config.port, udp_dport=request["udp_sport"], opcode=STATS_REPLY,
                version=request["version"], sender=request["sender"], count=len(COUNTERS),
                ip_len=len(reply) - 14, udp_len=len(reply) - 34)
    got = header_fields(reply)
    problems = [f"{name} {got.get(name)} != {value}" for name, value in want.items() if got.get(name) != value]
    elements = [int.from_bytes(reply[at:at + 4], "big") for at in range(128, len(reply), 4)]
    if elements != [counters[name] for name in COUNTERS]:
        problems.append(f"counters {elements} != {counters}")
    if not checksum_ok(reply):
        problems.append("IPv4 checksum")
    return problems


def output_problems(got, want):
    """Field by field, what differs between two frames (or their lengths and elements)."""
    if got == want:
        return []
    a, b = header_fields(got), header_fields(want)
    problems = [f"{name} {a.get(name)} != {b.get(name)}" for name in b if a.get(name) != b.get(name)]
    if got[128:] != want[128:] or len(got) != len(want):
        problems.append(f"elements/trailer {got[128:].hex()} != {want[128:].hex()}")
    return problems or [f"bytes {got.hex()} != {want.hex()}"]


def compare(aggregator, reference, frames):
    """Feed (fields, bytes, now) to both; the first frame where a counter or an output differs, else None."""
    for index, (f, frame, now) in enumerate(frames):
        got = aggregator.process(frame, now)
        disposition, want = reference.process(f, frame, now)
        where = f"frame {index} ({disposition.name.lower()}, now {now}, {describe(f)})"
        stats = aggregator.stats()
        if stats != reference.counters:
            moved = {n: (stats[n], reference.counters[n]) for n in COUNTERS if stats[n] != reference.counters[n]}
            return f"{where}: counters (model, reference) {moved}"
        if len(got) != len(want):
            return f"{where}: {len(got)} output frames, the rules say {len(want)}"
        for out, expected in zip(got, want, strict=True):
            if isinstance(expected, tuple):
                problems = stats_reply_problems(out, f, expected[2], reference.config)
            else:
                problems = output_problems(out, expected)
            if problems:
                return f"{where}: output {'; '.join(problems)[:600]}"
    return None


def describe(f):
    names = ("opcode", "version", "sender", "fanin", "job", "round", "clique", "chunk", "slot", "bitmap", "expect",
             "hop1", "hop1_expect", "hop2", "hop2_expect", "status", "token", "ip_src", "udp_sport")
    return " ".join(f"{name}={f[name]:#x}" if name.startswith(("bitmap", "expect", "hop", "token", "ip_src"))
                    else f"{name}={f[name]}" for name in names if f.get(name) is not None)


# --- frames ----------------------------------------------------------------------------------------------

def frame_fields(config, **fields):
    """A frame's fields: a version 2 frame to `config`'s aggregator, from a host, with `fields` on top."""
    base = dict(eth_dst=config.mac, eth_src=0x02_00_00_00_00_05, eth_type=0x0800, ip_ver_ihl=0x45, ip_frag=0,
                ip_proto=17, ip_src=SOURCES[0], ip_dst=config.ip, udp_sport=40000, udp_dport=config.port,
                magic=0x4957, version=2, status=None, bitmap=0, expect=0, hop1=0, hop1_expect=0, hop2=0,
                hop2_expect=0)
    fields = {**base, **fields}
    fields.setdefault("count", len(fields["elements"]))
    return fields


def build(f):
    """The frame's bytes: its fields, `count` as given (a request's names its slot's vector), and damage
    (`bad_checksum`, `cut` to a length, `pad` bytes)."""
    frame = bytearray(build_frames(np.array(f["elements"], dtype=np.int64), status=f.get("status"),
                                   **{name: f[name] for name in f if name in FIELDS_BY_NAME
                                      and name not in ("count", "ip_len", "ip_csum", "udp_len")})[0])
    at = FRAME_OFFSETS["count"]
    frame[at:at + 2] = f["count"].to_bytes(2, "big")
    if f.get("bad_checksum"):
        frame[FRAME_OFFSETS["ip_csum"]] ^= 0x5A
    if "cut" in f:
        del frame[f["cut"]:]
    return bytes(frame) + bytes(f.get("pad", 0))


# --- random traffic -------------------------------------------------------------------------------------

class Traffic:
    """Cliques and tree levels on few slots, interleaved, with trouble: frames as (fields, bytes, now)."""

    def __init__(self, seed, config, jobs=()):
        self.rnd = random.Random(seed)
        self.config = config
        self.jobs = list(jobs)
        """Registered jobs, whose frames (version 3) are most of the stream when there are any."""
        self.job_open, self.job_levels, self.job_history = [], [], []
        """As `open`, `levels` and `history`, for the jobs' levels; a part is (members, source)."""
        self.open = []
        """Levels still being sent: (fields shared by their frames, the parts not sent yet, the whole clique)."""
        self.levels = []
        """The fields of recent levels, finished or not, for result requests."""
        self.history = []
        self.owners = {}
        """The latest owner key started per slot index, from which the next one is made."""
        self.now = WRAP - self.rnd.randrange(1, 3 * max(config.lease, 2))

    def route(self):
        """(hop1, hop1_expect, hop2, hop2_expect): a root, one level or two below it, now and then a route
        that may not be taken; the levels are random and nonzero, also where no hop needs them."""
        rnd = self.rnd
        expects = [rnd.choice((0, rnd.getrandbits(64), rnd.getrandbits(64))) for _ in range(2)]
        pick = rnd.random()
        if pick < 0.35:
            hops = (0, 0)
        elif pick < 0.6:
            hops = (rnd.choice(UPSTREAM), 0)
        elif pick < 0.85:
            hop1 = rnd.choice(UPSTREAM)
            hops = (hop1, rnd.choice([a for a in UPSTREAM + OUTSIDE if a != hop1]))
        else:
            c = self.config
            hop1 = rnd.choice(UPSTREAM)
            hops = rnd.choice(((c.ip, 0), (rnd.choice(OUTSIDE), 0), (0, hop1), (hop1, hop1), (hop1, c.ip),
                               (rnd.choice(OUTSIDE), hop1)))
        return dict(hop1=hops[0], hop1_expect=expects[0], hop2=hops[1], hop2_expect=expects[1])

    def elements(self, count):
        rnd, pick = self.rnd, self.rnd.random()
        if pick < 0.3:
            return [rnd.choice((INT32_MAX, INT32_MIN, INT32_MAX - 1, INT32_MIN + 1, 0, 1, -1)) for _ in range(count)]
        if pick < 0.45:
            return [rnd.randrange(2**30, 2**31) * rnd.choice((1, -1)) for _ in range(count)]
        return [rnd.randrange(-1000, 1000) for _ in range(count)]

    def frame_fields(self, **fields):
        rnd = self.rnd
        return frame_fields(self.config, **{"eth_src": 0x02_00_00_00_00_00 | rnd.getrandbits(16),
                                            "ip_frag": rnd.choice((0, 0x4000)), "ip_src": rnd.choice(SOURCES),
                                            "udp_sport": rnd.randrange(1024, 65536), **fields})

    def next_owner(self, slot):
        """An owner key for `slot` related to the last one there: newer, older, half-way around, another
        job, clique or chunk, with round numbers that wrap at 2**32."""
        rnd = self.rnd
        job, round_, clique, chunk = self.owners.get(slot, (7, MASK32 - 1, 0, 0))
        pick = rnd.random()
        if pick < 0.45:
            round_ = (round_ + rnd.choice((1, 1, 1, 2, 2**31 - 1))) & MASK32
        elif pick < 0.55:
            round_ = (round_ - rnd.choice((1, 2, 2**31 - 1))) & MASK32
        elif pick < 0.6:
            round_ = (round_ + 2**31) & MASK32
        elif pick < 0.75:
            chunk = max(0, chunk + rnd.choice((-8, -1, 1, 8)))
        elif pick < 0.85:
            clique ^= 1
        else:
            job = rnd.choice((7, 8, 2**32 - 1))
        self.owners[slot] = (job, round_, clique, chunk)
        return self.owners[slot]

    def level(self):
        """A new level: fan-in up to 64, its members (high positions too) split into the frames that bring
        them, one owner key, one route."""
        rnd, c = self.rnd, self.config
        fanin = rnd.choice((1, 2, 3, 5, 8, 33, 40, 63, 64, rnd.randint(1, 64)))
        if fanin > c.max_fanin and rnd.random() < 0.9:
            fanin = rnd.randint(1, c.max_fanin)
        whole = (1 << fanin) - 1
        pick = rnd.random()
        if pick < 0.3:
            level, expect = whole, 0
        elif pick < 0.4:
            level = expect = whole
        elif pick < 0.55 and fanin > 32:
            level = expect = (rnd.getrandbits(fanin - 32) << 32) or 1 << (fanin - 1)
        else:
            level = expect = rnd.getrandbits(fanin) or 1 << rnd.randrange(fanin)
        count = rnd.choice((1, 2, rnd.randint(1, c.max_elements), c.max_elements))
        slot = c.slots if rnd.random() < 0.04 else rnd.randrange(c.slots)
        job, round_, clique, chunk = self.next_owner(slot)
        shared = dict(fanin=fanin, count=count, slot=slot, job=job, round=round_, clique=clique, chunk=chunk,
                      exponent=rnd.choice((0, -3, 7, -128, 127)), group=0xEF_00_00_00 | rnd.getrandbits(24),
                      expect=expect, **self.route())
        members = [m for m in range(fanin) if level >> m & 1]
        rnd.shuffle(members)
        parts = []
        while members:
            cut = rnd.randint(1, len(members))
            parts.append(members[:cut])
            members = members[cut:]
        self.levels = (self.levels + [shared])[-12:]
        self.open.append((shared, parts, whole))
        if len(self.open) > 4:
            self.open.pop(0)  # abandoned: its slot stays unfinished until a lease, a newer round or its turn

    def part(self, shared, part, whole):
        """The frame that brings `part`: a member's contribution (bitmap 0 or its bit; version 1 with stray
        tree bytes at a flat root), a contribution that holds several, or a partial with any status."""
        rnd = self.rnd
        fields = dict(shared, sender=rnd.choice(part), bitmap=sum(1 << m for m in part),
                      elements=self.elements(shared["count"]))
        if rnd.random() < 0.15:
            fields.update(self.route())  # frames of a level may disagree on the route: the asker's counts
        if len(part) == 1 and rnd.random() < 0.6:
            flat = shared["expect"] in (0, whole) and not shared["hop1"] and not shared["hop2"]
            if flat and rnd.random() < 0.4:
                fields.update(version=1, bitmap=rnd.getrandbits(64), expect=rnd.getrandbits(64),
                              hop1=rnd.choice((self.config.ip, rnd.getrandbits(32))), hop1_expect=rnd.getrandbits(64),
                              hop2=rnd.getrandbits(32), hop2_expect=rnd.getrandbits(64))
            elif rnd.random() < 0.5:
                fields["bitmap"] = 0
            return self.frame_fields(opcode=CONTRIBUTION, **fields)
        if rnd.random() < 0.25:
            return self.frame_fields(opcode=CONTRIBUTION, **fields)
        return self.frame_fields(opcode=PARTIAL, status=rnd.choice((0, 0, 1, 2, 3, 0xFFFFFFFE, 0x80000001)),
                                 **fields)

    def request(self):
        rnd = self.rnd
        shared = rnd.choice(self.levels)
        sender = rnd.randrange(shared["fanin"])
        fields = dict(shared, sender=sender, bitmap=rnd.choice((0, 0, 1 << sender, rnd.getrandbits(64))),
                      elements=[], version=rnd.choice((1, 2, 2)), opcode=RESULT_REQUEST)
        if rnd.random() < 0.5:
            fields.update(self.route())
        if rnd.random() < 0.1:
            fields["count"] = rnd.choice((0, shared["count"] + 1))
        return self.frame_fields(**fields)

    def trouble(self, f):
        """`f` changed in one way that a rule is about."""
        rnd = self.rnd
        f = dict(f)
        fanin, kind = f["fanin"], rnd.randrange(12)
        if kind == 0:  # another shape for the same owner
            name = rnd.choice(("fanin", "group", "count", "exponent", "expect"))
            if name == "count":
                f["count"] = max(1, f["count"] + rnd.choice((-1, 1)))
                f["elements"] = self.elements(f["count"]) if f["opcode"] != RESULT_REQUEST else []
            elif name == "fanin":
                f["fanin"] = rnd.randint(1, 64)
            else:
                f[name] = {"group": 0xEF_00_00_00 | rnd.getrandbits(24), "exponent": rnd.randrange(-128, 128),
                           "expect": rnd.getrandbits(fanin)}[name]
        elif kind == 1:  # a member outside the level, or not below the fan-in
            f["bitmap"] = f["bitmap"] | 1 << rnd.randrange(64)
        elif kind == 2 and fanin < 64:
            f["expect"] = (f["expect"] or (1 << fanin) - 1) | 1 << rnd.randrange(fanin, 64)
        elif kind == 3:
            f["sender"] = rnd.randrange(fanin, 256)
        elif kind == 4:
            f.update(self.route())
        elif kind in (5, 9):  # damage before the aggregation header is read
            damage = rnd.choice((dict(cut=rnd.randrange(0, 60)), dict(cut=rnd.randrange(60, 128)),
                                 dict(ip_dst=rnd.choice(UPSTREAM)), dict(udp_dport=OWN.port + 1),
                                 dict(eth_type=0x86DD), dict(ip_proto=6), dict(ip_ver_ihl=0x46),
                                 dict(ip_frag=rnd.choice((0x2000, 0x0001, 0x6000))), dict(bad_checksum=True)))
            f.update(damage)
        elif kind == 6:
            f.update(rnd.choice((dict(magic=0x4956), dict(version=rnd.choice((0, 3, 255))),
                                 dict(opcode=rnd.choice((0, RESULT, STATS_REPLY, 7, 255))))))
        elif kind == 7:  # lengths: one byte or the trailer too many or too few
            f.update(rnd.choice((dict(pad=rnd.choice((1, 4))), dict(cut=128 + 4 * len(f["elements"]) - 1),
                                 dict(status=None if f.get("status") is not None else 0))))
        elif kind == 8:
            f.update(rnd.choice((dict(fanin=0), dict(fanin=self.config.max_fanin + 1), dict(count=0, elements=[]),
                                 dict(group=rnd.getrandbits(32) & 0xEEFFFFFF), dict(slot=rnd.randrange(
                                     self.config.slots, 2**16)))))
        else:  # overlaps what the level has (or may have) summed
            f["bitmap"] = f["bitmap"] | 1 << rnd.randrange(fanin) if f["bitmap"] else 1 << f["sender"]
        return f

    def stats_request(self):
        rnd = self.rnd
        return self.frame_fields(opcode=STATS_REQUEST, version=rnd.choice((1, 2)), sender=rnd.randrange(256),
                                 job=rnd.getrandbits(32), fanin=rnd.randrange(256), count=rnd.randrange(2**16),
                                 slot=rnd.randrange(2**16), elements=[])

    def next_fields(self):
        rnd, pick = self.rnd, self.rnd.random()
        if self.jobs and rnd.random() < 0.75:
            return self.next_job_fields()
        if not self.open or pick < 0.08:
            self.level()
        if pick < 0.6:
            entry = rnd.choice(self.open)
            shared, parts, whole = entry
            f = self.part(shared, parts.pop(rnd.randrange(len(parts))), whole)
            if not parts:
                self.open.remove(entry)
            self.history = (self.history + [f])[-40:]
            return f
        if pick < 0.72 and self.history:
            return rnd.choice(self.history)  # a retransmission, or a delayed copy of a frame long past
        if pick < 0.8:
            return self.request()
        if pick < 0.83:
            return self.stats_request()
        return self.trouble(rnd.choice(self.history) if self.history else self.request())

    # Registered jobs (version 3): the tables decide level, route and sources; the frames name none of them.

    def job_level(self):
        """A level of a registered job: a clique with a route (or a flat one), its members split among the
        frames that bring them: partials from the children that hold them, contributions from members."""
        rnd, c = self.rnd, self.config
        entry = rnd.choice(self.jobs)
        clique = rnd.choice([*entry.routes, 5])
        route = entry.route(clique)
        children = dict(route.children)
        lowest = max([route.level.bit_length()] + [held.bit_length() for held in children.values()] + [1])
        fanin = rnd.choice((lowest, lowest, lowest + 1, rnd.randint(lowest, 64)))
        if fanin > c.max_fanin:
            fanin = rnd.randint(min(lowest, c.max_fanin), c.max_fanin)
        whole = (1 << fanin) - 1
        level = route.level or whole
        count = rnd.choice((1, 2, rnd.randint(1, c.max_elements), c.max_elements))
        slot = entry.slots if rnd.random() < 0.03 else rnd.randrange(entry.slots)
        _, round_, _, chunk = self.next_owner(("job", entry.job, slot))
        shared = dict(version=3, token=entry.token, fanin=fanin, count=count, slot=slot, job=entry.job,
                      round=round_, clique=clique, chunk=chunk, exponent=rnd.choice((0, -3, 7, -128, 127)),
                      group=entry.group)
        remaining = level
        parts = []
        for child, held in rnd.sample(list(children.items()), len(children)):
            if held & remaining and rnd.random() < 0.8:
                parts.append(([m for m in range(64) if (held & remaining) >> m & 1], child))
                remaining &= ~held
        members = [m for m in range(fanin) if remaining >> m & 1]
        rnd.shuffle(members)
        while members:
            cut = rnd.choice((1, 1, rnd.randint(1, len(members))))
            parts.append((members[:cut], rnd.choice(sorted(entry.members))))
            members = members[cut:]
        rnd.shuffle(parts)
        self.job_levels = (self.job_levels + [(shared, route)])[-12:]
        self.job_open.append((shared, parts))
        if len(self.job_open) > 4:
            self.job_open.pop(0)

    def job_part(self, shared, part):
        rnd = self.rnd
        members, (address, port) = part
        fields = dict(shared, sender=rnd.choice(members), bitmap=sum(1 << m for m in members),
                      elements=self.elements(shared["count"]), ip_src=address, udp_sport=port)
        if (address, port) in CHILDREN:
            return self.frame_fields(opcode=PARTIAL, status=rnd.choice((0, 0, 1, 2, 0x80000001)), **fields)
        if len(members) == 1 and rnd.random() < 0.5:
            fields["bitmap"] = 0
        return self.frame_fields(opcode=CONTRIBUTION, **fields)

    def job_request(self):
        rnd = self.rnd
        shared, _ = rnd.choice(self.job_levels)
        entry = next(entry for entry in self.jobs if entry.job == shared["job"])
        sender = rnd.randrange(shared["fanin"])
        address, port = rnd.choice(sorted(entry.members) if rnd.random() < 0.8 else STRANGERS)
        return self.frame_fields(**dict(shared, opcode=RESULT_REQUEST, sender=sender, elements=[],
                                        bitmap=rnd.choice((0, 1 << sender)), ip_src=address, udp_sport=port))

    def job_stats_request(self):
        """A version 3 stats request: mostly of a job, with its token, from one of its members; now and then
        from a stranger, a child or the parent, or anything at all."""
        rnd = self.rnd
        f = dict(self.stats_request(), version=3, clique=rnd.choice((0, 5, rnd.randrange(2**16))))
        if rnd.random() < 0.2:
            return f
        entry = rnd.choice(self.jobs)
        source = rnd.choice(sorted(entry.members) if rnd.random() < 0.7 else STRANGERS + CHILDREN + [PARENT])
        return dict(f, job=entry.job, token=entry.token, ip_src=source[0], udp_sport=source[1])

    def parent_result(self):
        """A result coming down from the parent of a clique that has one (now and then from elsewhere, or to
        a clique rooted here): all the clique's members or some, any overflow flag."""
        rnd = self.rnd
        routed = [(shared, route) for shared, route in self.job_levels if route.parent is not None]
        shared, route = rnd.choice(routed if routed and rnd.random() < 0.9 else self.job_levels)
        whole = (1 << shared["fanin"]) - 1
        address, port = PARENT if rnd.random() < 0.85 else rnd.choice(STRANGERS + MEMBERS)
        return self.frame_fields(**dict(shared, opcode=RESULT, sender=rnd.randrange(shared["fanin"]),
                                        bitmap=rnd.choice((whole, whole, rnd.getrandbits(shared["fanin"]))),
                                        status=rnd.choice((0, 0, 1, 2)), elements=self.elements(shared["count"]),
                                        ip_src=address, udp_sport=port))

    def job_trouble(self, f):
        """A job's frame changed in one way a job rule is about, or in any way `trouble` changes frames."""
        rnd = self.rnd
        f = dict(f)
        kind = rnd.randrange(11)
        if kind == 0:
            f["token"] = rnd.choice((0, f["token"] ^ 1 << rnd.randrange(64), rnd.getrandbits(64)))
        elif kind == 1:
            f["job"] = rnd.choice((1, 9, rnd.getrandbits(32), *(entry.job for entry in self.jobs)))
        elif kind == 2:
            f["ip_src"], f["udp_sport"] = rnd.choice(STRANGERS + MEMBERS + CHILDREN)
        elif kind == 3:
            f["group"] = rnd.choice((0, 0xEF_00_00_08, 0xEF_00_00_09))
        elif kind == 4:
            f["slot"] = rnd.choice((1, 2, 3, rnd.randrange(2**16)))
        elif kind == 5:
            f[rnd.choice(("expect", "hop1", "hop1_expect", "hop2", "hop2_expect"))] = rnd.getrandbits(32) | 1
        elif kind == 6:
            f["bitmap"] = f["bitmap"] | 1 << rnd.randrange(f["fanin"])
        elif kind == 7:  # checked after the job's checks, and for a stats request not at all
            f["fanin"] = rnd.choice((0, self.config.max_fanin + 1))
        else:
            return self.trouble(f)
        return f

    def next_job_fields(self):
        rnd, pick = self.rnd, self.rnd.random()
        if not self.job_open or pick < 0.08:
            self.job_level()
        if pick < 0.5:
            entry = rnd.choice(self.job_open)
            shared, parts = entry
            f = self.job_part(shared, parts.pop(rnd.randrange(len(parts))))
            if not parts:
                self.job_open.remove(entry)
            self.job_history = (self.job_history + [f])[-40:]
            return f
        if pick < 0.62 and self.job_history:
            return rnd.choice(self.job_history)
        if pick < 0.7:
            return self.job_request()
        if pick < 0.8:
            f = self.parent_result()
            self.job_history = (self.job_history + [f])[-40:]
            return f
        if pick < 0.82:
            return self.job_stats_request()
        return self.job_trouble(rnd.choice(self.job_history) if self.job_history else self.job_request())

    def next_time(self):
        """Mostly a tick or two on, now and then about a lease, a whole wrap of the timer (± 2), or any
        time; sometimes no time given (no time passed). Times are absolute, so they run past 2**16."""
        rnd, pick, lease = self.rnd, self.rnd.random(), self.config.lease
        if pick < 0.1:
            return None
        if pick < 0.75:
            self.now += rnd.randrange(3)
        elif pick < 0.87:
            self.now += lease + rnd.choice((-1, 0, 1)) if lease else rnd.randrange(100)
        elif pick < 0.95:
            self.now += WRAP + rnd.randrange(-2, 3)
        else:
            self.now += rnd.randrange(WRAP)
        return self.now

    def frames(self, count):
        out = []
        for _ in range(count):
            f = self.next_fields()
            out.append((f, build(f), self.next_time()))
        return out


FRAMES = 2500
JOB_COUNTERS = {disposition.name.lower() for disposition in model.JOB_DISPOSITIONS}
REACHED = {name: set(COUNTERS) - ({"leases_expired"} if not config.lease else set())
           - (JOB_COUNTERS if not config.registered else set()) for name, config in CONFIGS.items()}
"""Counters each stream must move: all of them, leases where there are leases, the job dispositions where
there are job tables."""


@pytest.mark.parametrize("name", list(CONFIGS))
def test_the_model_follows_the_rules_on_random_traffic(name):
    config = CONFIGS[name]
    jobs = JOBS if config.registered else ()
    frames = Traffic(seed=sorted(CONFIGS).index(name), config=config, jobs=jobs).frames(FRAMES)
    reference, aggregator = Reference(config), Aggregator(config)
    for entry in jobs:
        assert aggregator.install(entry) == reference.install(entry)
    assert compare(aggregator, reference, frames) is None
    reached = {counter for counter, value in reference.counters.items() if value}
    assert REACHED[name] <= reached, REACHED[name] - reached


# --- targeted cases -------------------------------------------------------------------------------------

def send(aggregator, now=None, **fields):
    """(disposition, outputs) of one frame built from `fields` on top of a clique of 4 at slot 1."""
    f = frame_fields(aggregator.config, **{**LEAF, **fields})
    before = aggregator.stats()
    outputs = aggregator.process(build(f), now)
    moved = [d for d in Disposition if aggregator.stats()[d.name.lower()] != before[d.name.lower()]]
    assert len(moved) == 1
    return moved[0], outputs


LEAF = dict(opcode=CONTRIBUTION, fanin=4, sender=0, job=3, round=9, clique=1, slot=1, chunk=0,
            group=0xEF_01_02_03, elements=[0, 0])


def elements_of(frame):
    return [int.from_bytes(frame[at:at + 4], "big", signed=True) for at in range(128, len(frame) - 4, 4)]


def status_of(frame):
    return int.from_bytes(frame[-4:], "big")


def counts(aggregator, *names):
    return tuple(aggregator.stats()[name] for name in names)


def test_a_saturated_partial_that_completes_the_root_sets_the_flag_but_counts_no_saturation():
    """The completing frame is a partial whose level saturated below; nothing saturates here (a sum that
    reaches INT32_MAX exactly is not beyond it). The result carries the flag, stored answers too."""
    root = Aggregator(OWN)
    for member in (0, 1):
        assert send(root, sender=member, elements=[5, -5]) == (Disposition.ACCUMULATED, [])
    disposition, (result,) = send(root, opcode=PARTIAL, sender=2, bitmap=0b1100, status=1,
                                  elements=[INT32_MAX - 10, 7])
    assert disposition == Disposition.ACCUMULATED
    assert (field(result, "opcode"), field(result, "bitmap"), field(result, "contributors")) == (RESULT, 0b1111, 4)
    assert elements_of(result) == [INT32_MAX, -3] and status_of(result) == 1
    assert counts(root, "saturations", "results_emitted") == (0, 1)
    disposition, (again,) = send(root, sender=3)
    assert disposition == Disposition.ANSWERED and status_of(again) == 1
    # Bit 1 of a partial's status is not the overflow flag; a partial that saturates here counts.
    for slot, status, first, flag, saturations in ((2, 2, 5, 0, 0), (3, 0, INT32_MIN, 1, 1)):
        send(root, slot=slot, sender=0, elements=[first, 0])
        send(root, slot=slot, sender=1, elements=[0, 0])
        (_, (result,)) = send(root, opcode=PARTIAL, slot=slot, sender=2, bitmap=0b1100, status=status,
                              elements=[-1, 0])
        assert status_of(result) == flag and counts(root, "saturations") == (saturations,)


def test_partials_emitted_counts_every_partial_sent_again():
    """A child's stored partial goes up again for each retransmission and result request that names a
    hop1, with the asker's route moved up; a request without one gets the result at the group."""
    child = Aggregator(OWN)
    route = dict(expect=0b0011, hop1=UPSTREAM[0], hop1_expect=0b0111, hop2=OUTSIDE[0], hop2_expect=0xF0F0)
    names = ("partials_emitted", "results_emitted", "answered")
    assert send(child, sender=0, **route) == (Disposition.ACCUMULATED, [])
    _, (partial,) = send(child, sender=1, elements=[1, 2], **route)
    moved_up = dict(opcode=PARTIAL, ip_dst=UPSTREAM[0], eth_dst=OWN.gateway_mac, expect=0b0111, hop1=OUTSIDE[0],
                    hop1_expect=0xF0F0, hop2=0, hop2_expect=0, bitmap=0b0011, contributors=2, sender=1,
                    udp_sport=OWN.port, udp_dport=OWN.port, ip_src=OWN.ip, eth_src=OWN.mac)
    assert {name: field(partial, name) for name in moved_up} == moved_up and counts(child, *names) == (1, 0, 0)
    _, (again,) = send(child, sender=0, **route)
    assert again == partial[:46] + b"\0" + partial[47:] and counts(child, *names) == (2, 0, 1)
    request = dict(opcode=RESULT_REQUEST, sender=1, elements=[], count=2)
    assert send(child, **request, **route) == (Disposition.ANSWERED, [partial])
    assert counts(child, *names) == (3, 0, 2)
    _, (result,) = send(child, **request, expect=0b0011)
    assert (field(result, "opcode"), field(result, "ip_dst")) == (RESULT, LEAF["group"])
    assert counts(child, *names) == (3, 1, 3)
    _, (other,) = send(child, sender=1, expect=0b0011, hop1=UPSTREAM[2], hop1_expect=0x3)
    assert (field(other, "ip_dst"), field(other, "expect"), field(other, "hop1")) == (UPSTREAM[2], 0x3, 0)
    assert counts(child, *names) == (4, 1, 4)


def test_a_group_s_lower_level_relays_a_result_only_to_those_whose_retransmission_asked():
    """A job with a group and a tree: the root sends the result to the group, so a level below gets it only
    as the answer to its partial sent up again for a retransmission. The model follows the rules through
    the level, the retransmissions, the result (to the member and the child that asked, not to the group)
    and a second copy of it; after it a retransmission is answered to its source alone."""
    config = dataclasses.replace(REGISTERED, unregistered=False)
    entry = JobEntry(job=9, token=0x5A5A_0000_0000_0001, slots=1, members=MEMBERS, group=0xEF_00_00_09,
                     routes={0: CliqueRoute(level=0b0111, parent=PARENT, children={CHILDREN[0]: 0b0100})})
    reference, aggregator = Reference(config), Aggregator(config)
    assert aggregator.install(entry) == reference.install(entry)
    shared = dict(version=3, token=entry.token, job=entry.job, group=entry.group, fanin=4, round=3, clique=0, slot=0,
                  chunk=0, exponent=0, elements=[5, -7])

    def member(sender, source):
        return dict(shared, opcode=CONTRIBUTION, sender=sender, ip_src=source[0], udp_sport=source[1])

    child = dict(shared, opcode=PARTIAL, sender=2, bitmap=0b0100, status=0, ip_src=CHILDREN[0][0],
                 udp_sport=CHILDREN[0][1])
    result = dict(shared, opcode=RESULT, sender=3, bitmap=0b1111, status=0, elements=[20, -28], ip_src=PARENT[0],
                  udp_sport=PARENT[1])
    steps = [member(0, MEMBERS[0]), member(1, MEMBERS[1]), child, member(0, MEMBERS[0]), child, result, result,
             member(1, MEMBERS[1])]
    frames = [(f, build(f), None) for f in (frame_fields(config, **step) for step in steps)]
    assert compare(aggregator, reference, frames) is None
    assert counts(aggregator, "relayed", "drop_duplicate", "partials_emitted", "results_emitted") == (1, 1, 3, 3)


def test_members_32_to_63_are_summed_once_and_complete_their_level():
    """A level of the upper 32 members of a clique of 64 at a child, then the whole clique at its parent."""
    child, root = Aggregator(OWN), Aggregator(dataclasses.replace(OWN, ip=UPSTREAM[0]))
    upper = 0xFFFF_FFFF_0000_0000
    route = dict(fanin=64, expect=upper, hop1=UPSTREAM[0])
    assert send(child, sender=63, elements=[63, 1], **route) == (Disposition.ACCUMULATED, [])
    assert send(child, opcode=PARTIAL, sender=32, bitmap=0x0000_FFFF_0000_0000, status=0, elements=[1, 1],
                **route) == (Disposition.ACCUMULATED, [])
    assert send(child, sender=50, bitmap=1 << 40 | 1 << 62, elements=[9, 9], **route)[0] == Disposition.DROP_DUPLICATE
    assert send(child, sender=40, bitmap=1 << 31, **route)[0] == Disposition.DROP_SENDER
    _, (partial,) = send(child, sender=50, bitmap=0x7FFF_0000_0000_0000, elements=[2, 3], **route)
    assert (field(partial, "bitmap"), field(partial, "contributors"), field(partial, "expect")) == (upper, 32, 0)
    assert elements_of(partial) == [66, 5]
    assert root.process(partial) == []
    (result,) = root.process(build(frame_fields(root.config, **{**LEAF, "fanin": 64, "opcode": PARTIAL, "sender": 0,
                                                                "bitmap": 2**32 - 1, "status": 0,
                                                                "elements": [-66, 1]})))
    assert (field(result, "bitmap"), field(result, "contributors")) == (2**64 - 1, 64)
    assert elements_of(result) == [0, 6]
    # Member 63 is not below a fan-in of 63, as sender, as a member held, or in the level.
    for fields in (dict(sender=63), dict(bitmap=1 << 63), dict(expect=1 << 63 | 1)):
        assert send(child, fanin=63, slot=2, **fields)[0] == Disposition.DROP_SENDER


def test_leases_and_stale_frames_across_the_timer_wrap():
    """Idle time is the 16-bit difference of now and the stamp: a lease runs out across the wrap, and a
    slot idle for 2**16 + 3 ticks looks idle for 3. An aggregator never given a time counts from 0."""
    aggregator = Aggregator(dataclasses.replace(OWN, lease=16))
    names = ("drop_collision", "leases_expired", "drop_stale", "slots_reclaimed")
    stranger = dict(job=4, fanin=2)
    send(aggregator, fanin=2, now=WRAP - 6)
    assert send(aggregator, **stranger, now=WRAP + 9)[0] == Disposition.DROP_COLLISION
    assert send(aggregator, **stranger, now=WRAP + 10)[0] == Disposition.ACCUMULATED
    assert counts(aggregator, *names) == (1, 1, 0, 0)
    assert send(aggregator, fanin=2, now=2 * WRAP + 10 + 3)[0] == Disposition.DROP_COLLISION
    assert send(aggregator, fanin=2, now=3 * WRAP + 10 - 1)[0] == Disposition.ACCUMULATED
    assert counts(aggregator, *names) == (2, 2, 0, 0)
    # A completed slot refuses older rounds of its job for a lease, then anyone may claim it.
    send(aggregator, slot=2, fanin=1, round=9, now=WRAP - 1)
    assert send(aggregator, slot=2, fanin=1, round=8, now=WRAP + 14)[0] == Disposition.DROP_STALE
    assert send(aggregator, slot=2, fanin=1, round=8, now=WRAP + 15)[0] == Disposition.ACCUMULATED
    assert counts(aggregator, *names) == (2, 2, 1, 0)
    fresh = Aggregator(dataclasses.replace(OWN, lease=16))
    send(fresh, fanin=2)
    assert send(fresh, **stranger, now=15)[0] == Disposition.DROP_COLLISION
    assert send(fresh, **stranger, now=16)[0] == Disposition.ACCUMULATED
    # Times are any count of ticks (a free-running counter of any width): only their difference modulo
    # 2**16 counts, also across moduli a timer might wrongly wrap at (2**17, 3**16, 10**6 ms, 2**32).
    for wrap_at in (2**17, 3**16, 10**6, 2**32, 2**64):
        timed = Aggregator(dataclasses.replace(OWN, lease=16))
        send(timed, fanin=2, now=wrap_at - 6)
        assert send(timed, **stranger, now=wrap_at + 9)[0] == Disposition.DROP_COLLISION, wrap_at
        assert send(timed, **stranger, now=wrap_at + 10)[0] == Disposition.ACCUMULATED, wrap_at


def test_routes_are_checked_at_the_root_and_a_result_carries_no_route():
    """hop2 without hop1 is refused like any forbidden hop, and leaves the slot as it was; a result's tree
    fields are 0 whatever the completing frame's route levels held."""
    root = Aggregator(OWN)
    refused = [dict(hop2=UPSTREAM[1]), dict(hop1=OWN.ip), dict(hop1=SOURCES[0]), dict(hop1=OUTSIDE[0]),
               dict(hop1=UPSTREAM[0], hop2=UPSTREAM[0]), dict(hop1=UPSTREAM[0], hop2=OWN.ip)]
    for hops in refused:
        assert send(root, fanin=1, job=99, **hops) == (Disposition.DROP_ROUTE, []), hops
    send(root, sender=0, hop1_expect=5, hop2_expect=6)
    _, (result,) = send(root, fanin=1, job=99, slot=2, expect=1, hop1_expect=2**64 - 1, hop2_expect=7)
    assert [field(result, name) for name in ("expect", "hop1", "hop1_expect", "hop2", "hop2_expect")] == [0] * 5
    assert counts(root, "drop_collision", "accumulated") == (0, 2)
    # A hop2 outside the upstream prefix is the next aggregator's business, not this one's.
    _, (partial,) = send(root, fanin=1, slot=3, hop1=UPSTREAM[0], hop2=OUTSIDE[2])
    assert (field(partial, "ip_dst"), field(partial, "hop1")) == (UPSTREAM[0], OUTSIDE[2])


@pytest.mark.parametrize("upstream, inside, outside", [
    (None, [0x0A_07_00_00, 0x0A_07_00_FF], [0x0A_07_01_00, 0x0A_06_FF_FF]),
    ((0x0A_00_00_00, 8), [0x0A_FF_FF_FF, 0x0A_08_00_02], [0x0B_00_00_00, 0x09_FF_FF_FF]),
    ((UPSTREAM[1], 32), [UPSTREAM[1]], [UPSTREAM[1] - 1, UPSTREAM[1] + 1]),
    ((0, 0), [0x01_02_03_04, 0xFF_FF_FF_FE], []),
])
def test_the_upstream_prefix_bounds_where_partials_go(upstream, inside, outside):
    aggregator = Aggregator(dataclasses.replace(OWN, upstream=upstream))
    for slot, hop1 in enumerate(inside + outside):
        want = Disposition.ACCUMULATED if hop1 in inside else Disposition.DROP_ROUTE
        assert send(aggregator, fanin=1, slot=slot % OWN.slots, hop1=hop1)[0] == want, hex(hop1)


@pytest.mark.parametrize("name, allowed, refused", [
    ("ip", (0, 2**32 - 1), (-1, 2**32)), ("port", (1, 2**16 - 1), (0, 2**16)), ("slots", (1, 2**16), (0, 2**16 + 1)),
    ("max_elements", (1, 16_354), (0, 16_355)), ("max_fanin", (1, 64), (0, 65)), ("lease", (0, WRAP - 1), (-1, WRAP)),
])
def test_the_configuration_takes_what_the_fields_hold(name, allowed, refused):
    """Each parameter fits the header field or timer it is compared with (the element count also the longest
    result IPv4 can carry, 16,354 elements, protocol.md), and a refusal names it."""
    for value in allowed:
        assert getattr(AggregatorConfig(**{name: value}), name) == value
    for value in refused:
        with pytest.raises(ValueError, match=f"aggregator {name} must lie in"):
            AggregatorConfig(**{name: value})
    with pytest.raises(TypeError, match=f"aggregator {name} must be an integer"):
        AggregatorConfig(**{name: 1.0})


def test_the_configuration_refuses_a_prefix_that_is_not_one():
    for upstream in ((0, 0), (0xFF_FF_FF_FF, 32), (0x0A_00_00_00, 8)):
        assert AggregatorConfig(upstream=upstream).upstream_prefix == upstream
    for upstream in ((0x0A_00_00_01, 24), (0x0A_00_00_00, 33), (0x0A_00_00_00, -1), (2**32, 0), (-1, 0)):
        with pytest.raises(ValueError, match="upstream must be"):
            AggregatorConfig(upstream=upstream)
    with pytest.raises(TypeError, match="a frame is bytes, got str"):
        Aggregator(OWN).process("frame")
    with pytest.raises(TypeError, match="arrival time is an integer count of ticks, got 1.5"):
        Aggregator(OWN).process(bytes(60), 1.5)


# --- a tampered model is caught -------------------------------------------------------------------------

def _replaced(function, *edits):
    """`function` (a model function or method) with pieces of its source replaced, (old, new) pairs: one
    rule changed."""
    source = textwrap.dedent(inspect.getsource(function))
    for old, new in zip(edits[::2], edits[1::2], strict=True):
        assert source.count(old) == 1, old
        source = source.replace(old, new)
    namespace = {}
    exec(compile(source, model.__file__, "exec"), vars(model), namespace)
    return namespace[function.__name__]


def _answers_count_no_partial(original):
    def contribution(self, header, elements, carried, source):
        before = self.counters["partials_emitted"]
        disposition, outputs = original(self, header, elements, carried, source)
        if disposition == Disposition.ANSWERED:
            self.counters["partials_emitted"] = before
        return disposition, outputs
    return contribution


def _stats_answered_before_the_job_checks():
    """FRAME_CHECKS with the stats request's answer moved up before DROP_JOB, as it was once."""
    checks = list(model.FRAME_CHECKS)
    stats = next(check for check in checks if check[0] == Disposition.ANSWERED)
    checks.remove(stats)
    checks.insert(next(i for i, check in enumerate(checks) if check[0] == Disposition.DROP_JOB), stats)
    return tuple(checks)


TAMPERS = {
    # name: (what is changed: (owner, attribute, replacement maker)), the check that must fail)
    "timer_17_bits": ((model, "TIME_BITS", lambda: 17), "streams"),
    "stale_ignores_the_lease": ((Aggregator, "_contribution", lambda: _replaced(
        Aggregator._contribution, "is_older(key, slot.key) and not self.lease_expired(slot)",
        "is_older(key, slot.key)")), "streams"),
    "later_chunk_is_stale": ((model, "is_older", lambda: _replaced(
        model.is_older, "clique == owner_clique and chunk < owner_chunk", "clique == owner_clique")), "streams"),
    "carried_overflow_counted_here": ((Aggregator, "_contribution", lambda: _replaced(
        Aggregator._contribution, "slot.overflow |= carried",
        "slot.overflow |= carried\n    self.counters['saturations'] += bool(carried) and not saturated.any()")),
        "test_a_saturated_partial_that_completes_the_root_sets_the_flag_but_counts_no_saturation"),
    "carried_overflow_lost_by_the_completing_frame": ((Aggregator, "_contribution", lambda: _replaced(
        Aggregator._contribution, "slot.overflow |= carried\n    ", "",
        "if slot.bitmap != slot.level:\n", "if slot.bitmap != slot.level:\n        slot.overflow |= carried\n")),
        "test_a_saturated_partial_that_completes_the_root_sets_the_flag_but_counts_no_saturation"),
    "answers_count_no_partial": ((Aggregator, "_contribution", lambda: _answers_count_no_partial(
        Aggregator._contribution)), "test_partials_emitted_counts_every_partial_sent_again"),
    "hop2_expect_not_moved_up": ((Aggregator, "_output", lambda: _replaced(
        Aggregator._output, "hop1_expect=tree.hop2_expect", "hop1_expect=0")), "streams"),
    "source_not_checked": ((model, "_route_allowed", lambda: _replaced(
        model._route_allowed, "tree.hop1 != source and ", "")), "streams"),
    "hop2_at_the_root_not_checked": ((model, "_route_allowed", lambda: _replaced(
        model._route_allowed, "return not tree.hop2", "return True")),
        "test_routes_are_checked_at_the_root_and_a_result_carries_no_route"),
    "members_below_32_only": ((model, "tree_fields", lambda: _replaced(
        model.tree_fields, 'int(header["bitmap"]), int(header["expect"])',
        'int(header["bitmap"]) & 0xFFFFFFFF, int(header["expect"]) & 0xFFFFFFFF')),
        "test_members_32_to_63_are_summed_once_and_complete_their_level"),
    "version_1_hops_read": ((model, "tree_fields", lambda: _replaced(
        model.tree_fields, "clique_mask(fanin), 0, 0, 0, 0)", 'clique_mask(fanin), int(header["hop1"]), 0, 0, 0)')),
        "streams"),
    # Registered jobs.
    "token_not_compared": ((model, "FRAME_CHECKS", lambda: tuple(
        check for check in model.FRAME_CHECKS if check[0] != Disposition.DROP_TOKEN)), "job_streams"),
    "stats_answered_before_the_job_checks": ((model, "FRAME_CHECKS", _stats_answered_before_the_job_checks),
                                             "job_streams"),
    "contribution_from_anyone": ((Aggregator, "source_allowed", lambda: _replaced(
        Aggregator.source_allowed, "return source in self.job_of(header).members", "return True")), "job_streams"),
    "partial_from_a_child_holds_any_members": ((Aggregator, "source_allowed", lambda: _replaced(
        Aggregator.source_allowed, "return held is not None and tree_fields(header).members & ~held == 0",
        "return held is not None")), "job_streams"),
    "result_from_anyone": ((Aggregator, "source_allowed", lambda: _replaced(
        Aggregator.source_allowed, "return route.parent == source", "return True")), "job_streams"),
    "result_to_the_completing_frames_source": ((Aggregator, "_contribution", lambda: _replaced(
        Aggregator._contribution, "return Disposition.ACCUMULATED, self._down(header, slot)",
        "return Disposition.ACCUMULATED, [self._result_to(header, slot, source)]")), "job_streams"),
    "retransmission_answered_to_every_member": ((Aggregator, "_answer", lambda: _replaced(
        Aggregator._answer, "return [self._result_to(header, slot, source)]", "return self._down(header, slot)")),
        "job_streams"),
    "partial_again_after_the_result_came_down": ((Aggregator, "_answer", lambda: _replaced(
        Aggregator._answer, "if parent is not None and not slot.final:", "if parent is not None:")), "job_streams"),
    "relayed_to_the_group": ((Aggregator, "_relay", lambda: _replaced(
        Aggregator._relay, "self._down(header, slot, relayed=True)", "self._down(header, slot)")),
        "test_a_group_s_lower_level_relays_a_result_only_to_those_whose_retransmission_asked"),
    "relayed_to_every_member_here": ((Aggregator, "_down", lambda: _replaced(
        Aggregator._down, "if not entry.group or slot.asked >> index & 1", "")),
        "test_a_group_s_lower_level_relays_a_result_only_to_those_whose_retransmission_asked"),
    "relayed_every_time": ((Aggregator, "_relay", lambda: _replaced(
        Aggregator._relay, "if slot.final:\n        return Disposition.DROP_DUPLICATE, []\n", "")), "job_streams"),
    "request_below_the_root_answered_before_the_result": ((Aggregator, "_result_request", lambda: _replaced(
        Aggregator._result_request, "if self.route(header).parent is None or slot.final:", "if True:")), "job_streams"),
    "quota_not_checked": ((Aggregator, "slot_valid", lambda: _replaced(
        Aggregator.slot_valid, 'return int(header["slot"]) < self.job_of(header).slots',
        'return int(header["slot"]) < self.config.slots - self.jobs.bases[int(header["job"])]')), "job_streams"),
    "version_2_in_a_jobs_slots": ((Aggregator, "slot_valid", lambda: _replaced(
        Aggregator.slot_valid, ' and not self.jobs.holds(int(header["slot"]))', "")), "job_streams"),
    "group_of_a_job_not_checked": ((Aggregator, "group_valid", lambda: _replaced(
        Aggregator.group_valid, 'return int(header["group"]) == self.job_of(header).group', "return True")),
        "job_streams"),
    "job_level_from_the_frame": ((model, "tree_fields", lambda: _replaced(
        model.tree_fields, "route.resolved_level(fanin)", "clique_mask(fanin)")), "job_streams"),
}


def _streams(registered_only=False):
    for name, config in CONFIGS.items():
        if config.registered or not registered_only:
            test_the_model_follows_the_rules_on_random_traffic(name)


@pytest.mark.parametrize("tamper", list(TAMPERS))
def test_a_tampered_model_is_caught(monkeypatch, tamper):
    """Each rule changed in the model on its own makes the streams (those with job tables, for a job's rule)
    or the targeted case about it fail."""
    (owner, attribute, make), check = TAMPERS[tamper]
    monkeypatch.setattr(owner, attribute, make())
    with pytest.raises(AssertionError) as failure:
        if check in ("streams", "job_streams"):
            _streams(registered_only=check == "job_streams")
        else:
            globals()[check]()
    print(f"{tamper}: {str(failure.value).splitlines()[0][:300]}")
