"""Registered jobs (protocol version 3) on the golden model: each attack of issue 36, held off.

The aggregators hold job tables (`AggregatorConfig.registered`) and, unless a test says otherwise, take no
unregistered frames. Frames travel between aggregators and members by their IPv4 destination and UDP
port, as a network would carry them; every test states what must be true.
"""

import random
from collections import Counter, defaultdict
from dataclasses import replace

import numpy as np
import pytest

from inwire.jobs import CliqueRoute, JobEntry, JobLimits, JobTable, JobTableError
from inwire.model import Aggregator, AggregatorConfig
from inwire.packets import build_frames, ipv4_checksums
from inwire.protocol import (
    COUNTERS,
    FIELDS_BY_NAME,
    FRAME_HEADER_BYTES,
    FRAME_OFFSETS,
    JOB_VERSION,
    Disposition,
    Opcode,
)

PORT = 0x4957
CONFIG = AggregatorConfig(ip=0x0A_00_01_01, mac=0x02_00_00_01_01_01, port=PORT, slots=16, max_elements=8,
                          registered=True, unregistered=False)
HERE = (CONFIG.ip, CONFIG.port)
A, B, C, D = (0x0A_00_00_0A, 5000), (0x0A_00_00_0B, 5000), (0x0A_00_00_0C, 5001), (0x0A_00_00_0D, 5001)
STRANGER = (0x0A_00_00_66, 5000)
NEXT_DOOR = (A[0], A[1] + 1)
"""Another socket of a member's host: not a member."""
JOB = JobEntry(job=0x5EED_0001, token=0x1234_5678_9ABC_DEF0, slots=4, members={A, B})
OTHER = JobEntry(job=0x5EED_0002, token=0x0FED_CBA9_8765_4321, slots=4, members={C, D})
GROUP = 0xEF_00_00_07


def frame(entry, source, opcode=Opcode.CONTRIBUTION, elements=(1, 2, 3), to=CONFIG, status=None, **fields):
    """A version 3 frame of `entry` from `source` to the aggregator `to`; a result request keeps the count of
    `elements` and carries none."""
    header = dict(eth_dst=to.mac, eth_src=0x02_00_00_00_00_99, ip_src=source[0], udp_sport=source[1], ip_dst=to.ip,
                  udp_dport=to.port, version=JOB_VERSION, opcode=opcode, token=entry.token, job=entry.job,
                  group=entry.group, fanin=2, sender=0, round=1, clique=0, slot=0, chunk=0)
    header.update(fields)
    if status is None and opcode in (Opcode.PARTIAL, Opcode.RESULT):
        status = 0
    data = bytearray(build_frames(np.asarray(elements, dtype=np.int64), status=status, **header)[0])
    if opcode != Opcode.RESULT_REQUEST:
        return bytes(data)
    data = data[:FRAME_HEADER_BYTES]
    for name, value in (("ip_len", FRAME_HEADER_BYTES - 14), ("udp_len", FRAME_HEADER_BYTES - 34)):
        data[FRAME_OFFSETS[name]:FRAME_OFFSETS[name] + 2] = value.to_bytes(2, "big")
    checksum = int(ipv4_checksums(np.frombuffer(bytes(data), dtype=np.uint8)[np.newaxis])[0])
    data[FRAME_OFFSETS["ip_csum"]:FRAME_OFFSETS["ip_csum"] + 2] = checksum.to_bytes(2, "big")
    return bytes(data)


def request(entry, source, **fields):
    return frame(entry, source, Opcode.RESULT_REQUEST, **fields)


def send(aggregator, data):
    """(the one disposition the frame got, the frames sent)."""
    before = aggregator.stats()
    outputs = aggregator.process(data)
    moved = [d for d in Disposition if aggregator.stats()[d.name.lower()] != before[d.name.lower()]]
    assert len(moved) == 1, moved
    return moved[0], outputs


def field(data, name):
    at = FRAME_OFFSETS[name]
    return int.from_bytes(data[at:at + FIELDS_BY_NAME[name].nbytes], "big")


def destination(data):
    return field(data, "ip_dst"), field(data, "udp_dport")


def source_of(data):
    return field(data, "ip_src"), field(data, "udp_sport")


def values(data):
    count = field(data, "count")
    return np.frombuffer(data, dtype=">i4", count=count, offset=FRAME_HEADER_BYTES).tolist()


def slots_state(aggregator, entry=None):
    """Everything a slot holds, for the aggregator's slots or (given `entry`) the job's range."""
    indices = range(len(aggregator.slots))
    if entry is not None:
        base = aggregator.jobs.bases[entry.job]
        indices = range(base, base + entry.slots)
    return [(s.key, s.fanin, s.group, s.count, s.exponent, s.level, s.bitmap, s.overflow, s.complete, s.stamp,
             s.sums.tolist(), dict(s.sources), set(s.children), s.final)
            for s in (aggregator.slots[index] for index in indices)]


def with_jobs(*entries, config=CONFIG):
    aggregator = Aggregator(config)
    for entry in entries:
        aggregator.install(entry)
    return aggregator


