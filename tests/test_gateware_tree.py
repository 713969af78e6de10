"""A registered job's tree route in the gateware's job tables (inwire_hdl.job_table): the route words of
the control map, the writes that install them, and (co-simulated with the golden model at both widths)
the gateware in a registered tree, as a leaf, a middle and a root aggregator: its children's partials
taken, its level's partial to the parent, the parent's result relayed down to the group; and the tree's
mutants caught."""

import pathlib
import random
import re
import shutil
from dataclasses import replace

import numpy as np
import pytest

from inwire.jobs import CliqueRoute, JobEntry, JobLimits, JobTableError
from inwire.model import Aggregator as Model
from inwire.model import AggregatorConfig
from inwire.packets import build_frames, frame_field
from inwire.protocol import JOB_VERSION, STATUS_OVERFLOW, Opcode
from inwire_hdl.cocotb.traffic import HOST_IP, Traffic
from inwire_hdl.job_table import (
    CHILD_WORDS,
    JOB_WORDS,
    ROUTE_WORDS,
    TREE_LIMITS,
    ControlMap,
    check_limits,
)

MAP = ControlMap(jobs=2, members=2, routes=2)
PARENT = (0x0A000001, 7001)
MEMBERS = frozenset({(0x0A000102, 40001), (0x0A000102, 40002)})


def routed_entry(routes=None):
    return JobEntry(job=77, token=0x1234_5678_9ABC_DEF0, slots=2, members=MEMBERS, group=0xEF000001,
                    routes={5: CliqueRoute(level=0b0011, parent=PARENT)} if routes is None else routes)


def test_route_words_follow_the_members_and_the_stride_grows_to_hold_them():
    assert MAP.stride == 32  # 7 job words, 4 member words, 10 route words
    first = len(JOB_WORDS) + 2 * MAP.members
    assert [MAP.route_word(1, 1, name) for name in ROUTE_WORDS] == [32 + first + 5 + n for n in range(5)]
    assert ControlMap(4, 8).stride == ControlMap(4, 8, 0).stride == 32


def test_install_writes_a_route_while_the_entry_is_invalid_its_valid_bit_last():
    writes = MAP.install(1, routed_entry(), base=3, new=False)
    words = dict(writes)
    at = {name: MAP.route_word(1, 0, name) for name in ROUTE_WORDS}
    assert words[at["level_low"]] == 0b0011 and words[at["level_high"]] == 0
    assert words[at["parent_address"]] == PARENT[0] and words[at["parent_port"]] == PARENT[1] | 1 << 16
    assert words[at["clique"]] == 5 | 1 << 16
    assert words[MAP.route_word(1, 1, "clique")] == 0  # the unused route is written invalid
    order = [address for address, _ in writes]
    valid = MAP.word(1, "valid")
    assert writes[0] == (valid, 0) and writes[-1] == (valid, 1)
    assert max(order.index(at[name]) for name in ROUTE_WORDS if name != "clique") < order.index(at["clique"])


def test_install_writes_routes_in_clique_order_and_a_root_route_without_parent():
    entry = routed_entry({9: CliqueRoute(level=1 << 40), 2: CliqueRoute(level=0b01, parent=PARENT)})
    words = dict(MAP.install(0, entry, base=0, new=True))
    assert words[MAP.route_word(0, 0, "clique")] == 2 | 1 << 16
    assert words[MAP.route_word(0, 1, "clique")] == 9 | 1 << 16
    assert words[MAP.route_word(0, 1, "level_high")] == 1 << 8
    assert words[MAP.route_word(0, 1, "parent_port")] == 0  # rooted here: no parent


