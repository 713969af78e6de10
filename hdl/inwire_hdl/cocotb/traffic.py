"""Frames for the aggregator testbench: contributions, requests, malformed variants and foreign traffic."""

import random
from dataclasses import replace

import numpy as np
from scapy.layers.inet import ICMP, IP, TCP, UDP
from scapy.layers.inet6 import IPv6
from scapy.layers.l2 import ARP, Dot1Q, Ether

from inwire.model import Aggregator as Model
from inwire.model import AggregatorConfig
from inwire.packets import build_frames, ipv4_checksums
from inwire.protocol import FIELDS_BY_NAME, FRAME_HEADER_BYTES, FRAME_OFFSETS, INT32_MAX, Opcode

HOST_MAC = 0x02_00_00_00_00_07
HOST_IP = 0x0A_00_00_07
_UPSTREAM = AggregatorConfig().upstream_prefix[0]
# The other aggregators of a tree lie in the default upstream prefix (the /24 of the default address), so
# that partials may go between them.
BELOW_IP = _UPSTREAM + 2
"""An aggregator one level below the one under test (played by a model)."""
LOWEST_IP = _UPSTREAM + 3
"""An aggregator two levels below (the lowest of a three-level tree)."""
ABOVE_IP = _UPSTREAM + 4
"""An aggregator above the one under test: its partials go there."""
TOP_IP = _UPSTREAM + 5
"""The root two levels above the aggregator under test, above ABOVE_IP."""
OUTSIDE_IP = 0x0A_00_01_03
"""An address outside the default upstream prefix: no partial may go there."""


class Traffic:
    """Builds frames addressed to the aggregator with `config`, with a seeded random source."""

    def __init__(self, config, seed=0):
        self.config = config
        self.random = random.Random(seed)
        self.rng = np.random.default_rng(seed)

    def header(self, **fields):
        base = dict(eth_dst=self.config.mac, eth_src=HOST_MAC, ip_src=HOST_IP, ip_dst=self.config.ip,
                    udp_dport=self.config.port, opcode=Opcode.CONTRIBUTION, fanin=1, job=1, round=1,
                    group=0xEF_00_00_01, slot=0)
        base.update(fields)
        return base

    def elements(self, count, low=-1000, high=1000):
        return self.rng.integers(low, high, size=count, endpoint=True)

    def contribution(self, elements, **fields):
        return bytes(build_frames(np.asarray(elements, dtype=np.int64), **self.header(**fields))[0])

    def partial(self, elements, status=0, **fields):
        """A partial built by hand: a contribution holding several members, with a status trailer."""
        return bytes(build_frames(np.asarray(elements, dtype=np.int64), status=status,
                                  **self.header(opcode=Opcode.PARTIAL, **fields))[0])

    def request(self, opcode=Opcode.RESULT_REQUEST, count=1, **fields):
        """A result or stats request: a bare 128-byte header whose count field still names the vector."""
        frame = bytearray(self.contribution(np.zeros(count, dtype=np.int64), opcode=opcode, **fields))
        del frame[FRAME_HEADER_BYTES:]
        patch(frame, ip_len=FRAME_HEADER_BYTES - 14, udp_len=FRAME_HEADER_BYTES - 34)
        return bytes(frame)

    def clique(self, count, fanin, elements=None, **fields):
        """One contribution per member of a clique, in member order."""
        vectors = elements if elements is not None else [self.elements(count) for _ in range(fanin)]
        return [self.contribution(vectors[sender], sender=sender, fanin=fanin, **fields) for sender in range(fanin)]

    def foreign(self):
        """Frames that are not for the aggregator, of every kind the aggregator must pass through."""
        mine = ".".join(str(self.config.ip >> shift & 255) for shift in (24, 16, 8, 0))
        payload = bytes(self.random.randrange(256) for _ in range(self.random.randrange(0, 300)))
        mac, peer = "02:00:00:00:00:07", "02:00:00:00:00:08"
        port, host = self.config.port, "10.0.0.7"
        eth = Ether(dst=peer, src=mac)
        frames = [
            Ether(dst="ff:ff:ff:ff:ff:ff", src=mac) / ARP(hwsrc=mac, psrc=host, pdst=mine),
            eth / IP(src=host, dst=mine) / TCP(dport=port) / payload,
            eth / IPv6(src="fd00::7", dst="fd00::8") / UDP(dport=port) / payload,
            eth / IP(src=host, dst=mine) / UDP(dport=port + 1) / payload,
            eth / IP(src=host, dst="10.9.9.9") / UDP(dport=port) / payload,
            eth / Dot1Q(vlan=5) / IP(src=host, dst=mine) / UDP(dport=port) / payload,
            eth / IP(src=host, dst=mine) / ICMP() / payload,
        ]
        return [pad(bytes(frame)) for frame in frames]