def completed(entry=JOB, **fields):
    """An aggregator holding `entry` whose slot 0 holds the sum of its two members A and B, [1, 2, 3] +
    [10, 20, 30]; the frames it sent."""
    aggregator = with_jobs(entry)
    assert send(aggregator, frame(entry, A, sender=0, **fields)) == (Disposition.ACCUMULATED, [])
    disposition, results = send(aggregator, frame(entry, B, sender=1, elements=(10, 20, 30), **fields))
    assert disposition == Disposition.ACCUMULATED
    return aggregator, results


# --- reading and injecting -------------------------------------------------------------------------------

def test_a_forged_result_request_from_a_non_member_gets_no_byte():
    """Reflection: a result request whose source is not a member of its job is answered with 0 bytes, with
    the right token (a member leaked it) as without, and counted: drop_member, drop_token, drop_job."""
    aggregator, _ = completed()
    forged = [(request(JOB, STRANGER), Disposition.DROP_MEMBER), (request(JOB, NEXT_DOOR), Disposition.DROP_MEMBER),
              (request(JOB, (A[0], A[1]), ip_src=STRANGER[0]), Disposition.DROP_MEMBER),
              (request(JOB, STRANGER, token=JOB.token ^ 1), Disposition.DROP_TOKEN),
              (request(JOB, STRANGER, job=JOB.job + 7), Disposition.DROP_JOB)]
    sent = 0
    for data, refused in forged:
        disposition, outputs = send(aggregator, data)
        assert disposition == refused
        sent += sum(len(output) for output in outputs)
    assert sent == 0
    assert (aggregator.stats()["drop_member"], aggregator.stats()["answered"]) == (3, 0)


def stats_request(entry, source, **fields):
    """A version 3 stats request of `entry` from `source`: the bare 128-byte header."""
    return frame(entry, source, Opcode.STATS_REQUEST, elements=(), **fields)


def test_a_forged_stats_request_from_a_non_member_gets_no_byte():
    """Amplification: a stats reply is larger than its request, so a version 3 one is answered only to a
    member of its job that names its token; a forged source (another host, another port of a member's host,
    a member's address with a stranger's port) gets nothing, and each is counted where it failed."""
    aggregator, _ = completed()
    forged = [(stats_request(JOB, STRANGER), Disposition.DROP_MEMBER),
              (stats_request(JOB, NEXT_DOOR), Disposition.DROP_MEMBER),
              (stats_request(JOB, (A[0], STRANGER[1] + 1)), Disposition.DROP_MEMBER),
              (stats_request(JOB, A, token=JOB.token ^ 1), Disposition.DROP_TOKEN),
              (stats_request(JOB, A, job=JOB.job + 7), Disposition.DROP_JOB)]
    for data, refused in forged:
        assert send(aggregator, data) == (refused, [])
    disposition, (reply,) = send(aggregator, stats_request(JOB, B))
    assert disposition == Disposition.ANSWERED and destination(reply) == B
    assert len(reply) == FRAME_HEADER_BYTES + 4 * len(COUNTERS)
    assert values(reply)[COUNTERS.index("drop_member")] == 3


@pytest.mark.parametrize("group", [0, GROUP])
def test_a_result_request_from_a_member_is_answered_to_that_member_alone(group):
    """Each member that asks gets one unicast copy at its own address, with the job's token: never the
    group, never the other member, once per request."""
    entry = JobEntry(job=JOB.job, token=JOB.token, slots=JOB.slots, members=JOB.members, group=group)
    aggregator, _ = completed(entry)
    for member in (A, B, A):
        disposition, outputs = send(aggregator, request(entry, member, sender=1))
        assert disposition == Disposition.ANSWERED and len(outputs) == 1
        (answer,) = outputs
        assert destination(answer) == member and field(answer, "eth_dst") == CONFIG.gateway_mac
        assert (field(answer, "opcode"), field(answer, "token"), field(answer, "job")) == (Opcode.RESULT, entry.token,
                                                                                          entry.job)
        assert values(answer) == [11, 22, 33] and source_of(answer) == HERE


def test_injection_by_a_non_member_or_with_a_wrong_token_changes_no_slot():
    """A contribution, partial or result from outside the job's tables, or with a wrong token, changes no
    slot and sends nothing; the sums of the real members come out exact."""
    aggregator = with_jobs(JOB)
    send(aggregator, frame(JOB, A, sender=0))
    before = slots_state(aggregator)
    attacks = [
        (frame(JOB, STRANGER, sender=1, elements=(1000, 1000, 1000)), Disposition.DROP_MEMBER),
        (frame(JOB, NEXT_DOOR, sender=1, elements=(1000, 1000, 1000)), Disposition.DROP_MEMBER),
        (frame(JOB, B, sender=1, token=JOB.token ^ 1 << 63, elements=(1000, 1000, 1000)), Disposition.DROP_TOKEN),
        (frame(JOB, B, sender=1, token=0), Disposition.DROP_TOKEN),
        (frame(JOB, STRANGER, Opcode.PARTIAL, sender=1, bitmap=0b10), Disposition.DROP_MEMBER),
        (frame(JOB, B, Opcode.PARTIAL, sender=1, bitmap=0b10), Disposition.DROP_MEMBER),
        (frame(JOB, STRANGER, Opcode.RESULT, bitmap=0b11, elements=(7, 7, 7)), Disposition.DROP_MEMBER),
        (frame(JOB, A, Opcode.RESULT, bitmap=0b11, elements=(7, 7, 7)), Disposition.DROP_MEMBER),
        (frame(OTHER, B, sender=1), Disposition.DROP_JOB),
    ]
    for data, refused in attacks:
        assert send(aggregator, data) == (refused, [])
        assert slots_state(aggregator) == before
    disposition, results = send(aggregator, frame(JOB, B, sender=1, elements=(10, 20, 30)))
    assert disposition == Disposition.ACCUMULATED
    assert sorted(destination(result) for result in results) == sorted([A, B])
    assert all(values(result) == [11, 22, 33] for result in results)


