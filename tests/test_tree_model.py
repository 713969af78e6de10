"""Reduction trees in the golden model: member bitmaps, levels, partials up the tree, recovery, version 1.

The expectations here are written from the protocol's rules (sums of the members' vectors, the header
fields a partial carries), not from the model, since the model is what they define."""

import numpy as np
import pytest

from inwire.model import Aggregator, AggregatorConfig
from inwire.packets import build_frames, ipv4_header_valid, mac_int, parse_header
from inwire.protocol import (
    ELEMENT_DTYPE,
    FRAME_HEADER_BYTES,
    FRAME_OFFSETS,
    INT32_MAX,
    RESULT_TRAILER_BYTES,
    STATUS_OVERFLOW,
    Disposition,
    Opcode,
    frame_bytes,
    multicast_mac,
)

GROUP = 0xEF_00_01_02
CHILD = AggregatorConfig(ip=0x0A_00_00_0B, mac=0x02_00_00_00_00_0B, gateway_mac=0x02_00_00_00_00_FE)
MIDDLE = AggregatorConfig(ip=0x0A_00_00_0C, mac=0x02_00_00_00_00_0C)
ROOT = AggregatorConfig(ip=0x0A_00_00_0D, mac=0x02_00_00_00_00_0D)
VECTORS = np.array([[1, 2, 3], [10, 20, 30], [100, 200, 300], [1000, 2000, 3000]])


def frame(to, elements, sender=0, opcode=Opcode.CONTRIBUTION, status=None, **fields):
    values = {"eth_dst": to.mac, "eth_src": 0x02_00_00_00_00_05, "ip_src": 0x0A_00_00_05, "ip_dst": to.ip,
              "udp_dport": to.port, "opcode": opcode, "fanin": 4, "sender": sender, "group": GROUP,
              "slot": 3, "job": 7, "round": 2, "clique": 1, "chunk": 0, "bitmap": 1 << sender}
    values.update(fields)
    return bytes(build_frames(np.asarray(elements, dtype=np.int64), status=status, **values)[0])


def leaf_to_child(sender, **fields):
    """Members 0 and 1 sum at CHILD, whose partial goes to the root, which also takes members 2 and 3."""
    return frame(CHILD, VECTORS[sender], sender, **{"expect": 0b0011, "hop1": ROOT.ip, **fields})


def leaf_to_root(sender, **fields):
    return frame(ROOT, VECTORS[sender], sender, **fields)


def elements_of(output):
    count = int(parse_header(output)["count"])
    return np.frombuffer(output, dtype=ELEMENT_DTYPE, count=count, offset=FRAME_HEADER_BYTES).tolist()


def without_sender(output):
    """An answer names the member whose frame caused it; everything else of a stored output repeats."""
    at = FRAME_OFFSETS["sender"]
    return output[:at] + output[at + 1:]


def status_of(output):
    return int.from_bytes(output[-RESULT_TRAILER_BYTES:], "big")


def act(aggregator, frame_bytes_):
    """(disposition, outputs) of one frame: the disposition is the one counter that moved."""
    before = aggregator.stats()
    outputs = aggregator.process(frame_bytes_)
    moved = [d for d in Disposition if aggregator.stats()[d.name.lower()] != before[d.name.lower()]]
    assert len(moved) == 1
    return moved[0], outputs


def test_a_child_level_completes_into_a_partial_for_its_parent():
    child = Aggregator(CHILD)
    assert act(child, leaf_to_child(0)) == (Disposition.ACCUMULATED, [])
    disposition, (partial,) = act(child, leaf_to_child(1))
    assert disposition == Disposition.ACCUMULATED
    header = parse_header(partial)
    assert header["opcode"] == Opcode.PARTIAL and header["version"] == 2
    assert (header["ip_dst"], header["ip_src"], header["udp_dport"]) == (ROOT.ip, CHILD.ip, CHILD.port)
    assert (mac_int(header["eth_dst"]), mac_int(header["eth_src"])) == (CHILD.gateway_mac, CHILD.mac)
    # The partial arrives at the root's level: the whole clique, the root's hops empty.
    assert (header["bitmap"], header["expect"], header["hop1"], header["hop2"]) == (0b0011, 0, 0, 0)
    assert header["contributors"] == 2 and header["fanin"] == 4
    assert len(partial) == frame_bytes(3, Opcode.PARTIAL) and ipv4_header_valid(partial)
    assert elements_of(partial) == [11, 22, 33] and status_of(partial) == 0
    assert child.stats()["partials_emitted"] == 1 and child.stats()["results_emitted"] == 0