def test_install_refuses_what_the_route_words_cannot_hold():
    many = {clique: CliqueRoute(parent=PARENT) for clique in range(3)}
    with pytest.raises(JobTableError, match="job 77: 3 routes, more than the 2 an aggregator holds per job"):
        MAP.install(0, routed_entry(many), base=0, new=True)
    with_child = {4: CliqueRoute(level=0b11, parent=PARENT, children={(0x0A000203, 7002): 0b10})}
    with pytest.raises(JobTableError, match="job 77, clique 4: 1 child aggregators, more than the 0 a route holds"):
        MAP.install(0, routed_entry(with_child), base=0, new=True)


def test_install_writes_children_in_endpoint_order_before_their_routes_valid_bit():
    routed = ControlMap(jobs=1, members=2, routes=1, children=2)
    assert routed.stride == 32 and routed.route_stride == 13  # 7 + 4 + 13 words
    child, other = (0x0A000203, 7002), (0x0A000204, 7001)
    entry = routed_entry({4: CliqueRoute(level=0b11 << 32 | 0b0110, parent=PARENT, children={other: 1 << 33,
                                                                                          child: 0b0110})})
    writes = routed.install(0, entry, base=0, new=True)
    words, order = dict(writes), [address for address, _ in writes]
    first = {name: routed.child_word(0, 0, 0, name) for name in CHILD_WORDS}
    assert first["child_address"] == routed.route_word(0, 0, "parent_port") + 1
    assert [words[first[name]] for name in CHILD_WORDS] == [child[0], 0b0110, 0, child[1] | 1 << 16]
    second = routed.child_word(0, 0, 1, "child_members_high")
    assert words[second] == 2 and words[second + 1] == other[1] | 1 << 16
    assert max(order.index(address) for address in first.values()) < order.index(routed.route_word(0, 0, "clique"))
    lone = routed.install(0, routed_entry({4: CliqueRoute(level=0b11, children={child: 0b10})}), base=0, new=True)
    assert dict(lone)[routed.child_word(0, 0, 1, "child_port")] == 0  # the unused child is written invalid


def test_check_limits_takes_routes_and_children_within_the_gateware():
    check_limits(TREE_LIMITS)
    with pytest.raises(ValueError, match="0 to 8 routes per job, got 9"):
        check_limits(replace(TREE_LIMITS, routes=9))
    with pytest.raises(ValueError, match="0 to 4 child aggregators per route .none without routes., got 5 with 2"):
        check_limits(replace(TREE_LIMITS, children=5))
    with pytest.raises(ValueError, match="got 1 with 0 routes"):
        check_limits(JobLimits(jobs=4, members=8, routes=0, children=1, unicast_results=False))
    with pytest.raises(ValueError, match="holds no job without a group"):
        check_limits(replace(TREE_LIMITS, unicast_results=True))


def test_the_routed_register_map_in_docs_is_the_control_maps():
    doc = (pathlib.Path(__file__).resolve().parents[1] / "docs" / "board.md").read_text()
    routed = ControlMap(4, 8, 2, 2)
    assert routed.markdown() in doc
    rows = {name: (int(stride), int(offset), int(words)) for stride, offset, words, name in
            re.findall(r"^\| (\d+)·e \+ (\d+) \+ (\d+)·r \| `(\w+)` \|", doc, re.MULTILINE)}
    children = {name: tuple(int(number) for number in numbers) for *numbers, name in
                re.findall(r"^\| (\d+)·e \+ (\d+) \+ (\d+)·r \+ (\d+)·c \| `(\w+)` \|", doc, re.MULTILINE)}
    assert set(rows) == set(ROUTE_WORDS) and set(children) == set(CHILD_WORDS)
    for index in range(routed.jobs):
        for route in range(routed.routes):
            for name, (stride, offset, words) in rows.items():
                assert stride * index + offset + words * route == routed.route_word(index, route, name)
            for child in range(routed.children):
                for name, (stride, offset, words, child_words) in children.items():
                    assert (stride * index + offset + words * route + child_words * child
                            == routed.child_word(index, route, child, name))