def test_two_jobs_on_one_aggregator_never_share_a_slot():
    """Two jobs naming the same slots, rounds, cliques and chunks hold ranges of their own: each completes
    with its own members' sums, sent to its own members, and neither's frames change the other's slots; a
    member of one job naming the other's job id with its own token is refused."""
    aggregator = with_jobs(JOB, OTHER)
    assert aggregator.jobs.bases[JOB.job] != aggregator.jobs.bases[OTHER.job]
    results = defaultdict(list)
    for slot in range(JOB.slots):
        for entry, member, sender, elements in ((JOB, A, 0, (1, 2, 3)), (OTHER, C, 0, (100, 200, 300)),
                                                (JOB, B, 1, (10, 20, 30)), (OTHER, D, 1, (1000, 2000, 3000))):
            other = OTHER if entry is JOB else JOB
            untouched = slots_state(aggregator, other)
            disposition, outputs = send(aggregator, frame(entry, member, sender=sender, slot=slot, round=5,
                                                          elements=elements))
            assert disposition == Disposition.ACCUMULATED
            assert slots_state(aggregator, other) == untouched
            results[entry.job] += outputs
        crossed = frame(OTHER, C, sender=1, slot=slot, round=6, token=JOB.token, job=OTHER.job)
        assert send(aggregator, frame(JOB, C, sender=1, slot=slot, round=6, token=OTHER.token)) == (
            Disposition.DROP_TOKEN, [])
        assert send(aggregator, crossed) == (Disposition.DROP_TOKEN, [])
    assert Counter(destination(r) for r in results[JOB.job]) == {A: JOB.slots, B: JOB.slots}
    assert Counter(destination(r) for r in results[OTHER.job]) == {C: OTHER.slots, D: OTHER.slots}
    assert all(values(r) == [11, 22, 33] and field(r, "token") == JOB.token for r in results[JOB.job])
    assert all(values(r) == [1100, 2200, 3300] and field(r, "token") == OTHER.token for r in results[OTHER.job])
    assert aggregator.stats()["drop_collision"] == aggregator.stats()["drop_stale"] == 0


def test_a_job_cannot_use_a_slot_beyond_its_quota():
    """A job's frames name slots 0 to quota - 1 of its own range; any other is refused and changes nothing,
    least of all the next job's range."""
    small = JobEntry(job=0x5EED_0003, token=3, slots=2, members={A, B})
    aggregator = with_jobs(small, OTHER)
    assert (aggregator.jobs.bases[small.job], aggregator.jobs.bases[OTHER.job]) == (0, 2)
    before = slots_state(aggregator)
    for slot in (2, 3, 5, CONFIG.slots - 1, CONFIG.slots, 2**16 - 1):
        assert send(aggregator, frame(small, A, slot=slot, fanin=1)) == (Disposition.DROP_SLOT, []), slot
    assert slots_state(aggregator) == before
    disposition, (result,) = send(aggregator, frame(small, A, slot=1, fanin=1))
    assert disposition == Disposition.ACCUMULATED and destination(result) == A


@pytest.mark.parametrize("unregistered", [False, True], ids=["registered_only", "unregistered_too"])
def test_a_flood_of_another_jobs_frames_does_not_disturb_a_round(unregistered):
    """300 frames from a member of another job, naming every slot and ever newer rounds: for its own job,
    for the victim's job id with its own token or a guessed one (from the victim member's spoofed address),
    and (where unregistered frames are taken) as version 2 frames of the victim's job id. The victim's round,
    started before the flood, is untouched by it and completes exact in every slot."""
    attacker = (0x0A_00_00_77, 6000)
    own = JobEntry(job=0x0BAD_0001, token=0xBAD, slots=4, members={attacker})
    aggregator = with_jobs(JOB, own, config=replace(CONFIG, unregistered=unregistered))
    for slot in range(JOB.slots):
        send(aggregator, frame(JOB, A, sender=0, slot=slot, round=10))
    victim = slots_state(aggregator, JOB)
    rnd = random.Random(1)
    ranges = set(range(JOB.slots + own.slots))
    for index in range(300):
        kind, slot, round_ = index % 4, index // 4 % CONFIG.slots, 11 + index
        if kind == 0:
            data = frame(own, attacker, slot=slot, round=round_, fanin=1)
            expected = Disposition.ACCUMULATED if slot < own.slots else Disposition.DROP_SLOT
        elif kind == 1:
            data = frame(JOB, attacker, slot=slot, round=round_, token=own.token, sender=1)
            expected = Disposition.DROP_TOKEN
        elif kind == 2:
            data = frame(JOB, A, slot=slot, round=round_, token=rnd.getrandbits(64), sender=1)
            expected = Disposition.DROP_TOKEN
        else:
            data = frame(JOB, A, slot=slot, round=round_, version=2, token=0, group=GROUP, sender=1)
            expected = (Disposition.DROP_VERSION if not unregistered else Disposition.DROP_SLOT if slot in ranges
                        else Disposition.ACCUMULATED)
        assert send(aggregator, data)[0] == expected
        assert slots_state(aggregator, JOB) == victim
    results = []
    for slot in range(JOB.slots):
        disposition, outputs = send(aggregator, frame(JOB, B, sender=1, slot=slot, round=10, elements=(10, 20, 30)))
        assert disposition == Disposition.ACCUMULATED
        results += outputs
    assert Counter(destination(r) for r in results) == {A: JOB.slots, B: JOB.slots}
    assert all(values(r) == [11, 22, 33] for r in results)


