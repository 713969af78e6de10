"""The golden model: what the aggregator does with each kind of frame."""

import numpy as np
import pytest
from scapy.layers.inet import IP, TCP, UDP
from scapy.layers.inet6 import IPv6
from scapy.layers.l2 import ARP, Dot1Q, Ether
from scapy.packet import Raw, raw

from inwire.decode import describe_frame
from inwire.model import TIME_BITS, Aggregator, AggregatorConfig, round_is_newer
from inwire.packets import build_frames, ipv4_header_valid, parse_header
from inwire.protocol import COUNTERS, DROP_COUNTERS, FRAME_OFFSETS, Disposition, Opcode, multicast_mac

CONFIG = AggregatorConfig(slots=8, max_elements=16, max_fanin=8)
GROUP = 0xEF_01_02_03
HOST_IP = 0x0A_00_00_05


def contribution(elements=(1, 2, 3), **fields):
    values = {"eth_dst": CONFIG.mac, "eth_src": 0x02_00_00_00_00_05, "ip_src": HOST_IP, "ip_dst": CONFIG.ip,
              "opcode": Opcode.CONTRIBUTION, "fanin": 3, "sender": 0, "group": GROUP, "slot": 1, "job": 9,
              "round": 4, "clique": 2, "chunk": 0}
    values.update(fields)
    return bytes(build_frames(np.asarray(elements, dtype=np.int64), **values)[0])


def request(opcode, **fields):
    return contribution(elements=np.zeros(0, dtype=np.int64), opcode=opcode, **fields)


def result_request(count=3, **fields):
    """A result request is the bare header, with the slot's count in its count field."""
    frame = bytearray(request(Opcode.RESULT_REQUEST, **fields))
    frame[FRAME_OFFSETS["count"]:FRAME_OFFSETS["count"] + 2] = count.to_bytes(2, "big")
    return bytes(frame)


def disposition_of(aggregator, frame):
    before = aggregator.stats()
    output = aggregator.process(frame)
    after = aggregator.stats()
    changed = [Disposition[name.upper()] for name in COUNTERS[:len(Disposition)] if after[name] != before[name]]
    assert len(changed) == 1 and after["frames_in"] == before["frames_in"] + 1
    return changed[0], output


def assert_conserved(aggregator):
    stats = aggregator.stats()
    assert stats["frames_in"] == sum(stats[d.name.lower()] for d in Disposition)


def test_clique_of_three_emits_the_sum_to_the_group():
    aggregator = Aggregator(CONFIG)
    vectors = [(1, 2, 3), (10, -20, 30), (-5, 7, 100)]
    outputs = [disposition_of(aggregator, contribution(v, sender=i)) for i, v in enumerate(vectors)]
    assert [d for d, _ in outputs] == [Disposition.ACCUMULATED] * 3
    assert [len(o) for _, o in outputs] == [0, 0, 1]
    result = outputs[-1][1][0]
    decoded = describe_frame(result)
    assert decoded["kind"] == "result"
    assert decoded["elements"] == list(np.sum(vectors, axis=0))
    assert decoded["bitmap"] == 0b111 and decoded["contributors"] == 3 and not decoded["overflow"]
    assert (decoded["job"], decoded["round"], decoded["clique"], decoded["slot"]) == (9, 4, 2, 1)
    packet = Ether(result)
    assert packet.dst == "01:00:5e:01:02:03" and int(packet.src.replace(":", ""), 16) == CONFIG.mac
    assert packet[IP].dst == "239.1.2.3" and packet[IP].ttl == 64 and packet[UDP].chksum == 0
    assert packet[IP].len == len(result) - 14 and packet[UDP].len == len(result) - 34
    assert ipv4_header_valid(result)
    assert aggregator.stats()["results_emitted"] == 1
    assert_conserved(aggregator)


def test_fanin_one_completes_at_once():
    output = Aggregator(CONFIG).process(contribution((4, 5), fanin=1))
    assert describe_frame(output[0])["elements"] == [4, 5]