TREE_CONFIG = AggregatorConfig(slots=4, max_elements=16, max_fanin=4, registered=True, limits=TREE_LIMITS)
"""A small gateware whose job tables hold routes."""
UPPER = (0x0A000009, 7009)
"""The parent aggregator of the tree below: the root, which gathers member 2 itself."""
TREE_PORTS = (40001, 40002)
TREE_JOB = dict(job=0x5EED_0007, token=0x0123_4567_89AB_CDEF, group=0xEF_21_00_07)
ROUTED, FLAT = 3, 4
"""Clique ROUTED has a route here: members 0 and 1 of its 3, the partial to UPPER. Clique FLAT has none."""


def tree_job():
    return JobEntry(slots=4, members={(HOST_IP, port) for port in TREE_PORTS},
                    routes={ROUTED: CliqueRoute(level=0b011, parent=UPPER)}, **TREE_JOB)


def v3(traffic, sender, clique, fanin, count=5, **fields):
    fields = {**TREE_JOB, "version": JOB_VERSION, "slot": 1, "round": 7, "clique": clique, "fanin": fanin,
              "sender": sender, "udp_sport": TREE_PORTS[sender], **fields}
    return traffic.contribution(traffic.elements(count), **fields)


def partial_to_parent_frames(traffic):
    """Members 0 and 1 of the routed clique (the partial goes up), a retransmission (the partial again), a
    result request before the result came down (dropped), and a flat clique of the same job beside it (its
    result to the group)."""
    routed = [v3(traffic, sender, ROUTED, 3) for sender in (0, 1)]
    request = traffic.request(count=5, version=JOB_VERSION, slot=1, round=7, clique=ROUTED, fanin=3,
                              udp_sport=TREE_PORTS[1], **TREE_JOB)
    flat = [v3(traffic, sender, FLAT, 2, slot=2) for sender in (0, 1)]
    return [*routed, routed[0], request, *flat]


def cosimulate(width, frames, mutant=None, job=tree_job):
    """The model's and the gateware's outputs per frame and their counters, both holding `job()`."""
    from inwire_hdl.cosim import CoSimulation

    if shutil.which("iverilog") is None:
        pytest.fail("iverilog is not on PATH (run `make setup`)")

    model = Model(TREE_CONFIG)
    model.install(job())
    expected = [model.process(frame) for frame in frames]
    gateware = CoSimulation("icarus", width, TREE_CONFIG, mutant=mutant)
    try:
        gateware.install(job())
        outputs = [gateware.process(frame) for frame in frames]
        return expected, model.stats(), outputs, gateware.stats()
    finally:
        gateware.close()


UP, GROUP = (Opcode.PARTIAL, *UPPER), (Opcode.RESULT, TREE_JOB["group"], TREE_CONFIG.port)
"""Where a routed level's partial goes (opcode, address, port), and where a result goes down."""


def destinations(outputs):
    return [[(frame_field(out, "opcode"), frame_field(out, "ip_dst"), frame_field(out, "udp_dport")) for out in answer]
            for answer in outputs]


@pytest.mark.sim
@pytest.mark.parametrize("width", [8, 64])
def test_the_gateware_below_the_root_sends_its_partial_to_the_parent(width):
    frames = partial_to_parent_frames(Traffic(TREE_CONFIG, seed=31))
    expected, model_stats, outputs, gateware_stats = cosimulate(width, frames)
    assert destinations(expected) == [[], [UP], [UP], [], [], [GROUP]]
    assert model_stats["drop_no_result"] == 1
    assert outputs == expected
    assert gateware_stats == model_stats


def from_parent(traffic, count=5, source=UPPER, **fields):
    """The root's result for the routed clique (all 3 members, overflow flag set), sent from `source`."""
    fields = {**TREE_JOB, "version": JOB_VERSION, "opcode": Opcode.RESULT, "slot": 1, "round": 7,
              "clique": ROUTED, "fanin": 3, "sender": 2, "bitmap": 0b111, "contributors": 3,
              "ip_src": source[0], "udp_sport": source[1], **fields}
    return bytes(build_frames(traffic.elements(count).astype(np.int64), status=STATUS_OVERFLOW,
                              **traffic.header(**fields))[0])


