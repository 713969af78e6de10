"""Frames for the aggregator testbench: contributions, requests, malformed variants and foreign traffic."""

import random

import numpy as np
from scapy.layers.inet import ICMP, IP, TCP, UDP
from scapy.layers.inet6 import IPv6
from scapy.layers.l2 import ARP, Dot1Q, Ether

from inwire.packets import build_frames, ipv4_checksums
from inwire.protocol import FIELDS_BY_NAME, FRAME_HEADER_BYTES, FRAME_OFFSETS, Opcode

HOST_MAC = 0x02_00_00_00_00_07
HOST_IP = 0x0A_00_00_07


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
        (variant(version=2), "drop_version"),
        (variant(opcode=Opcode.RESULT), "drop_opcode"),
        (variant(opcode=Opcode.STATS_REPLY), "drop_opcode"),
        (variant(opcode=0), "drop_opcode"),
        (variant(fanin=0), "drop_fanin"),
        (variant(fanin=cfg.max_fanin + 1), "drop_fanin"),
        (variant(sender=2), "drop_sender"),
        (traffic.contribution([], fanin=2, slot=1), "drop_count"),
        (traffic.contribution(traffic.elements(cfg.max_elements + 1), fanin=2, slot=1), "drop_count"),
        (variant(group=0xE0_00_00_01), "drop_group"),
        (variant(slot=cfg.slots), "drop_slot"),
        (variant(slot=0xFFFF), "drop_slot"),
        (traffic.request(slot=1, job=9, fanin=2, count=6), "drop_no_result"),
    ]