# --- trees --------------------------------------------------------------------------------------------

class Network:
    """Aggregators and members by (address, port): `run` carries frames until none is in flight, counts
    the frames on each (source, destination) pair and keeps what reaches each member."""

    def __init__(self, aggregators):
        self.aggregators = {(a.config.ip, a.config.port): a for a in aggregators}
        self.links = Counter()
        self.inbox = defaultdict(list)
        self.carried = []
        self.in_flight = []

    def send(self, data):
        self.in_flight.append(data)

    def run(self):
        while self.in_flight:
            data = self.in_flight.pop(0)
            link = (source_of(data), destination(data))
            self.links[link] += 1
            self.carried.append(data)
            if link[1] in self.aggregators:
                self.in_flight += self.aggregators[link[1]].process(data)
            else:
                self.inbox[link[1]].append(data)


DEPTH = 4
TREE_JOB = dict(job=0x7EE_0001, token=0x7EE_7EE_7EE_7EE, slots=2)


def chain(depth=DEPTH, group=0):
    """Aggregators 0 (the root) to depth - 1 in a chain; aggregator i has members 2i and 2i + 1 of a clique
    of 2 * depth and gathers them and those below it; the root's level is the whole clique (0). The job's
    results go to `group` (0: unicast copies)."""
    configs = [replace(CONFIG, ip=0x0A_00_10_01 + level, mac=0x02_00_00_10_00_01 + level)
               for level in range(depth)]
    endpoints = [(config.ip, config.port) for config in configs]
    members = [[(0x0A_00_20_00 + 16 * level + k, 7000 + k) for k in (0, 1)] for level in range(depth)]
    gathered = [sum(1 << m for m in range(2 * level, 2 * depth)) for level in range(depth)]
    aggregators = []
    for level, config in enumerate(configs):
        route = CliqueRoute(level=gathered[level] if level else 0,
                            parent=endpoints[level - 1] if level else None,
                            children={endpoints[level + 1]: gathered[level + 1]} if level + 1 < depth else {})
        aggregator = Aggregator(config)
        aggregator.install(JobEntry(members=set(members[level]), routes={0: route}, group=group, **TREE_JOB))
        aggregators.append(aggregator)
    return aggregators, endpoints, members


def contribution_to(config, member, sender, fanin, group=0, **fields):
    entry = JobEntry(members={member}, group=group, **TREE_JOB)
    return frame(entry, member, to=config, sender=sender, fanin=fanin, elements=(sender + 1, -10 * sender, 7),
                 **fields)


def test_a_tree_of_depth_4_gives_every_member_the_exact_sum_over_each_link_once():
    """Members send to their own aggregator; partials go up the chain, the result comes down it: every
    member gets one result, exact, from its own aggregator with the job's token, and each link carries
    one frame each way (a partial up, a result down; a contribution up, a result down)."""
    aggregators, endpoints, members = chain()
    network = Network(aggregators)
    fanin = 2 * DEPTH
    for level in reversed(range(DEPTH)):  # the leaves first: the root completes last
        for k, member in enumerate(members[level]):
            network.send(contribution_to(aggregators[level].config, member, 2 * level + k, fanin))
    network.run()
    exact = [sum(m + 1 for m in range(fanin)), sum(-10 * m for m in range(fanin)), 7 * fanin]
    for level in range(DEPTH):
        for member in members[level]:
            (result,) = network.inbox[member]
            assert source_of(result) == endpoints[level] and values(result) == exact
            assert (field(result, "bitmap"), field(result, "token")) == (2**fanin - 1, TREE_JOB["token"])
    expected = Counter()
    for level in range(DEPTH):
        for member in members[level]:
            expected[member, endpoints[level]] = expected[endpoints[level], member] = 1
        if level:
            expected[endpoints[level], endpoints[level - 1]] = expected[endpoints[level - 1], endpoints[level]] = 1
    assert network.links == expected
    assert [a.stats()["relayed"] for a in aggregators] == [0] + [1] * (DEPTH - 1)
    assert set(network.inbox) == {member for pair in members for member in pair}