def pad(frame):
    return frame + bytes(max(0, 60 - len(frame)))


def patch(frame, fix_checksum=True, **fields):
    """Overwrite header fields of a frame (bytearray) in place, then redo its IPv4 checksum."""
    for name, value in fields.items():
        offset, nbytes = FRAME_OFFSETS[name], FIELDS_BY_NAME[name].nbytes
        frame[offset:offset + nbytes] = int(value).to_bytes(nbytes, "big", signed=value < 0)
    if fix_checksum:
        csum = FRAME_OFFSETS["ip_csum"]
        value = int(ipv4_checksums(np.frombuffer(bytes(frame[:FRAME_HEADER_BYTES]), dtype=np.uint8)[np.newaxis])[0])
        frame[csum:csum + 2] = value.to_bytes(2, "big")
    return frame


def malformed(traffic):
    """(frame, the drop reason it exercises) for every class the aggregator drops before its slots."""
    cfg = traffic.config
    good = traffic.contribution(traffic.elements(6), fanin=2, slot=1, job=9)

    def variant(fix_checksum=True, **fields):
        return bytes(patch(bytearray(good), fix_checksum=fix_checksum, **fields))

    bad_checksum = bytearray(good)
    bad_checksum[FRAME_OFFSETS["ip_csum"]] ^= 0x01
    return [
        (good[:59], "drop_runt"),
        (bytes(20), "drop_runt"),
        (variant(ip_ver_ihl=0x46), "drop_ip_header"),
        (variant(ip_ver_ihl=0x65), "drop_ip_header"),
        (variant(ip_frag=0x2000), "drop_ip_fragment"),
        (variant(ip_frag=0x0010), "drop_ip_fragment"),
        (bytes(bad_checksum), "drop_ip_checksum"),
        (good[:100], "drop_length"),
        (good[:-4], "drop_length"),
        (good + bytes(4), "drop_length"),
        (good + bytes(64), "drop_length"),
        (variant(ip_len=len(good) - 10), "drop_length"),
        (variant(udp_len=len(good) - 30), "drop_length"),
        (variant(count=7), "drop_length"),
        (traffic.request(slot=1, job=9, fanin=2) + bytes(8), "drop_length"),
        (variant(magic=0x4958), "drop_version"),
        (variant(version=0), "drop_version"),
        (variant(version=3), "drop_version"),
        (variant(opcode=Opcode.RESULT), "drop_opcode"),
        (variant(opcode=Opcode.STATS_REPLY), "drop_opcode"),
        (variant(opcode=0), "drop_opcode"),
        (variant(fanin=0), "drop_fanin"),
        (variant(fanin=cfg.max_fanin + 1), "drop_fanin"),
        (variant(sender=2), "drop_sender"),
        # Version 2 member sets: a member outside the level, a level member not below the fan-in.
        (variant(bitmap=0b100), "drop_sender"),
        (variant(bitmap=0b10, expect=0b01), "drop_sender"),
        (variant(expect=0b101), "drop_sender"),
        (variant(opcode=Opcode.PARTIAL), "drop_length"),
        (traffic.contribution([], fanin=2, slot=1), "drop_count"),
        (traffic.contribution(traffic.elements(cfg.max_elements + 1), fanin=2, slot=1), "drop_count"),
        (variant(group=0xE0_00_00_01), "drop_group"),
        (variant(slot=cfg.slots), "drop_slot"),
        (variant(slot=0xFFFF), "drop_slot"),
        (variant(hop1=cfg.ip), "drop_route"),
        (variant(hop2=ABOVE_IP), "drop_route"),
        (traffic.request(slot=1, job=9, fanin=2, count=6), "drop_no_result"),
    ]


def below(config, ip, frames):
    """The frames a model aggregator at `ip` (otherwise configured as `config`) sends for `frames`: a level
    below the aggregator under test, whose partials go up to it."""
    model = Model(replace(config, ip=ip))
    return [out for frame in frames for out in model.process(frame)]


