"""The model's order of checks: for every pair of reasons a frame can fail at once, the earlier one decides.

docs/protocol.md lists `FRAME_CHECKS` and `SLOT_CHECKS` as the order; these tests hold the model to it by
building, for each pair of steps, one frame that fails both.
"""

import itertools
from dataclasses import replace

import numpy as np
import pytest

from inwire.jobs import CliqueRoute, JobEntry
from inwire.model import FRAME_CHECKS, JOB_DISPOSITIONS, SLOT_CHECKS, Aggregator, AggregatorConfig
from inwire.packets import build_frames, ipv4_checksums
from inwire.protocol import (
    FIELDS_BY_NAME,
    FRAME_HEADER_BYTES,
    FRAME_OFFSETS,
    JOB_VERSION,
    VERSION,
    Disposition,
    Opcode,
)

CONFIG = AggregatorConfig(slots=16, max_elements=16, max_fanin=8, registered=True)
MEMBER = (0x0A_00_00_05, 4000)
JOB = JobEntry(job=9, token=0x5EC2E7_0000_0001, slots=6, members=frozenset({MEMBER}), group=0xEF_01_02_03)
BASE = {"eth_dst": CONFIG.mac, "eth_src": 0x02_00_00_00_00_05, "ip_src": MEMBER[0], "udp_sport": MEMBER[1],
        "ip_dst": CONFIG.ip, "opcode": Opcode.CONTRIBUTION, "fanin": 3, "sender": 0, "group": JOB.group, "slot": 1,
        "job": JOB.job, "token": JOB.token, "version": JOB_VERSION, "round": 4, "clique": 2, "chunk": 0}
OPEN = {"version": VERSION, "token": 0, "slot": 15}
"""A version 2 frame at the same aggregator, which takes unregistered frames too, in a slot no job holds."""


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
    {"fields": {"version": 4}},
    {"fields": {"opcode": Opcode.STATS_REPLY}},
    {"edit": lambda frame: frame + bytes(4)},
    {"fields": {"job": 10}},
    {"fields": {"token": JOB.token ^ 1}},
    {"fields": {"udp_sport": MEMBER[1] + 1}},
    {"fields": {"opcode": Opcode.STATS_REQUEST, "elements": ()}},
    {"fields": {"fanin": 0}},
    {"fields": {"sender": 3}},
    {"fields": {"elements": np.zeros(CONFIG.max_elements + 1, dtype=np.int64)}},
    {"fields": {"group": 0x0A_00_00_01}},
    {"fields": {"slot": JOB.slots}},
    {"fields": {"hop1": CONFIG.ip}},
)
"""Each step's failure for a version 3 frame of the registered job; a version 2 frame fails the same steps the
same way, except the job's (DROP_JOB, DROP_TOKEN, DROP_MEMBER), which it never reaches, and the slot's,
which it meets beyond the aggregator's slots."""
OPEN_FAILURES = {17: {"fields": {"slot": CONFIG.slots}}}


def with_checksum(frame):
    """The frame (a bytearray) with its IPv4 header checksum made right."""
    offset = FRAME_OFFSETS["ip_csum"]
    checksum = int(ipv4_checksums(np.frombuffer(bytes(frame), dtype=np.uint8)[np.newaxis])[0])
    frame[offset:offset + 2] = checksum.to_bytes(2, "big")
    return bytes(frame)


def contribution(elements=(1, 2, 3), **fields):
    return bytes(build_frames(np.asarray(elements, dtype=np.int64), **dict(BASE, **fields))[0])


def frame_failing(*steps, version=JOB_VERSION):
    """A contribution that fails each of the given FRAME_CHECKS steps (0-based)."""
    fields, patches, edits = dict(OPEN) if version != JOB_VERSION else {}, {}, []
    for step in steps:
        failure = OPEN_FAILURES.get(step, FAILURES[step]) if version != JOB_VERSION else FAILURES[step]
        fields.update(failure.get("fields", {}))
        patches.update(failure.get("patch", {}))
        edits += [failure["edit"]] if "edit" in failure else []
    frame = bytearray(contribution(**fields))
    for name, value in patches.items():
        offset, nbytes = FRAME_OFFSETS[name], FIELDS_BY_NAME[name].nbytes
        frame[offset:offset + nbytes] = value.to_bytes(nbytes, "big")
    frame = with_checksum(frame)
    for edit in reversed(edits):
        frame = edit(frame)
    return frame


def aggregator_with_job(config=CONFIG):
    aggregator = Aggregator(config)
    aggregator.install(JOB)
    return aggregator