@pytest.mark.parametrize("partial_first", [True, False], ids=["partial_first", "leaves_first"])
def test_the_root_sums_a_partial_with_its_own_members(partial_first):
    child, root = Aggregator(CHILD), Aggregator(ROOT)
    child.process(leaf_to_child(0))
    (partial,) = child.process(leaf_to_child(1))
    arrivals = [partial, leaf_to_root(2), leaf_to_root(3)]
    if not partial_first:
        arrivals = arrivals[1:] + arrivals[:1]
    outputs = [act(root, each) for each in arrivals]
    assert [d for d, _ in outputs] == [Disposition.ACCUMULATED] * 3
    assert [len(o) for _, o in outputs] == [0, 0, 1]
    result = outputs[-1][1][0]
    header = parse_header(result)
    assert header["opcode"] == Opcode.RESULT and header["ip_dst"] == GROUP
    assert mac_int(header["eth_dst"]) == multicast_mac(GROUP)
    assert (header["bitmap"], header["contributors"], header["expect"], header["hop1"]) == (0b1111, 4, 0, 0)
    assert elements_of(result) == VECTORS.sum(axis=0).tolist() and status_of(result) == 0


def test_a_three_level_path_moves_its_hops_up_one_level_per_partial():
    child, middle, root = Aggregator(CHILD), Aggregator(MIDDLE), Aggregator(ROOT)
    route = dict(expect=0b0011, hop1=MIDDLE.ip, hop1_expect=0b0111, hop2=ROOT.ip, hop2_expect=0)
    child.process(frame(CHILD, VECTORS[0], 0, **route))
    (partial,) = child.process(frame(CHILD, VECTORS[1], 1, **route))
    header = parse_header(partial)
    assert (header["ip_dst"], header["expect"], header["hop1"], header["hop1_expect"], header["hop2"]) == (
        MIDDLE.ip, 0b0111, ROOT.ip, 0, 0)
    assert middle.process(partial) == []
    (upper,) = middle.process(frame(MIDDLE, VECTORS[2], 2, expect=0b0111, hop1=ROOT.ip))
    header = parse_header(upper)
    assert (header["ip_dst"], header["bitmap"], header["expect"], header["hop1"]) == (ROOT.ip, 0b0111, 0, 0)
    assert root.process(upper) == []
    (result,) = root.process(leaf_to_root(3))
    assert elements_of(result) == VECTORS.sum(axis=0).tolist()


def test_an_overlapping_member_set_is_a_duplicate_and_never_summed_twice():
    child, root = Aggregator(CHILD), Aggregator(ROOT)
    child.process(leaf_to_child(0))
    (partial,) = child.process(leaf_to_child(1))
    assert parse_header(partial)["sender"] == 1
    root.process(leaf_to_root(0))  # member 0 also came straight to the root
    # The partial's sender, member 1, is new to the slot; its member 0 is not.
    assert act(root, partial) == (Disposition.DROP_DUPLICATE, [])
    root.process(leaf_to_root(1))
    root.process(leaf_to_root(2))
    (result,) = root.process(leaf_to_root(3))
    assert elements_of(result) == VECTORS.sum(axis=0).tolist()
    assert root.stats()["drop_duplicate"] == 1


def test_a_lost_partial_is_sent_again_when_a_member_retransmits_to_its_child():
    child, root = Aggregator(CHILD), Aggregator(ROOT)
    child.process(leaf_to_child(0))
    (lost,) = child.process(leaf_to_child(1))
    root.process(leaf_to_root(2))
    root.process(leaf_to_root(3))
    disposition, (again,) = act(child, leaf_to_child(0))
    assert disposition == Disposition.ANSWERED and without_sender(again) == without_sender(lost)
    assert parse_header(again)["sender"] == 0
    (result,) = root.process(again)
    assert elements_of(result) == VECTORS.sum(axis=0).tolist()
    # The partial retransmitted once more, after the root completed: the root answers with its result.
    disposition, (answer,) = act(root, child.process(leaf_to_child(1))[0])
    assert disposition == Disposition.ANSWERED and without_sender(answer) == without_sender(result)
    # A result request to the child walks up the same way.
    request = frame(CHILD, np.zeros(0, dtype=np.int64), 0, opcode=Opcode.RESULT_REQUEST, expect=0b0011,
                    hop1=ROOT.ip)
    at = FRAME_OFFSETS["count"]
    request = request[:at] + (3).to_bytes(2, "big") + request[at + 2:]
    assert [without_sender(each) for each in child.process(request)] == [without_sender(lost)]