def test_duplicate_is_ignored_and_the_sum_stays_right():
    aggregator = Aggregator(CONFIG)
    aggregator.process(contribution((1, 1, 1), sender=0))
    assert disposition_of(aggregator, contribution((100, 100, 100), sender=0)) == (Disposition.DROP_DUPLICATE, [])
    aggregator.process(contribution((2, 2, 2), sender=1))
    result = aggregator.process(contribution((3, 3, 3), sender=2))
    assert describe_frame(result[0])["elements"] == [6, 6, 6]


@pytest.mark.parametrize("field, value", [("fanin", 4), ("group", 0xEF_00_00_09), ("exponent", -3)])
def test_contribution_disagreeing_with_the_slot_is_a_mismatch(field, value):
    aggregator = Aggregator(CONFIG)
    aggregator.process(contribution(sender=0))
    assert disposition_of(aggregator, contribution(sender=1, **{field: value}))[0] == Disposition.DROP_MISMATCH


def test_count_disagreeing_with_the_slot_is_a_mismatch():
    aggregator = Aggregator(CONFIG)
    aggregator.process(contribution((1, 2, 3), sender=0))
    assert disposition_of(aggregator, contribution((1, 2), sender=1))[0] == Disposition.DROP_MISMATCH


@pytest.mark.parametrize("sign", [1, -1])
def test_sums_saturate_and_set_the_overflow_flag(sign):
    aggregator = Aggregator(CONFIG)
    big = sign * (2**31 - 10)
    aggregator.process(contribution((big, 1, 0), sender=0))
    aggregator.process(contribution((big, 1, 0), sender=1))
    decoded = describe_frame(aggregator.process(contribution((-big, 1, 0), sender=2))[0])
    limit = 2**31 - 1 if sign > 0 else -2**31
    assert decoded["elements"] == [limit - big, 3, 0]
    assert decoded["overflow"]
    assert aggregator.stats()["saturations"] == 1


def test_retransmit_after_completion_gets_the_stored_result():
    aggregator = Aggregator(CONFIG)
    for sender in range(3):
        first = aggregator.process(contribution((sender, 1, 2), sender=sender))
    disposition, again = disposition_of(aggregator, contribution((0, 1, 2), sender=0))
    assert disposition == Disposition.ANSWERED
    original, repeated = describe_frame(first[0]), describe_frame(again[0])
    assert repeated["sender"] == 0 and original["sender"] == 2
    assert {**repeated, "sender": 2} == original
    assert aggregator.stats()["results_emitted"] == 2


def test_result_request_before_and_after_completion():
    aggregator = Aggregator(CONFIG)
    aggregator.process(contribution(sender=0))
    assert disposition_of(aggregator, result_request(sender=1)) == (Disposition.DROP_NO_RESULT, [])
    aggregator.process(contribution(sender=1))
    completed = aggregator.process(contribution(sender=2))
    disposition, answer = disposition_of(aggregator, result_request(sender=2))
    assert disposition == Disposition.ANSWERED and answer == completed
    assert disposition_of(aggregator, result_request(sender=2, round=5))[0] == Disposition.DROP_NO_RESULT


def test_completed_slot_is_reused_by_the_next_owner():
    aggregator = Aggregator(CONFIG)
    for sender in range(3):
        aggregator.process(contribution(sender=sender))
    aggregator.process(contribution((7, 7), fanin=2, sender=0, job=1, round=0))
    result = aggregator.process(contribution((1, 1), fanin=2, sender=1, job=1, round=0))
    assert describe_frame(result[0])["elements"] == [8, 8]
    assert aggregator.stats()["slots_reclaimed"] == 0