def test_with_a_group_a_result_relayed_down_goes_only_to_the_members_that_retransmitted():
    """With a group the root's result reaches every member at once; a lower aggregator gets it only as the
    answer to its partial sent again for a member's retransmission. That member (and only it) gets the copy:
    the group is not sent the result a second time, and a second answer from the parent is dropped."""
    aggregators, endpoints, members = chain(3, group=GROUP)
    network = Network(aggregators)
    for level in reversed(range(3)):
        for k, member in enumerate(members[level]):
            network.send(contribution_to(aggregators[level].config, member, 2 * level + k, 6, group=GROUP))
    network.run()
    assert [source_of(data) for data in network.inbox[GROUP, PORT]] == [endpoints[0]]
    lost, other = members[2]
    network.send(contribution_to(aggregators[2].config, lost, 4, 6, group=GROUP))
    network.send(contribution_to(aggregators[1].config, members[1][0], 2, 6, group=GROUP))
    network.run()
    assert len(network.inbox[GROUP, PORT]) == 1, "the group got the result again"
    exact = [sum(m + 1 for m in range(6)), sum(-10 * m for m in range(6)), 42]
    assert [values(data) for data in network.inbox[lost]] == [exact]
    assert [values(data) for data in network.inbox[members[1][0]]] == [exact]
    assert not network.inbox[other] and not network.inbox[members[1][1]]
    assert [a.stats()["relayed"] for a in aggregators] == [0, 1, 1]


def test_a_result_from_the_parent_is_relayed_once_and_a_member_is_then_answered_below():
    """Below the root: a retransmission before the result came down sends the partial again to the parent
    (only there); the parent's result is stored and sent down once, a second copy is dropped; after it a
    member's retransmission or request is answered by its own aggregator to that member alone, nothing
    goes up again."""
    aggregators, endpoints, members = chain(2)
    parent, child = aggregators
    network = Network([child])
    for k, member in enumerate(members[1]):
        network.send(contribution_to(child.config, member, 2 + k, 4))
    network.run()
    partial = next(data for data in network.carried if destination(data) == endpoints[0])
    assert network.links[endpoints[1], endpoints[0]] == 1 and not network.inbox[members[1][0]]
    disposition, again = send(child, contribution_to(child.config, members[1][1], 3, 4))
    assert disposition == Disposition.ANSWERED and again == [partial]
    assert send(child, request(JobEntry(members={members[1][0]}, **TREE_JOB), members[1][0], to=child.config,
                               fanin=4, sender=2)) == (Disposition.DROP_NO_RESULT, [])
    for k, member in enumerate(members[0]):
        parent.process(contribution_to(parent.config, member, k, 4))
    (down,) = [out for out in parent.process(partial) if destination(out) == endpoints[1]]
    disposition, relayed = send(child, down)
    assert disposition == Disposition.RELAYED
    assert sorted(destination(out) for out in relayed) == sorted(members[1])
    assert all(values(out) == [10, -60, 28] for out in relayed)
    assert send(child, down) == (Disposition.DROP_DUPLICATE, [])
    for member in members[1]:
        disposition, (answer,) = send(child, contribution_to(child.config, member, 2 + members[1].index(member), 4))
        assert disposition == Disposition.ANSWERED
        assert (destination(answer), field(answer, "opcode"), values(answer)) == (member, Opcode.RESULT,
                                                                                  [10, -60, 28])
        disposition, (answer,) = send(child, request(JobEntry(members={member}, **TREE_JOB), member, to=child.config,
                                                     fanin=4, sender=2))
        assert disposition == Disposition.ANSWERED and destination(answer) == member
    assert child.stats()["partials_emitted"] == 2


# --- nothing outside the tables ----------------------------------------------------------------------------

PARENT, CHILD = (0x0A_00_02_01, PORT), (0x0A_00_02_02, PORT)
RANDOM_JOBS = (
    JobEntry(job=11, token=0x1111, slots=2, members={A, B, NEXT_DOOR}),
    JobEntry(job=12, token=0x2222, slots=2, members={C}, group=GROUP),
    JobEntry(job=13, token=0x3333, slots=3, members={B, D}, routes={
        0: CliqueRoute(level=0b0111, parent=PARENT, children={CHILD: 0b0100}),
        1: CliqueRoute(children={CHILD: 0b1110})}),
)


def allowed(entry):
    """Every address `entry`'s tables name: members, group, parents, children."""
    addresses = set(entry.members) | ({(entry.group, CONFIG.port)} if entry.group else set())
    for route in entry.routes.values():
        addresses |= set(route.children) | ({route.parent} if route.parent else set())
    return addresses