def test_saturation_in_a_child_reaches_the_root_result():
    child, root = Aggregator(CHILD), Aggregator(ROOT)
    child.process(frame(CHILD, [INT32_MAX, 0, 0], 0, expect=0b0011, hop1=ROOT.ip))
    (partial,) = child.process(frame(CHILD, [1, 0, 0], 1, expect=0b0011, hop1=ROOT.ip))
    assert status_of(partial) == STATUS_OVERFLOW and elements_of(partial)[0] == INT32_MAX
    root.process(partial)
    root.process(frame(ROOT, [-5, 0, 0], 2))
    (result,) = root.process(frame(ROOT, [-7, 0, 0], 3))
    assert status_of(result) == STATUS_OVERFLOW and elements_of(result)[0] == INT32_MAX - 12
    # The root itself saturated nothing: its counter says so.
    assert child.stats()["saturations"] == 1 and root.stats()["saturations"] == 0


def test_a_partial_flag_alone_sets_the_overflow():
    root = Aggregator(ROOT)
    root.process(frame(ROOT, VECTORS[0] + VECTORS[1], 0, opcode=Opcode.PARTIAL, status=STATUS_OVERFLOW,
                       bitmap=0b0011))
    root.process(leaf_to_root(2))
    (result,) = root.process(leaf_to_root(3))
    assert status_of(result) == STATUS_OVERFLOW and elements_of(result) == VECTORS.sum(axis=0).tolist()


@pytest.mark.parametrize("fields, why", [
    ({"bitmap": 0b0100}, "member outside the level"),
    ({"expect": 0b10011}, "level beyond the fan-in"),
    ({"bitmap": 0b1_0000, "expect": 0}, "member beyond the fan-in"),
])
def test_members_that_do_not_fit_the_level_are_dropped(fields, why):
    child = Aggregator(CHILD)
    assert act(child, leaf_to_child(0, **fields)) == (Disposition.DROP_SENDER, []), why


def test_another_level_for_the_same_slot_is_a_mismatch():
    child = Aggregator(CHILD)
    child.process(leaf_to_child(0))
    assert act(child, leaf_to_child(1, expect=0b0111)) == (Disposition.DROP_MISMATCH, [])


def test_a_partial_length_includes_its_trailer():
    root = Aggregator(ROOT)
    partial = frame(ROOT, VECTORS[0], 0, opcode=Opcode.PARTIAL, status=0, bitmap=0b0011)
    trailerless = frame(ROOT, VECTORS[0], 0, opcode=Opcode.PARTIAL, bitmap=0b0011)
    assert act(root, trailerless) == (Disposition.DROP_LENGTH, [])
    assert act(root, partial) == (Disposition.ACCUMULATED, [])


def test_a_version_1_frame_is_a_flat_one_member_contribution_answered_in_version_1():
    root = Aggregator(ROOT)
    # Version 1 had no tree fields: whatever those bytes hold, the frame holds its sender alone.
    v1 = [frame(ROOT, VECTORS[i], i, version=1, bitmap=0b1111, expect=0b0001, hop1=CHILD.ip) for i in range(4)]
    assert [act(root, each)[0] for each in v1[:3]] == [Disposition.ACCUMULATED] * 3
    (result,) = root.process(v1[3])
    header = parse_header(result)
    assert header["version"] == 1 and header["opcode"] == Opcode.RESULT and header["ip_dst"] == GROUP
    assert elements_of(result) == VECTORS.sum(axis=0).tolist()
    assert act(root, frame(ROOT, VECTORS[0], 0, version=3)) == (Disposition.DROP_VERSION, [])