def tree_root(traffic, count, slot, job, partial_at=1, saturate=False):
    """The aggregator under test as the root of a two-level tree of 5 members: members 0 and 1 reach it in
    one partial from the level below, 2 to 4 directly. The partial comes in at position `partial_at` among
    the direct contributions; then a duplicate of member 1, a hand-made partial overlapping member 2, member
    2 naming another level (a mismatch, or the claim when it comes first), and after completion the partial
    again (answered with the stored result). `saturate`: the level below saturates, which its partial's
    trailer carries."""
    fanin, me = 5, traffic.config.ip
    vectors = [traffic.elements(count) for _ in range(fanin)]
    if saturate:
        vectors[0][:] = vectors[1][:] = INT32_MAX
    common = dict(fanin=fanin, slot=slot, job=job, round=3, clique=7, chunk=count, group=0xEF_00_00_05)
    leaves = [traffic.contribution(vectors[s], sender=s, ip_dst=BELOW_IP, expect=0b00011, hop1=me, **common)
              for s in (0, 1)]
    (partial,) = below(traffic.config, BELOW_IP, leaves)
    direct = [traffic.contribution(vectors[s], sender=s, **common) for s in (2, 3, 4)]
    overlapping = traffic.partial(traffic.elements(count), bitmap=0b01100, sender=3, **common)
    other_level = traffic.contribution(vectors[2], sender=2, expect=0b00111, **common)
    frames = direct[:partial_at] + [partial, traffic.contribution(vectors[1], sender=1, **common), overlapping,
                                    other_level]
    return frames + direct[partial_at:] + [partial, direct[0]]


def tree_child(traffic, count, slot, job, saturate=False):
    """The aggregator under test one level below the root: members 0, 2 and 3 of a clique of 4 send to it
    (level 0b1101, hop1 the root); it sends the partial up. Then member 2 retransmits (as after a lost
    partial: the stored partial again), and result requests with and without hop1 (the stored partial, then
    the stored result). `saturate`: its own sums saturate."""
    fanin = 4
    vectors = [traffic.elements(count) for _ in range(fanin)]
    if saturate:
        vectors[2][0] = vectors[3][0] = INT32_MAX
    common = dict(fanin=fanin, slot=slot, job=job, round=9, clique=2, chunk=0, group=0xEF_00_00_06,
                  expect=0b1101, hop1=ABOVE_IP, hop1_expect=0b1111)
    leaves = [traffic.contribution(vectors[s], sender=s, **common) for s in (0, 2, 3)]
    flat = {name: value for name, value in common.items() if name not in ("expect", "hop1", "hop1_expect")}
    return leaves + [leaves[1], traffic.request(sender=3, count=count, **common),
                     traffic.request(sender=0, count=count, **flat)]


def tree_middle(traffic, count, slot, job, saturate=False):
    """The aggregator under test in the middle of a three-level tree of 4 members: members 0 and 1 reach it
    in a partial from the lowest level, member 2 directly (level 0b0111, hop1 the root above); its partial
    goes to the root with the hops moved up. `saturate`: the lowest level saturates."""
    fanin, me = 4, traffic.config.ip
    vectors = [traffic.elements(count) for _ in range(fanin)]
    if saturate:
        vectors[0][-1] = vectors[1][-1] = -INT32_MAX
    common = dict(fanin=fanin, slot=slot, job=job, round=1, clique=1, chunk=0, group=0xEF_00_00_07)
    lowest = [traffic.contribution(vectors[s], sender=s, ip_dst=LOWEST_IP, expect=0b0011, hop1=me,
                                   hop1_expect=0b0111, hop2=ABOVE_IP, hop2_expect=0, **common) for s in (0, 1)]
    (partial,) = below(traffic.config, LOWEST_IP, lowest)
    direct = traffic.contribution(vectors[2], sender=2, expect=0b0111, hop1=ABOVE_IP, **common)
    return [partial, direct, partial]


def version1(traffic, count, slot, job):
    """A clique of 3 with version 1 frames whose tree bytes hold garbage (read as 0: sender alone, whole
    clique, root), one version 2 member, a version 1 retransmission and result request, a version 1 stats
    request."""
    fanin = 3
    common = dict(fanin=fanin, slot=slot, job=job, round=1, clique=0, chunk=0)
    frames = []
    for sender in range(fanin):
        frame = bytearray(traffic.contribution(traffic.elements(count), sender=sender, **common))
        if sender != 1:
            patch(frame, version=1, bitmap=0b100 << sender, expect=0xF0, hop1=ABOVE_IP, hop1_expect=1,
                  hop2=ABOVE_IP, hop2_expect=2)
        frames.append(bytes(frame))
    request = bytearray(traffic.request(count=count, **common))
    stats = bytearray(traffic.request(Opcode.STATS_REQUEST))
    return frames + [frames[0], bytes(patch(request, version=1, hop1=ABOVE_IP)),
                     bytes(patch(stats, version=1))]