class RandomRun:
    """Frames for RANDOM_JOBS: whole levels sent in any order (contributions from members, partials from the
    child, the parent's result for a clique below it), retransmissions, requests, and frames changed in one
    way: a stranger's or another table address as source, a wrong token, an unknown job, any slot."""

    SOURCES = [A, B, C, D, NEXT_DOOR, STRANGER, PARENT, CHILD]

    def __init__(self, seed):
        self.rnd = random.Random(seed)
        self.pending, self.past = [], []

    def level(self):
        rnd = self.rnd
        entry = rnd.choice(RANDOM_JOBS)
        clique = rnd.choice((0, 0, 1, 2))
        route = entry.route(clique)
        fanin = 4 if route.children else rnd.randint(1, 3)
        shared = dict(fanin=fanin, clique=clique, round=rnd.randrange(4), slot=rnd.randrange(entry.slots))
        remaining = route.level or 2**fanin - 1
        frames = []
        for child, held in route.children.items():
            frames.append(frame(entry, child, Opcode.PARTIAL, sender=held.bit_length() - 1, bitmap=held & remaining,
                                **shared))
            remaining &= ~held
        for member in range(fanin):
            if remaining >> member & 1:
                frames.append(frame(entry, rnd.choice(sorted(entry.members)), sender=member, **shared))
        rnd.shuffle(frames)
        if route.parent:
            frames.append(frame(entry, route.parent, Opcode.RESULT, bitmap=2**fanin - 1, **shared))
        return frames

    def changed(self, data):
        rnd, data = self.rnd, bytearray(data)
        name, value = rnd.choice((("token", rnd.getrandbits(64)), ("job", rnd.choice((1, 14, 2**32 - 1))),
                                  ("slot", rnd.randrange(4)), ("round", rnd.randrange(4)), ("opcode", Opcode.RESULT),
                                  ("opcode", Opcode.RESULT_REQUEST), ("udp_sport", 5000), ("ip_src", STRANGER[0])))
        at = FRAME_OFFSETS[name]
        data[at:at + FIELDS_BY_NAME[name].nbytes] = value.to_bytes(FIELDS_BY_NAME[name].nbytes, "big")
        checksum = int(ipv4_checksums(np.frombuffer(bytes(data), dtype=np.uint8)[np.newaxis])[0])
        data[FRAME_OFFSETS["ip_csum"]:FRAME_OFFSETS["ip_csum"] + 2] = checksum.to_bytes(2, "big")
        return bytes(data)

    def next(self):
        rnd, pick = self.rnd, self.rnd.random()
        if not self.pending:
            self.pending = self.level()
        if pick < 0.5 or not self.past:
            data = self.pending.pop(0)
            self.past = (self.past + [data])[-30:]
            return data
        if pick < 0.65:
            return rnd.choice(self.past)
        if pick < 0.75:
            entry = rnd.choice(RANDOM_JOBS)
            return request(entry, rnd.choice(self.SOURCES), fanin=rnd.randint(1, 4), clique=rnd.choice((0, 1, 2)),
                           round=rnd.randrange(4), slot=rnd.randrange(entry.slots))
        return self.changed(rnd.choice(self.past))


def test_outputs_go_only_to_addresses_in_the_tables():
    """A random run of whole levels, retransmissions, requests from anyone and frames changed in one way:
    every frame the aggregator sends is a version 3 frame of an installed job, with its token, from the
    aggregator, to an address of that job's tables. (Stats requests are left out: their replies carry no
    token; test_a_forged_stats_request_from_a_non_member_gets_no_byte holds them to the member that asks.)"""
    aggregator = with_jobs(*RANDOM_JOBS)
    run = RandomRun(36)
    sent = Counter()
    for _ in range(4000):
        data = run.next()
        for output in aggregator.process(data):
            held = aggregator.jobs.entries.get(field(output, "job"))
            assert held is not None and field(output, "version") == JOB_VERSION
            assert field(output, "token") == held.token and source_of(output) == HERE
            assert destination(output) in allowed(held), (destination(output), source_of(data), field(data, "opcode"))
            sent[Opcode(field(output, "opcode"))] += 1
    stats = aggregator.stats()
    assert min(sent[Opcode.RESULT], sent[Opcode.PARTIAL]) > 20, sent
    assert min(stats[name] for name in ("drop_job", "drop_token", "drop_member", "relayed", "answered")) > 0, stats
    assert sum(stats[name] for name in COUNTERS[:len(Disposition)]) == stats["frames_in"] == 4000


# --- the tables --------------------------------------------------------------------------------------------

def test_a_clash_is_refused_in_one_line_and_leaves_the_job_as_it_was():
    aggregator = with_jobs(JOB)
    for clash in (dict(token=JOB.token + 1), dict(slots=JOB.slots + 1), dict(group=GROUP),
                  dict(routes={0: CliqueRoute(parent=PARENT)})):
        entry = JobEntry(**{**dict(job=JOB.job, token=JOB.token, slots=JOB.slots, members={C}), **clash})
        with pytest.raises(JobTableError) as refused:
            aggregator.install(entry)
        message = str(refused.value)
        assert "\n" not in message and f"job {JOB.job}" in message and "clash" in message
    assert aggregator.jobs.entries[JOB.job] == JOB


def test_registering_again_merges_members_and_renewing_changes_nothing():
    """Each island registers its own socket: the same job with other members adds them (same range, the
    live round kept); the same registration again changes nothing."""
    aggregator = with_jobs(JobEntry(job=JOB.job, token=JOB.token, slots=JOB.slots, members={A}))
    send(aggregator, frame(JOB, A, sender=0))
    started = slots_state(aggregator)
    assert send(aggregator, frame(JOB, B, sender=1)) == (Disposition.DROP_MEMBER, [])
    base = aggregator.jobs.bases[JOB.job]
    for _registration in range(2):  # the second one renews: nothing changes
        assert aggregator.install(JobEntry(job=JOB.job, token=JOB.token, slots=JOB.slots, members={B})) == base
        assert aggregator.jobs.entries[JOB.job].members == {A, B}
    assert slots_state(aggregator) == started
    disposition, results = send(aggregator, frame(JOB, B, sender=1, elements=(10, 20, 30)))
    assert disposition == Disposition.ACCUMULATED and sorted(map(destination, results)) == sorted([A, B])