def test_newer_round_reclaims_an_unfinished_slot_and_others_collide():
    aggregator = Aggregator(CONFIG)
    aggregator.process(contribution((5, 5, 5), sender=0, round=4))
    assert disposition_of(aggregator, contribution(sender=1, job=10, round=9))[0] == Disposition.DROP_COLLISION
    assert disposition_of(aggregator, contribution(sender=1, round=3))[0] == Disposition.DROP_STALE
    assert disposition_of(aggregator, contribution(sender=1, round=4, clique=3))[0] == Disposition.DROP_COLLISION
    assert disposition_of(aggregator, contribution((1, 1, 1), sender=1, round=5))[0] == Disposition.ACCUMULATED
    assert aggregator.stats()["slots_reclaimed"] == 1
    aggregator.process(contribution((1, 1, 1), sender=0, round=5))
    result = aggregator.process(contribution((1, 1, 1), sender=2, round=5))
    assert describe_frame(result[0])["elements"] == [3, 3, 3]


def test_lease_keeps_a_live_slot_and_frees_an_idle_one():
    """Another owner collides until `lease` ticks pass without an accepted contribution, then claims the slot."""
    aggregator = Aggregator(AggregatorConfig(slots=8, max_elements=16, max_fanin=8, lease=100))
    aggregator.process(contribution(sender=0), now=1000)
    stranger = contribution((4, 4, 4), fanin=2, sender=0, job=77, round=1)
    aggregator.process(contribution(sender=1), now=1050)
    assert disposition_of(aggregator, contribution(sender=1, job=9, round=4))[0] == Disposition.DROP_DUPLICATE
    aggregator.process(stranger, now=1149)
    assert aggregator.stats()["drop_collision"] == 1
    assert aggregator.slots[1].key[0] == 9
    assert disposition_of(aggregator, stranger)[0] == Disposition.DROP_COLLISION
    aggregator.process(stranger, now=1150)
    assert aggregator.stats()["leases_expired"] == 1 and aggregator.slots[1].key == (77, 1, 2, 0)
    result = aggregator.process(contribution((1, 2, 3), fanin=2, sender=1, job=77, round=1), now=1150)
    assert describe_frame(result[0])["elements"] == [5, 6, 7]
    # The new owner's slot completed: it is free again, and the old owner's member claims it afresh.
    assert disposition_of(aggregator, contribution(sender=2))[0] == Disposition.ACCUMULATED


def test_lease_does_not_count_drops_as_activity():
    """Duplicates and result requests do not refresh the stamp; only accepted contributions do."""
    aggregator = Aggregator(AggregatorConfig(slots=8, max_elements=16, max_fanin=8, lease=10))
    aggregator.process(contribution(sender=0), now=5)
    aggregator.process(contribution(sender=0), now=14)
    aggregator.process(result_request(sender=1), now=14)
    stranger = contribution(fanin=2, sender=0, job=3)
    assert disposition_of(aggregator, stranger)[0] == Disposition.DROP_COLLISION
    aggregator.process(stranger, now=15)
    assert aggregator.stats()["leases_expired"] == 1


def test_lease_zero_never_expires_and_time_wraps():
    never = Aggregator(AggregatorConfig(slots=8, max_elements=16, max_fanin=8, lease=0))
    never.process(contribution(sender=0), now=0)
    never.process(contribution(fanin=2, job=3), now=2**TIME_BITS - 1)
    assert never.stats()["drop_collision"] == 1
    wrapping = Aggregator(AggregatorConfig(slots=8, max_elements=16, max_fanin=8, lease=10))
    wrapping.process(contribution(sender=0), now=2**TIME_BITS - 5)
    wrapping.process(contribution(fanin=2, job=3), now=2**TIME_BITS + 4)
    assert wrapping.stats()["drop_collision"] == 1
    wrapping.process(contribution(fanin=2, job=3), now=2**TIME_BITS + 5)
    assert wrapping.stats()["leases_expired"] == 1


def test_newer_round_takes_precedence_over_an_expired_lease():
    aggregator = Aggregator(AggregatorConfig(slots=8, max_elements=16, max_fanin=8, lease=10))
    aggregator.process(contribution(sender=0, round=4), now=0)
    aggregator.process(contribution(sender=0, round=5), now=100)
    assert (aggregator.stats()["slots_reclaimed"], aggregator.stats()["leases_expired"]) == (1, 0)