def disposition(frame, aggregator=None):
    aggregator = aggregator or aggregator_with_job()
    before = aggregator.stats()
    aggregator.process(frame)
    after = aggregator.stats()
    return next(d for d in Disposition if after[d.name.lower()] != before[d.name.lower()])


def test_every_step_has_a_failure():
    assert len(FAILURES) == len(FRAME_CHECKS)


@pytest.mark.parametrize("step", range(len(FRAME_CHECKS)), ids=lambda step: f"step{step + 1}")
def test_each_failure_reaches_its_own_step(step):
    assert disposition(frame_failing(step)) == FRAME_CHECKS[step][0]


OPEN_STEPS = [step for step, (d, _, _) in enumerate(FRAME_CHECKS) if d not in JOB_DISPOSITIONS]


@pytest.mark.parametrize("step", OPEN_STEPS, ids=lambda step: f"step{step + 1}")
def test_a_version_2_frame_fails_each_step_as_before(step):
    assert disposition(frame_failing(step, version=VERSION)) == FRAME_CHECKS[step][0]


def test_version_2_frames_count_only_where_unregistered_frames_are_taken():
    closed = aggregator_with_job(replace(CONFIG, unregistered=False))
    assert disposition(frame_failing(version=VERSION), closed) == Disposition.DROP_VERSION
    assert disposition(frame_failing(version=VERSION)) == Disposition.ACCUMULATED


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


def _completed(fanin=1, chunk=0, **fields):
    aggregator = aggregator_with_job()
    aggregator.install(TREE_JOB)
    for sender in range(fanin):
        aggregator.process(contribution(fanin=fanin, sender=sender, chunk=chunk, **fields))
    return aggregator


def _started(**fields):
    aggregator = aggregator_with_job()
    aggregator.process(contribution(**fields))
    return aggregator


PARENT = (0x0A_00_01_01, 5000)
TREE_JOB = replace(JOB, job=11, routes={2: CliqueRoute(parent=PARENT)})
"""A job whose clique 2 goes on up from this aggregator, to PARENT."""


def _tree_completed():
    return _completed(3, job=TREE_JOB.job)


def _tree_started():
    aggregator = _completed(0)
    aggregator.process(contribution(job=TREE_JOB.job))
    return aggregator


def _tree_relayed():
    aggregator = _tree_completed()
    aggregator.process(result_from_parent())
    return aggregator


def result_from_parent(**fields):
    frame = build_frames(np.array([3, 6, 9]), status=0, **dict(BASE, opcode=Opcode.RESULT, ip_src=PARENT[0],
                                                                 udp_sport=PARENT[1], job=TREE_JOB.job, fanin=3,
                                                                 bitmap=0b111, **fields))
    return bytes(frame[0])


SLOT_CASES = {
    # name: (the slot's state, the frame, the SLOT_CHECKS step that must decide); the name says which later
    # step the frame also meets.
    "result from the parent is relayed": (_tree_completed, result_from_parent, 0),
    "result from the parent of another shape": (_tree_completed, lambda: result_from_parent(exponent=-1), 1),
    "result from the parent twice": (_tree_relayed, result_from_parent, 2),
    "result from the parent before the level completes": (_tree_started, result_from_parent, 3),
    "stored result before no result": (lambda: _completed(3), lambda: result_request(fanin=3), 4),
    "request for another owner": (lambda: _completed(3), lambda: result_request(fanin=3, round=5), 5),
    "mismatch before stored answer": (lambda: _completed(1), lambda: contribution(fanin=1, exponent=-2), 6),
    "mismatch before duplicate": (_started, lambda: contribution(exponent=-2), 6),
    "stored answer before duplicate": (lambda: _completed(1), lambda: contribution(fanin=1), 7),
    "stale before collision": (_started, lambda: contribution(round=3, sender=1), 9),
    "stale before claiming a completed slot": (lambda: _completed(1), lambda: contribution(fanin=1, round=3), 9),
    "earlier chunk is stale before claiming": (lambda: _completed(1, chunk=16), lambda: contribution(fanin=1), 9),
    "collision before accumulation": (lambda: _started(**OPEN), lambda: contribution(job=10, sender=1, **OPEN), 10),
    "newer round of the same job reclaims instead of colliding": (_started, lambda: contribution(round=5, sender=1),
                                                                  11),
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


def test_a_version_2_frame_never_touches_a_registered_job_s_slots():
    assert disposition(contribution(**dict(OPEN, slot=1))) == Disposition.DROP_SLOT