def relay_frames(traffic):
    """The level's partial goes up; the result comes back from a stranger (dropped), from the parent
    (relayed to the group), from the parent again (a duplicate) and with another count (a mismatch); then
    a member's result request and retransmission get the result, and a result for a slot holding nothing
    is dropped."""
    routed = [v3(traffic, sender, ROUTED, 3) for sender in (0, 1)]
    result = from_parent(traffic)
    request = traffic.request(count=5, version=JOB_VERSION, slot=1, round=7, clique=ROUTED, fanin=3,
                              udp_sport=TREE_PORTS[1], **TREE_JOB)
    return [*routed, from_parent(traffic, source=(UPPER[0] + 1, UPPER[1])),
            from_parent(traffic, source=(UPPER[0], UPPER[1] + 1)), result, result, from_parent(traffic, count=4),
            request, routed[0], from_parent(traffic, slot=2)]


@pytest.mark.sim
@pytest.mark.parametrize("width", [8, 64])
def test_the_gateware_below_the_root_relays_the_parents_result_down_once(width):
    frames = relay_frames(Traffic(TREE_CONFIG, seed=32))
    expected, model_stats, outputs, gateware_stats = cosimulate(width, frames)
    member = [(Opcode.RESULT, HOST_IP, port) for port in TREE_PORTS]
    assert destinations(expected) == [[], [UP], [], [], [GROUP], [], [], [member[1]], [member[0]], []]
    assert [model_stats[name] for name in ("drop_member", "relayed", "drop_duplicate", "drop_mismatch",
                                           "drop_no_result")] == [2, 1, 1, 1, 1]
    assert outputs == expected
    assert gateware_stats == model_stats


@pytest.mark.sim
@pytest.mark.parametrize(("mutant", "frames", "caught_at"), [
    ("partial_to_group", partial_to_parent_frames, 1),  # the level's sums to the group, not to the parent
    ("relay_twice", relay_frames, 5),  # the parent's result relayed a second time
])
def test_the_tree_tests_catch_the_tree_mutants(mutant, frames, caught_at):
    expected, _, outputs, _ = cosimulate(8, frames(Traffic(TREE_CONFIG, seed=33)), mutant=mutant)
    first_difference = next(index for index, (want, got) in enumerate(zip(expected, outputs, strict=True))
                            if want != got)
    assert first_difference == caught_at


CHILD = (0x0A000005, 7005)
"""A child aggregator below the gateware: it gathers members 1 and 2 of each clique below."""
MIDDLE, ROOT = 6, 8
"""Clique MIDDLE (fan-in 4) is routed through the gateware in the middle of a three-level tree: it gathers
member 0 itself and members 1 and 2 through CHILD, and sends the level's partial to UPPER (member 3 is
UPPER's). Clique ROOT (fan-in 3) is rooted here: member 0 here, members 1 and 2 through CHILD."""


def job_with_children():
    return JobEntry(slots=4, members={(HOST_IP, port) for port in TREE_PORTS}, routes={
        MIDDLE: CliqueRoute(level=0b0111, parent=UPPER, children={CHILD: 0b0110}),
        ROOT: CliqueRoute(children={CHILD: 0b0110})}, **TREE_JOB)


def from_child(traffic, clique, fanin, bitmap=0b0110, source=CHILD, **fields):
    fields = {**TREE_JOB, "version": JOB_VERSION, "round": 7, "clique": clique, "fanin": fanin, "sender": 1,
              "bitmap": bitmap, "contributors": bitmap.bit_count(), "ip_src": source[0], "udp_sport": source[1],
              **fields}
    return traffic.partial(traffic.elements(5), **fields)