def test_a_completed_slot_is_free_at_once_whatever_the_lease():
    """The stored result answers retransmissions until another owner claims the slot, lease or not."""
    aggregator = Aggregator(AggregatorConfig(slots=8, max_elements=16, max_fanin=8, lease=1000))
    completed = [aggregator.process(contribution(sender=sender), now=0) for sender in range(3)][-1]
    assert aggregator.process(contribution(sender=2), now=5000) == completed
    assert disposition_of(aggregator, contribution(fanin=2, job=3))[0] == Disposition.ACCUMULATED
    assert aggregator.stats()["leases_expired"] == 0


def test_arrival_time_must_be_an_integer():
    with pytest.raises(TypeError):
        Aggregator(CONFIG).process(contribution(), now=1.5)
    with pytest.raises(ValueError):
        AggregatorConfig(lease=-1)


def test_round_order_wraps_around():
    assert round_is_newer(0, 2**32 - 1) and round_is_newer(5, 4)
    assert not round_is_newer(4, 5) and not round_is_newer(4, 4)


def test_stats_reply_goes_back_to_the_requester_with_counters_before_it():
    aggregator = Aggregator(CONFIG)
    aggregator.process(contribution(sender=0))
    aggregator.process(b"\x00" * 20)
    disposition, reply = disposition_of(aggregator, request(Opcode.STATS_REQUEST, udp_sport=40000))
    assert disposition == Disposition.ANSWERED
    packet = Ether(reply[0])
    assert packet[IP].dst == "10.0.0.5" and packet[UDP].dport == 40000
    counters = describe_frame(reply[0])["counters"]
    assert counters["frames_in"] == 2 and counters["accumulated"] == 1 and counters["drop_runt"] == 1
    assert counters["answered"] == 0


def _set(frame, name, value):
    frame = bytearray(frame)
    offset = FRAME_OFFSETS[name]
    size = parse_header(frame)[name].nbytes
    frame[offset:offset + size] = int(value).to_bytes(size, "big")
    return bytes(frame)


def _fix_ip_checksum(frame):
    header = parse_header(frame)
    rebuilt = bytearray(frame)
    ip = Ether(bytes(frame))[IP]
    del ip.chksum
    checksum = IP(raw(ip)).chksum
    offset = FRAME_OFFSETS["ip_csum"]
    rebuilt[offset:offset + 2] = checksum.to_bytes(2, "big")
    assert header["ip_csum"].nbytes == 2
    return bytes(rebuilt)


MALFORMED = {
    Disposition.DROP_RUNT: lambda: contribution()[:59],
    Disposition.DROP_IP_HEADER: lambda: _fix_ip_checksum(_set(contribution(), "ip_ver_ihl", 0x46)),
    Disposition.DROP_IP_FRAGMENT: lambda: contribution(ip_frag=0x2000),
    Disposition.DROP_IP_CHECKSUM: lambda: _set(contribution(), "ip_csum", 0x1234),
    Disposition.DROP_LENGTH: lambda: contribution()[:-4],
    Disposition.DROP_VERSION: lambda: contribution(version=3),
    Disposition.DROP_OPCODE: lambda: contribution(opcode=Opcode.RESULT),
    Disposition.DROP_FANIN: lambda: contribution(fanin=9, sender=0),
    Disposition.DROP_SENDER: lambda: contribution(sender=3),
    Disposition.DROP_COUNT: lambda: contribution(np.zeros(17, dtype=np.int64)),
    Disposition.DROP_GROUP: lambda: contribution(group=0x0A_00_00_01),
    Disposition.DROP_SLOT: lambda: contribution(slot=8),
}


@pytest.mark.parametrize("expected", list(MALFORMED), ids=lambda d: d.name.lower())
def test_each_malformed_class_is_dropped_and_leaves_state_alone(expected):
    aggregator = Aggregator(CONFIG)
    aggregator.process(contribution((1, 1, 1), sender=0))
    assert disposition_of(aggregator, MALFORMED[expected]()) == (expected, [])
    aggregator.process(contribution((1, 1, 1), sender=1))
    result = aggregator.process(contribution((1, 1, 1), sender=2))
    assert describe_frame(result[0])["elements"] == [3, 3, 3]
    assert_conserved(aggregator)


