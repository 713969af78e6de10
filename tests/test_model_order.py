"""The model's order of checks: for every pair of reasons a frame can fail at once, the earlier one decides.

docs/protocol.md lists `FRAME_CHECKS` and `SLOT_CHECKS` as the order; these tests hold the model to it by
building, for each pair of steps, one frame that fails both.
"""

import itertools

import numpy as np
import pytest

from inwire.model import FRAME_CHECKS, SLOT_CHECKS, Aggregator, AggregatorConfig
from inwire.packets import build_frames, ipv4_checksums
from inwire.protocol import FIELDS_BY_NAME, FRAME_HEADER_BYTES, FRAME_OFFSETS, Disposition, Opcode

CONFIG = AggregatorConfig(slots=8, max_elements=16, max_fanin=8)
BASE = {"eth_dst": CONFIG.mac, "eth_src": 0x02_00_00_00_00_05, "ip_src": 0x0A_00_00_05, "ip_dst": CONFIG.ip,
        "opcode": Opcode.CONTRIBUTION, "fanin": 3, "sender": 0, "group": 0xEF_01_02_03, "slot": 1, "job": 9,
        "round": 4, "clique": 2, "chunk": 0}


def truncate(length):
    return lambda frame: frame[:length]


def flip_checksum(frame):
    offset = FRAME_OFFSETS["ip_csum"]
    return frame[:offset] + bytes([frame[offset] ^ 0x5A]) + frame[offset + 1:]


# Per step of FRAME_CHECKS, how a good contribution is made to fail it: builder fields (`elements` included),
# header bytes patched after building, and edits of the finished frame.
FAILURES = (
    {"edit": truncate(59)},
    {"fields": {"ip_dst": 0x0A_00_00_63}},
    {"patch": {"ip_ver_ihl": 0x46}},
    {"fields": {"ip_frag": 0x2000}},
    {"edit": flip_checksum},
    {"edit": truncate(100)},
    {"fields": {"version": 3}},
    {"fields": {"opcode": Opcode.RESULT}},
    {"edit": lambda frame: frame + bytes(4)},
    {"fields": {"opcode": Opcode.STATS_REQUEST, "elements": ()}},
    {"fields": {"fanin": 0}},
    {"fields": {"sender": 3}},
    {"fields": {"elements": np.zeros(CONFIG.max_elements + 1, dtype=np.int64)}},
    {"fields": {"group": 0x0A_00_00_01}},
    {"fields": {"slot": CONFIG.slots}},
    {"fields": {"hop1": CONFIG.ip}},
)


def with_checksum(frame):
    """The frame (a bytearray) with its IPv4 header checksum made right."""
    offset = FRAME_OFFSETS["ip_csum"]
    checksum = int(ipv4_checksums(np.frombuffer(bytes(frame), dtype=np.uint8)[np.newaxis])[0])
    frame[offset:offset + 2] = checksum.to_bytes(2, "big")
    return bytes(frame)


def contribution(elements=(1, 2, 3), **fields):
    return bytes(build_frames(np.asarray(elements, dtype=np.int64), **dict(BASE, **fields))[0])


def frame_failing(*steps):
    """A contribution that fails each of the given FRAME_CHECKS steps (0-based)."""
    fields, patches, edits = {}, {}, []
    for step in steps:
        fields.update(FAILURES[step].get("fields", {}))
        patches.update(FAILURES[step].get("patch", {}))
        edits += [FAILURES[step]["edit"]] if "edit" in FAILURES[step] else []
    frame = bytearray(contribution(**fields))
    for name, value in patches.items():
        offset, nbytes = FRAME_OFFSETS[name], FIELDS_BY_NAME[name].nbytes
        frame[offset:offset + nbytes] = value.to_bytes(nbytes, "big")
    frame = with_checksum(frame)
    for edit in reversed(edits):
        frame = edit(frame)
    return frame


def disposition(frame):
    aggregator = Aggregator(CONFIG)
    before = aggregator.stats()
    aggregator.process(frame)
    after = aggregator.stats()
    return next(d for d in Disposition if after[d.name.lower()] != before[d.name.lower()])


def test_every_step_has_a_failure():
    assert len(FAILURES) == len(FRAME_CHECKS)


@pytest.mark.parametrize("step", range(len(FRAME_CHECKS)), ids=lambda step: f"step{step + 1}")
def test_each_failure_reaches_its_own_step(step):
    assert disposition(frame_failing(step)) == FRAME_CHECKS[step][0]


def _compatible(first, second):
    """Two failures can be built into one frame unless they set the same field."""
    a, b = FAILURES[first].get("fields", {}), FAILURES[second].get("fields", {})
    return not set(a) & set(b)


PAIRS = [pair for pair in itertools.combinations(range(len(FRAME_CHECKS)), 2) if _compatible(*pair)]


@pytest.mark.parametrize("earlier, later", PAIRS, ids=[f"step{a + 1}-before-step{b + 1}" for a, b in PAIRS])
def test_the_earlier_of_two_failed_checks_decides(earlier, later):
    assert disposition(frame_failing(earlier, later)) == FRAME_CHECKS[earlier][0]


def result_request(**fields):
    """The bare 128-byte header; its count still names the slot's vector."""
    frame = bytearray(contribution(opcode=Opcode.RESULT_REQUEST, **fields)[:FRAME_HEADER_BYTES])
    for name, value in (("ip_len", FRAME_HEADER_BYTES - 14), ("udp_len", FRAME_HEADER_BYTES - 34)):
        frame[FRAME_OFFSETS[name]:FRAME_OFFSETS[name] + 2] = value.to_bytes(2, "big")
    return with_checksum(frame)


def _completed(fanin=1, chunk=0):
    aggregator = Aggregator(CONFIG)
    for sender in range(fanin):
        aggregator.process(contribution(fanin=fanin, sender=sender, chunk=chunk))
    return aggregator


def _started():
    aggregator = Aggregator(CONFIG)
    aggregator.process(contribution())
    return aggregator


SLOT_CASES = {
    # name: (the slot's state, the frame, the SLOT_CHECKS step that must decide); the name says which later
    # step the frame also meets.
    "stored result before no result": (lambda: _completed(3), lambda: result_request(fanin=3), 0),
    "request for another owner": (lambda: _completed(3), lambda: result_request(fanin=3, round=5), 1),
    "mismatch before stored answer": (lambda: _completed(1), lambda: contribution(fanin=1, exponent=-2), 2),
    "mismatch before duplicate": (_started, lambda: contribution(exponent=-2), 2),
    "stored answer before duplicate": (lambda: _completed(1), lambda: contribution(fanin=1), 3),
    "stale before collision": (_started, lambda: contribution(round=3, sender=1), 5),
    "stale before claiming a completed slot": (lambda: _completed(1), lambda: contribution(fanin=1, round=3), 5),
    "earlier chunk is stale before claiming": (lambda: _completed(1, chunk=16), lambda: contribution(fanin=1), 5),
    "collision before accumulation": (_started, lambda: contribution(job=10, sender=1), 6),
    "newer round of the same job reclaims instead of colliding": (_started, lambda: contribution(round=5, sender=1), 7),
}


@pytest.mark.parametrize("name", list(SLOT_CASES))
def test_slot_checks_decide_in_order(name):
    make_state, make_frame, decides = SLOT_CASES[name]
    aggregator = make_state()
    before = aggregator.stats()
    aggregator.process(make_frame())
    after = aggregator.stats()
    got = next(d for d in Disposition if after[d.name.lower()] != before[d.name.lower()])
    assert got == SLOT_CHECKS[decides][0], (got, SLOT_CHECKS[decides][1])