def children_frames(traffic):
    """The middle clique: the child's partial, one from a stranger and one holding a member the child does not
    hold (both dropped), the gateware's own member (the level complete: its partial up), the parent's result
    (relayed to the group). The root clique: its member and the child's partial (the result to the group),
    the child's partial again (the result to the child alone), and a result claiming to come from the parent
    the root clique does not have (dropped)."""
    middle = from_child(traffic, MIDDLE, 4, slot=1)
    root = from_child(traffic, ROOT, 3, slot=2)
    return [middle, from_child(traffic, MIDDLE, 4, slot=1, source=(CHILD[0], CHILD[1] + 1)),
            from_child(traffic, MIDDLE, 4, slot=1, bitmap=0b1010),
            v3(traffic, 0, MIDDLE, 4, slot=1), from_parent(traffic, clique=MIDDLE, fanin=4, bitmap=0b1111),
            v3(traffic, 0, ROOT, 3, slot=2), root, root, from_parent(traffic, clique=ROOT, slot=2)]


@pytest.mark.sim
@pytest.mark.parametrize("width", [8, 64])
def test_the_gateware_in_the_middle_and_at_the_root_takes_its_childrens_partials(width):
    frames = children_frames(Traffic(TREE_CONFIG, seed=34))
    expected, model_stats, outputs, gateware_stats = cosimulate(width, frames, job=job_with_children)
    assert destinations(expected) == [[], [], [], [UP], [GROUP], [], [GROUP], [(Opcode.RESULT, *CHILD)], []]
    assert frame_field(expected[3][0], "bitmap") == 0b0111 and model_stats["drop_member"] == 3
    assert outputs == expected
    assert gateware_stats == model_stats


def mixed_tree_frames(traffic, rounds=5):
    """Rounds of both cliques of `job_with_children`, each frame from where the tables allow or (one in
    five) from a stranger, the parent's result sometimes before the level is complete, copies of frames and
    result requests among them, the frames of neighbouring rounds interleaved: the model decides each."""
    chooser = random.Random(35)
    stranger = (UPPER[0] + 7, UPPER[1])
    timed = []
    for round_ in range(1, rounds + 1):
        fields = dict(round=round_)
        middle = [from_child(traffic, MIDDLE, 4, slot=1, **fields), v3(traffic, 0, MIDDLE, 4, slot=1, **fields),
                  from_parent(traffic, clique=MIDDLE, fanin=4, bitmap=0b1111, **fields)]
        root = [v3(traffic, 0, ROOT, 3, slot=2, **fields), from_child(traffic, ROOT, 3, slot=2, **fields)]
        requests = [traffic.request(count=5, version=JOB_VERSION, slot=slot, clique=clique, fanin=fanin,
                                    udp_sport=TREE_PORTS[1], **TREE_JOB, **fields)
                    for slot, clique, fanin in ((1, MIDDLE, 4), (2, ROOT, 3))]
        frames = middle + root + requests + [chooser.choice(middle + root) for _ in range(2)]
        if chooser.random() < 0.2:
            frames.append(from_parent(traffic, clique=MIDDLE, fanin=4, bitmap=0b1111, source=stranger, **fields))
        timed += [(round_ + chooser.random() * 1.5, frame) for frame in frames]
    return [frame for _, frame in sorted(timed, key=lambda pair: pair[0])]


@pytest.mark.sim
@pytest.mark.parametrize("width", [8, 64])
def test_mixed_tree_traffic_matches_the_model(width):
    frames = mixed_tree_frames(Traffic(TREE_CONFIG, seed=36))
    expected, model_stats, outputs, gateware_stats = cosimulate(width, frames, job=job_with_children)
    assert all(model_stats[name] for name in ("relayed", "partials_emitted", "results_emitted", "answered",
                                              "drop_no_result", "drop_duplicate"))
    assert outputs == expected
    assert gateware_stats == model_stats