@pytest.mark.parametrize("frame, expected", [
    (lambda: contribution()[:127], Disposition.DROP_LENGTH),
    (lambda: contribution() + b"\x00" * 4, Disposition.DROP_LENGTH),
    (lambda: _fix_ip_checksum(_set(contribution(), "ip_len", len(contribution()) - 10)), Disposition.DROP_LENGTH),
    (lambda: _set(contribution(), "udp_len", 7), Disposition.DROP_LENGTH),
    (lambda: request(Opcode.STATS_REQUEST) + b"\x00" * 4, Disposition.DROP_LENGTH),
    (lambda: contribution(fanin=0), Disposition.DROP_FANIN),
], ids=["header cut", "extended", "ip length", "udp length", "long request", "fanin zero"])
def test_other_length_and_field_errors_are_dropped(frame, expected):
    assert disposition_of(Aggregator(CONFIG), frame()) == (expected, [])


FOREIGN = {
    "arp": Ether() / ARP(pdst="10.0.0.1"),
    "tcp": Ether() / IP(dst="10.73.87.1") / TCP(dport=18775) / Raw(b"x" * 80),
    "ipv6": Ether() / IPv6() / UDP(dport=18775) / Raw(b"x" * 100),
    "other udp": Ether() / IP(dst="10.73.87.1") / UDP(dport=4791) / Raw(b"x" * 100),
    "vlan": Ether() / Dot1Q(vlan=5) / IP(dst="10.73.87.1") / UDP(dport=18775) / Raw(b"x" * 120),
}


@pytest.mark.parametrize("name", list(FOREIGN))
def test_foreign_traffic_is_forwarded_byte_for_byte(name):
    frame = raw(FOREIGN[name])
    frame += b"\x00" * max(0, 60 - len(frame))
    assert disposition_of(Aggregator(CONFIG), frame) == (Disposition.FORWARDED, [frame])


def test_contribution_for_another_aggregator_passes_through():
    frame = contribution(ip_dst=0x0A_00_00_63)
    assert disposition_of(Aggregator(CONFIG), frame) == (Disposition.FORWARDED, [frame])


def test_random_traffic_is_accounted_for():
    aggregator = Aggregator(CONFIG)
    rng = np.random.default_rng(3)
    makers = list(MALFORMED.values()) + [lambda: contribution(sender=int(rng.integers(0, 3)),
                                                              slot=int(rng.integers(0, 8)))]
    for _ in range(300):
        frame = makers[rng.integers(len(makers))]()
        if rng.random() < 0.2:
            frame = bytes(rng.integers(0, 256, size=int(rng.integers(0, 200)), dtype=np.uint8))
        aggregator.process(frame)
    assert aggregator.stats()["frames_in"] == 300
    assert_conserved(aggregator)
    assert sum(aggregator.stats()[name] for name in DROP_COUNTERS) > 0


def test_multicast_mac_of_result_follows_the_group():
    aggregator = Aggregator(CONFIG)
    result = aggregator.process(contribution(fanin=1, group=0xEF_FF_00_01))[0]
    assert int.from_bytes(result[:6], "big") == multicast_mac(0xEF_FF_00_01)


@pytest.mark.parametrize("kwargs, error", [
    ({"slots": 0}, ValueError), ({"max_fanin": 65}, ValueError), ({"max_elements": 0}, ValueError),
    ({"ip": -1}, ValueError), ({"mac": "zz"}, ValueError), ({"slots": 2.5}, TypeError),
    ({"port": True}, TypeError),
])
def test_config_rejects_bad_values(kwargs, error):
    with pytest.raises(error):
        AggregatorConfig(**kwargs)


def test_process_rejects_non_bytes():
    with pytest.raises(TypeError):
        Aggregator(CONFIG).process("a string")