def forged_routes(traffic, count, slot, job):
    """(frames, forged): member 0 of a clique of two on `slot`, then member 1 with hops that would send the
    completed slot's output where it may not go, each forged frame a drop_route that changes nothing, then
    the real member 1 (the result, of members 0 and 1 only), a result request naming the aggregator as its
    hop1, and on `slot` + 1 a clique of one whose hop1 is the aggregator itself (a self-loop) followed by the
    same member with no hops (its result alone)."""
    cfg, me = traffic.config, traffic.config.ip
    vectors = [traffic.elements(count) for _ in range(2)]
    common = dict(fanin=2, slot=slot, job=job, round=2, clique=3, chunk=0, group=0xEF_00_00_09)
    first, member = (traffic.contribution(vectors[s], sender=s, **common) for s in (0, 1))
    hops = [
        # A ping-pong pair: the level below's partial names the level below as the way up.
        traffic.partial(vectors[1], sender=1, bitmap=0b10, ip_src=BELOW_IP, hop1=BELOW_IP, **common),
        # A spoofed source: a member claiming to be the aggregator above, reflected there.
        traffic.contribution(vectors[1], sender=1, ip_src=ABOVE_IP, hop1=ABOVE_IP, **common),
        traffic.contribution(vectors[1], sender=1, hop1=OUTSIDE_IP, **common),
        traffic.contribution(vectors[1], sender=1, hop2=ABOVE_IP, **common),
        traffic.contribution(vectors[1], sender=1, hop1=ABOVE_IP, hop2=ABOVE_IP, **common),
        traffic.contribution(vectors[1], sender=1, hop1=ABOVE_IP, hop2=me, **common),
    ]
    request = traffic.request(sender=1, count=count, hop1=me, **common)
    alone = dict(common, fanin=1, slot=(slot + 1) % cfg.slots)
    lone = traffic.elements(count)
    loop = traffic.contribution(lone, hop1=me, **alone)
    return [first, *hops, member, request, loop, traffic.contribution(lone, **alone)], [*hops, request, loop]

def stale_chunks(traffic, count, slot, job, window=2):
    """Chunks 0 and 2W of one round of a clique of two, which share a slot (`inwire stream`'s slot pools with
    a window of W): (chunk 0's contributions, chunk 2W's, chunk 2W's result request). A copy of chunk 0
    that reaches the slot while chunk 2W owns it is older: stale while the slot's lease runs."""
    common = dict(slot=slot, job=job, round=5, clique=1, group=0xEF_00_00_0A)
    later = 2 * window * count
    return (traffic.clique(count, 2, chunk=0, **common), traffic.clique(count, 2, chunk=later, **common),
            traffic.request(count=count, fanin=2, chunk=later, **common))


def saturated_partial_last(traffic, count, slot, job, middle=False):
    """A clique of 4 whose members 0 and 1 are summed below (at BELOW_IP), where member 0's INT32_MAX plus
    member 1's positive element 0 saturates: the partial's trailer carries the flag, and it is the frame
    that completes the aggregator under test's level. Its own sums do not saturate: the direct members'
    elements are at most 0, but on element 0 they cancel, so that the sum there is exactly INT32_MAX. At the
    root (level: the whole clique) the result carries the flag; with `middle` the level is members 0 to 2,
    member 3 goes to ABOVE_IP itself and the flag goes up in the partial to ABOVE_IP. Then the partial again
    and a result request: the stored output, flag included."""
    fanin, me = 4, traffic.config.ip
    vectors = [np.full(count, INT32_MAX, dtype=np.int64), traffic.elements(count)]
    vectors[1][0] = 9
    direct = [-traffic.elements(count, 0, 1000) for _ in range(2)]
    direct[0][0], direct[1][0] = -5, 5
    route = dict(expect=0b0111, hop1=ABOVE_IP) if middle else {}
    common = dict(fanin=fanin, slot=slot, job=job, round=4, clique=5, chunk=0, group=0xEF_00_00_0B)
    leaves = [traffic.contribution(vectors[s], sender=s, ip_dst=BELOW_IP, expect=0b0011, hop1=me,
                                   hop1_expect=route.get("expect", 0), hop2=route.get("hop1", 0), **common)
              for s in (0, 1)]
    (partial,) = below(traffic.config, BELOW_IP, leaves)
    if middle:
        # Member 3 sends to ABOVE_IP itself: member 2 brings both direct vectors here.
        direct = [direct[0] + direct[1]]
    members = [traffic.contribution(elements, sender=2 + s, **route, **common) for s, elements in enumerate(direct)]
    return members + [partial, partial, traffic.request(sender=1, count=count, **route, **common)]