@pytest.mark.parametrize("limit, entries, refused", [
    ("jobs", [JobEntry(job=job, token=1, slots=1, members={A}) for job in (1, 2)],
     JobEntry(job=3, token=1, slots=1, members={A})),
    ("members", [JobEntry(job=1, token=1, slots=1, members={A, B})], JobEntry(job=1, token=1, slots=1, members={C})),
    ("members", [], JobEntry(job=1, token=1, slots=1, members={A, B, C})),
    ("routes", [], JobEntry(job=1, token=1, slots=1, members={A}, routes={c: CliqueRoute() for c in range(3)})),
    ("slots", [JobEntry(job=1, token=1, slots=3, members={A})], JobEntry(job=2, token=1, slots=2, members={A})),
    ("children", [], JobEntry(job=1, token=1, slots=1, members={A},
                              routes={0: CliqueRoute(children={A: 1, B: 2, C: 4})})),
])
def test_the_tables_are_bounded(limit, entries, refused):
    """At most `jobs` jobs, `members` members and `routes` routes per job, `children` child aggregators per
    route, and a range only where that many slots in a row are free; a refusal is one line and leaves the
    tables as they were."""
    table = JobTable(4, JobLimits(jobs=2, members=2, routes=2, children=2))
    for entry in entries:
        table.install(entry)
    held = dict(table.entries)
    with pytest.raises(JobTableError) as refused_error:
        table.install(refused)
    assert "\n" not in str(refused_error.value) and f"job {refused.job}" in str(refused_error.value)
    assert table.entries == held


@pytest.mark.parametrize("fields, cause", [
    (dict(job=0), "not a nonzero 32-bit number"),
    (dict(job=1 << 32), "not a nonzero 32-bit number"),
    (dict(token=0), "not a nonzero 64-bit number"),
    (dict(token=1 << 64), "not a nonzero 64-bit number"),
    (dict(slots=0), "a quota of 0 slots holds nothing"),
    (dict(group=0xE0_00_00_01), "is not in 239.0.0.0/8"),
    (dict(members={(A[0], 0)}), "member 10.0.0.10:0 is not a unicast IPv4 address and port"),
    (dict(members={(0x0A_01_02_03, 0)}), "member 10.1.2.3:0 is not a unicast IPv4 address and port"),
    (dict(members={(A[0], 1 << 16)}), "member 10.0.0.10:65536 is not a unicast IPv4 address and port"),
    (dict(members={(0, 5000)}), "member 0.0.0.0:5000 is not a unicast IPv4 address and port"),
    (dict(members={(1 << 32, 5000)}), "member 4294967296:5000 is not a unicast IPv4 address and port"),
    (dict(members={(GROUP, 5000)}), "member 239.0.0.7:5000 is not a unicast IPv4 address and port"),
    (dict(routes={1 << 16: CliqueRoute()}), "clique 65536 does not fit the 16-bit clique field"),
    (dict(routes={0: CliqueRoute(level=1 << 64)}), "has members beyond 64"),
    (dict(routes={0: CliqueRoute(parent=(A[0], 1 << 16))}), "parent 10.0.0.10:65536 is not a unicast"),
    (dict(routes={0: CliqueRoute(level=0b11, children={C: 0b100})}), "holds members 0x4, none or outside"),
    (dict(routes={0: CliqueRoute(children={(C[0], 0): 1})}), f"job {JOB.job}: child 10.0.0.12:0 is not a unicast"),
])
def test_a_job_entry_out_of_range_is_refused_in_one_line(fields, cause):
    """Every field of a registration at the edge of its range, one past it refused in one line naming it."""
    with pytest.raises(JobTableError) as refused:
        JobEntry(**{**dict(job=JOB.job, token=JOB.token, slots=1, members={A}), **fields})
    message = str(refused.value)
    assert "\n" not in message and cause in message, message


def test_a_job_entry_at_the_edges_of_its_fields_is_taken():
    edges = JobEntry(job=(1 << 32) - 1, token=(1 << 64) - 1, slots=1, members=[(1, 1), ((1 << 32) - 1, (1 << 16) - 1)],
                     group=0xEF_FF_FF_FF, routes={(1 << 16) - 1: CliqueRoute(level=(1 << 64) - 1)})
    # Members are held as a set, whatever collection they came in: an entry compares as its content.
    assert isinstance(edges.members, frozenset)
    assert edges == replace(edges, members={((1 << 32) - 1, (1 << 16) - 1), (1, 1)})


def test_teardown_frees_the_slots_for_another_job_and_forgets_their_sums():
    """A torn-down job's range is free for the next job, and its sums are gone: not even a version 2
    request naming its slot and key (where unregistered frames are taken) reads them."""
    aggregator = Aggregator(replace(CONFIG, slots=4, unregistered=True))
    whole = JobEntry(job=JOB.job, token=JOB.token, slots=4, members={A, B}, group=GROUP)
    aggregator.install(whole)
    assert send(aggregator, frame(whole, A, fanin=1, slot=3))[0] == Disposition.ACCUMULATED
    with pytest.raises(JobTableError, match="no 4 free slots in a row"):
        aggregator.install(OTHER)
    assert aggregator.remove(whole.job) and not aggregator.remove(whole.job)
    assert send(aggregator, frame(whole, A, fanin=1)) == (Disposition.DROP_JOB, [])
    assert send(aggregator, request(whole, STRANGER, fanin=1, slot=3, version=2, token=0)) == (
        Disposition.DROP_NO_RESULT, [])
    assert aggregator.install(OTHER) == 0
    disposition, (result,) = send(aggregator, frame(OTHER, C, fanin=1, slot=3, elements=(5, 5, 5)))
    assert disposition == Disposition.ACCUMULATED and values(result) == [5, 5, 5]