def all_hops_set(traffic, count, slot, job):
    """The lowest level of a three-level tree of 6 members, every hop field set: members 0 to 2 send to the
    aggregator under test (level 0b000111) with hop1 ABOVE_IP (level 0b011111) and hop2 TOP_IP (level
    0b111111, the whole clique written out). Its partial goes to ABOVE_IP naming that level, TOP_IP as its
    hop1 and TOP_IP's level, hop2 and its level 0. Then member 1 again and a request with the same route
    (the stored partial), a request with hop1 and hop2 0 and stray hop levels (the stored result, tree
    fields 0), and one with hop2 but no hop1 (drop_route)."""
    route = dict(expect=0b000111, hop1=ABOVE_IP, hop1_expect=0b011111, hop2=TOP_IP, hop2_expect=0b111111)
    common = dict(fanin=6, slot=slot, job=job, round=6, clique=4, chunk=count, group=0xEF_00_00_0C)
    leaves = [traffic.contribution(traffic.elements(count), sender=s, bitmap=1 << s, **route, **common)
              for s in range(3)]
    return leaves + [leaves[1], traffic.request(sender=2, count=count, **route, **common),
                     traffic.request(sender=0, count=count, hop1_expect=0b011111, hop2_expect=0b111111, **common),
                     traffic.request(sender=0, count=count, hop2=TOP_IP, **common)]


def stray_hop_levels(traffic, count, slot, job):
    """Hop levels no hop reads: a root's clique of 3 with hop1 and hop2 0 but hop1_expect and hop2_expect
    set (the result's tree fields are 0), then on `slot` + 1 a level of 2 below ABOVE_IP with hop2 0 and
    hop2_expect set, which its partial carries up as hop1_expect."""
    root = dict(fanin=3, slot=slot, job=job, round=2, clique=0, chunk=0, group=0xEF_00_00_0D,
                hop1_expect=0b011, hop2_expect=0b110)
    child = dict(root, fanin=2, slot=(slot + 1) % traffic.config.slots, hop1=ABOVE_IP, hop1_expect=0b11,
                 hop2_expect=0b01)
    return [traffic.contribution(traffic.elements(count), sender=s, **fields)
            for fields in (root, child) for s in range(fields["fanin"])]


def upper_members(traffic, count, slot, job):
    """Members 32 to 63 of a clique of 64. On `slot` the aggregator under test sums the level of members 32
    to 63 for ABOVE_IP: single members, a partial from below holding members 40 to 47, a partial overlapping
    member 47 (drop_duplicate) and member 5, outside the level (drop_sender), member 63 last, then again
    (the stored partial). On `slot` + 1 it is the root: a partial holding members 0 to 31, then members 32
    to 63 one by one, member 33 twice (drop_duplicate), and a request for the result of all 64."""
    fanin, upper = 64, 0xFFFFFFFF_00000000
    common = dict(fanin=fanin, job=job, round=8, clique=9, chunk=0, group=0xEF_00_00_0E)
    level = dict(common, slot=slot, expect=upper, hop1=ABOVE_IP)
    root = dict(common, slot=(slot + 1) % traffic.config.slots)

    def member(sender, **fields):
        return traffic.contribution(traffic.elements(count), sender=sender, **fields)

    child = [member(s, **level) for s in range(32, 40)]
    child += [traffic.partial(traffic.elements(count, -8000, 8000), sender=40, bitmap=0xFF << 40, **level),
              traffic.partial(traffic.elements(count), sender=47, bitmap=0b11 << 47, **level), member(5, **level)]
    child += [member(s, **level) for s in range(48, 64)]
    lower = traffic.partial(traffic.elements(count, -32000, 32000), sender=0, bitmap=0xFFFFFFFF, **root)
    parent = [lower] + [member(s, **root) for s in range(32, 64)]
    parent.insert(3, parent[2])
    return child + [child[-1]] + parent + [traffic.request(sender=63, count=count, **root)]