def test_a_member_leaves_without_disturbing_the_others_and_the_last_frees_the_slots():
    """A leave takes its members out of the job's table and nothing else: the job's range, its live round and
    the other members stay (a slot a member contributed to before it left still sends it the result); the
    last member's leave removes the job and forgets its sums, as teardown does."""
    aggregator = with_jobs(JOB)
    send(aggregator, frame(JOB, A, sender=0))
    started, base = slots_state(aggregator), aggregator.jobs.bases[JOB.job]
    assert aggregator.leave(JOB.job, {A, STRANGER}) == (1, 1)
    assert aggregator.leave(JOB.job, {A}) == (0, 1)
    assert aggregator.jobs.entries[JOB.job].members == {B} and aggregator.jobs.bases[JOB.job] == base
    assert slots_state(aggregator) == started
    assert send(aggregator, frame(JOB, A, sender=0, round=2)) == (Disposition.DROP_MEMBER, [])
    disposition, results = send(aggregator, frame(JOB, B, sender=1, elements=(10, 20, 30)))
    assert disposition == Disposition.ACCUMULATED and [values(result) for result in results] == [[11, 22, 33]] * 2
    assert sorted(map(destination, results)) == sorted([A, B])
    assert aggregator.leave(JOB.job, {B}) == (1, 0)
    assert JOB.job not in aggregator.jobs.entries and aggregator.leave(JOB.job, {B}) == (0, 0)
    assert all(slot.key is None for slot in aggregator.slots)
    assert send(aggregator, frame(JOB, B, sender=1)) == (Disposition.DROP_JOB, [])


def test_a_job_entry_keeps_what_it_was_given_when_the_caller_changes_it():
    children = {C: 0b10}
    routes = {0: CliqueRoute(level=0b11, children=children)}
    entry = JobEntry(job=JOB.job, token=JOB.token, slots=1, members={A}, routes=routes)
    children[D] = 0b01
    routes[1] = CliqueRoute()
    assert dict(entry.routes) == {0: CliqueRoute(level=0b11, children={C: 0b10})}
    assert dict(entry.route(0).children) == {C: 0b10}


def test_the_model_holds_the_tables_its_configuration_bounds():
    """The model's tables are sized by `AggregatorConfig.limits`, as the gateware's are: a job beyond `jobs`,
    and one without a group where results go out one frame each, are refused in one line."""
    aggregator = Aggregator(replace(CONFIG, limits=JobLimits(jobs=1, unicast_results=False)))
    aggregator.install(replace(JOB, group=GROUP))
    with pytest.raises(JobTableError, match=f"^job {OTHER.job}: this aggregator holds 1 jobs already$"):
        aggregator.install(replace(OTHER, group=GROUP))
    aggregator.remove(JOB.job)
    with pytest.raises(JobTableError) as refused:
        aggregator.install(OTHER)
    assert str(refused.value) == (f"job {OTHER.job}: without a group its results go out as one copy per member, "
                                  f"which this aggregator cannot send: give the job a multicast group")


def test_an_aggregator_without_job_tables_refuses_an_install():
    aggregator = Aggregator(AggregatorConfig())
    with pytest.raises(ValueError, match="holds no job tables"):
        aggregator.install(JOB)
    assert aggregator.jobs.entries == {}


def test_a_job_installed_where_unregistered_frames_were_starts_clean():
    """A free range may hold what version 2 frames left; a job installed there starts with empty slots, so
    nobody can prepare a slot for a job before it registers: neither an unfinished one that its frames
    would find stale or colliding, nor a completed one its members would be answered from."""
    config = replace(CONFIG, unregistered=True, lease=0)
    entry = JobEntry(job=JOB.job, token=JOB.token, slots=2, members={A, B}, group=GROUP)
    aggregator = Aggregator(config)
    prepared = dict(version=2, token=0, group=GROUP, fanin=1)
    aggregator.process(frame(entry, STRANGER, round=9, elements=(666, 666, 666), **prepared))
    aggregator.process(frame(entry, STRANGER, slot=1, round=1, elements=(666, 666, 666), **prepared))
    assert aggregator.install(entry) == 0
    assert send(aggregator, frame(entry, A, sender=0)) == (Disposition.ACCUMULATED, [])
    assert send(aggregator, request(entry, A, slot=1, fanin=1)) == (Disposition.DROP_NO_RESULT, [])
    disposition, (result,) = send(aggregator, frame(entry, B, sender=1, elements=(10, 20, 30)))
    assert disposition == Disposition.ACCUMULATED and values(result) == [11, 22, 33]


def test_members_that_send_from_one_address_get_one_copy_there():
    """Two member indices whose contributions come from one socket: the result goes there once, not once per
    index (a copy per index would double that link's load for nothing)."""
    aggregator = with_jobs(JOB)
    send(aggregator, frame(JOB, A, sender=0))
    disposition, results = send(aggregator, frame(JOB, A, sender=1))
    assert disposition == Disposition.ACCUMULATED and list(map(destination, results)) == [A]
