"""The co-designed planner: aggregator limits, reduction trees, bandwidth-aware routing, the local-step
objective, the new baselines and the schedule file's new keys, each against figures worked out by hand."""

import json
import math
import os
import subprocess
import sys
from itertools import pairwise
from pathlib import Path

import numpy as np
import pytest

from inwire.cli import main
from inwire.plan import cost
from inwire.plan.aggregator import PROFILES, AggregatorProfile, load_aggregator
from inwire.plan.baselines import BASELINE_NAMES, exponential_rounds
from inwire.plan.cost import AGGREGATE, HOST_TREE, Clique, CostModel, ScheduleError
from inwire.plan.mixing import mixing_product, mixing_rate, progress_periods, reach_periods, spectral_radius
from inwire.plan.schedule_file import load_schedule_file, member_paths, schedule_document
from inwire.plan.search import Evaluator, plan_schedule
from inwire.plan.topology import TopologyError, generate_topology, load_topology, topology_from_dict
from inwire.protocol import FRAME_HEADER_BYTES, MAX_ELEMENTS_PER_FRAME, ROUTE_HOPS, WIRE_OVERHEAD_BYTES
from inwire.stream import clique_routes

FULL_FRAMES_MODEL = 1000 * MAX_ELEMENTS_PER_FRAME * 4
V_MS_AT_1G = 1000 * (FRAME_HEADER_BYTES + WIRE_OVERHEAD_BYTES + 4 * MAX_ELEMENTS_PER_FRAME) * 8 / 1e6
"""One vector of FULL_FRAMES_MODEL on a 1 Gb/s resource: 16.6 ms."""
REFERENCE = Path(__file__).parent / "data" / "dz9_before.json"


def hand(cities, links, aggregators=None):
    """Links as (a, b, latency ms, Gb/s); aggregators: city -> topology-file aggregator entry."""
    aggregators = aggregators or {}
    return topology_from_dict({
        "name": "hand",
        "cities": [{"name": c, "lat": 0, "lon": i, **({"aggregator": aggregators[c]} if c in aggregators else {})}
                   for i, c in enumerate(cities)],
        "links": [{"a": a, "b": b, "latency_ms": ms, "bandwidth_gbps": gbps} for a, b, ms, gbps in links]})


# --- aggregator limits ----------------------------------------------------------------------------

def test_a_capped_aggregator_bounds_the_round_like_a_link():
    two = hand(["A", "B"], [("A", "B", 10, 1)])
    ideal = CostModel(two, ["A", "B"], FULL_FRAMES_MODEL)
    # B's vector up and the sum back, 20 ms round trip; each link direction carries one vector.
    assert ideal.round_time([Clique(("A", "B"), "A")]) == pytest.approx(20 + V_MS_AT_1G)
    # Half a gigabit of ports: both contributions (A's own island too) enter the aggregator at A.
    ports = AggregatorProfile("half", ports=1, port_gbps=0.5)
    capped = CostModel(two, ["A", "B"], FULL_FRAMES_MODEL, aggregator=ports)
    assert capped.round_time([Clique(("A", "B"), "A")]) == pytest.approx(20 + 2 * V_MS_AT_1G / 0.5)
    # A core of 8 bytes at 6.25 MHz moves 0.4 Gb/s and is now the bottleneck.
    core = AggregatorProfile("slow core", 1, 10.0, 8, 6.25)
    slow = CostModel(two, ["A", "B"], FULL_FRAMES_MODEL, aggregator=core)
    assert slow.round_time([Clique(("A", "B"), "A")]) == pytest.approx(20 + 2 * V_MS_AT_1G / 0.4)
    # Direct exchange bypasses the aggregator.
    assert slow.round_time([Clique(("A", "B"), None, "all-to-all")]) == pytest.approx(10 + V_MS_AT_1G)


def test_cliques_sharing_an_aggregator_share_its_ports():
    star = hand(["H", "A", "B", "C", "D"], [("H", x, 1, 10) for x in "ABCD"])
    model = CostModel(star, ["A", "B", "C", "D"], FULL_FRAMES_MODEL, aggregator=AggregatorProfile("1g", 1, 1.0))
    left, right = Clique(("A", "B"), "H"), Clique(("C", "D"), "H")
    assert model.round_time([left]) == pytest.approx(2 + 2 * V_MS_AT_1G)
    assert model.round_time([left, right]) == pytest.approx(2 + 4 * V_MS_AT_1G)
    assert model.clique_times([left, right]) == pytest.approx([2 + 4 * V_MS_AT_1G] * 2)


def test_a_city_of_the_topology_overrides_the_default_profile():
    two = hand(["A", "B"], [("A", "B", 10, 1)], {"A": {"ports": 1, "port_gbps": 0.5}})
    model = CostModel(two, ["A", "B"], FULL_FRAMES_MODEL, aggregator="alveo_u200")
    assert model.aggregator_of["B"] is PROFILES["alveo_u200"]
    assert model.round_time([Clique(("A", "B"), "A")]) == pytest.approx(20 + 2 * V_MS_AT_1G / 0.5)
    with pytest.raises(TopologyError, match="unknown aggregator profile 'fpga9'"):
        hand(["A", "B"], [("A", "B", 10, 1)], {"A": "fpga9"})


def test_board_profiles_match_the_gateware():
    from inwire_hdl import alveo, board, board_build
    from inwire_hdl.board_control import BOARD_CONFIG

    versa, u200 = PROFILES["versa_ecp5"], PROFILES["alveo_u200"]
    assert (versa.max_fanin, versa.max_elements) == (BOARD_CONFIG.max_fanin, BOARD_CONFIG.max_elements)
    assert versa.core_mhz == board.PLL_VCO_HZ / 16 / 1e6 and versa.data_width == 8  # build's defaults
    assert (versa.ports, versa.port_gbps) == board_build.PORTS["versa_ecp5"]
    assert u200.core_mhz == alveo.CORE_CLOCK_MHZ and u200.data_width == alveo.CMAC_BYTES
    assert versa.core_bps == 2e9 and u200.core_bps == 128e9


def test_a_build_report_gives_the_profile(tmp_path):
    report = {"board": "versa_ecp5", "data_width": 8, "core_clock_mhz": 62.5, "ports": 1, "port_gbps": 1.0,
              "timing_met": True}
    path = tmp_path / "report.json"
    path.write_text(json.dumps(report))
    profile = load_aggregator(str(path))
    assert profile.core_bps == 4e9 and profile.ingress_bps == 1e9
    # A report from before the ports were written: the board's ports are known.
    path.write_text(json.dumps({k: v for k, v in report.items() if k not in ("ports", "port_gbps")}))
    assert load_aggregator(str(path)).ingress_bps == 1e9
    path.write_text(json.dumps({**report, "timing_met": False}))
    with pytest.raises(ScheduleError, match="missed timing"):
        load_aggregator(str(path))


# --- reduction trees --------------------------------------------------------------------------------

def fork():
    """A, B -- X ==== R: A and B 1 ms from X, X 10 ms from R; every link 1 Gb/s."""
    return hand(["A", "B", "X", "R"], [("A", "X", 1, 1), ("B", "X", 1, 1), ("X", "R", 10, 1)])


def loads_by_edge(model, clique):
    profile = model.profile(clique)
    return {edge: profile.loads_bits[i] / model.vector_bits for edge, i in model.edge_index.items()
            if profile.loads_bits[i]}


def test_reduction_tree_loads_by_hand():
    clique = Clique(("A", "B", "R"), "R")
    plain = CostModel(fork(), ["A", "B", "R"], FULL_FRAMES_MODEL)
    reduced = CostModel(fork(), ["A", "B", "R"], FULL_FRAMES_MODEL, reduce_in_path=True)
    # Without reduction both contributions cross X->R; with it X sums them and sends one partial.
    up = {("A", "X"): 1, ("B", "X"): 1}
    down = {("R", "X"): 1, ("X", "A"): 1, ("X", "B"): 1}  # the result, multicast at X
    assert loads_by_edge(plain, clique) == {**up, **down, ("X", "R"): 2}
    assert loads_by_edge(reduced, clique) == {**up, **down, ("X", "R"): 1}
    # X sums; A and B, which do not, send to it (R's own island sends to R).
    assert reduced.profile(clique).tree == {"X": "R", "A": "X", "B": "X"}
    assert plain.round_time([clique]) == pytest.approx(22 + 2 * V_MS_AT_1G)
    assert reduced.round_time([clique]) == pytest.approx(22 + V_MS_AT_1G)
    # A city that cannot aggregate forwards both contributions, and sums nothing.
    no_x = topology_from_dict({**fork().to_dict(), "cities": [
        {**c, "aggregation": c["name"] != "X"} for c in fork().to_dict()["cities"]]})
    forwarding = CostModel(no_x, ["A", "B", "R"], FULL_FRAMES_MODEL, reduce_in_path=True)
    assert loads_by_edge(forwarding, clique)[("X", "R")] == 2 and forwarding.profile(clique).tree == {}


def test_without_multicast_a_summing_city_relays_the_result():
    # No city replicates: the root sends each member its copy, but in a reduction tree X, which sums for A
    # and B, takes one copy and relays it to them (inwire serve --unicast), as it sent one partial up.
    unicast = topology_from_dict({**fork().to_dict(), "cities": [
        {**c, "multicast": False} for c in fork().to_dict()["cities"]]})
    clique = Clique(("A", "B", "R"), "R")
    plain = CostModel(unicast, ["A", "B", "R"], FULL_FRAMES_MODEL, multicast=False)
    reduced = CostModel(unicast, ["A", "B", "R"], FULL_FRAMES_MODEL, multicast=False, reduce_in_path=True)
    up = {("A", "X"): 1, ("B", "X"): 1}
    assert loads_by_edge(plain, clique) == {**up, ("X", "R"): 2, ("R", "X"): 2, ("X", "A"): 1, ("X", "B"): 1}
    assert loads_by_edge(reduced, clique) == {**up, ("X", "R"): 1, ("R", "X"): 1, ("X", "A"): 1, ("X", "B"): 1}
    assert reduced.round_time([clique]) == pytest.approx(22 + V_MS_AT_1G)
    # A root that takes in and sends out one vector per port-second: two copies out without the relay.
    half = AggregatorProfile("half", 1, 0.5)
    capped = CostModel(unicast, ["A", "B", "R"], FULL_FRAMES_MODEL, multicast=False, aggregator=half,
                       reduce_in_path=True)
    assert capped.round_time([clique]) == pytest.approx(22 + 4 * V_MS_AT_1G)


def test_a_summing_city_is_capped_like_the_root():
    half = AggregatorProfile("half", 1, 0.5)
    reduced = CostModel(fork(), ["A", "B", "R"], FULL_FRAMES_MODEL, aggregator=half, reduce_in_path=True)
    # X takes in two vectors at 0.5 Gb/s (4 V at 1G); R takes in X's partial and its own island's (4 V too).
    assert reduced.round_time([Clique(("A", "B", "R"), "R")]) == pytest.approx(22 + 4 * V_MS_AT_1G)


def test_doublezero9_global_clique_with_reduction():
    dz9 = load_topology("doublezero9")
    islands = dz9.resolve_islands()
    plain = CostModel(dz9, islands, 100_000_000)
    reduced = CostModel(dz9, islands, 100_000_000, reduce_in_path=True)
    at_nyc = Clique(islands, "NYC")
    assert reduced.round_time([at_nyc]) < 0.7 * plain.round_time([at_nyc])  # 375.8 against 548.4 ms
    tree = reduced.profile(at_nyc).tree
    for city in tree:  # every summing city leads to NYC
        seen = 0
        while city != "NYC":
            city, seen = tree[city], seen + 1
            assert seen < 9
    # Uncapped, each link would carry one vector per direction toward NYC; SIN -> FRA -> AMS -> LON -> NYC
    # is one summing level too many for a frame, so one city of that chain forwards two vectors unsummed.
    loads = reduced.profile(at_nyc).loads_bits
    assert max(loads) == 2 * reduced.vector_bits and np.count_nonzero(loads == max(loads)) == 1
    assert max(len(p) for p in member_paths(islands, "NYC", tree).values()) == 1 + ROUTE_HOPS


# --- the depth a frame can carry ---------------------------------------------------------------------

def up_route(topology, member, first):
    """The cities a vector from `member` crosses to `first`, on the latency-shortest tree of the root."""
    route = []
    for city in reversed(topology.path(first, member)):
        route.append(city)
        if city == first:
            return route


def check_capped(topology, islands, root, aggregator, monkeypatch):
    """Every property a capped tree must have, checked against the uncapped tree and no reduction:
    at most ROUTE_HOPS + 1 summing levels on every member's path (so the stream takes it), links and
    aggregators loaded exactly as the emitted tree says, and a time between the two (the cap may only
    take summing away, which here never makes the busiest resource lighter)."""
    clique = Clique(tuple(islands), root)
    capped = CostModel(topology, islands, FULL_FRAMES_MODEL, aggregator=aggregator, reduce_in_path=True)
    plain = CostModel(topology, islands, FULL_FRAMES_MODEL, aggregator=aggregator)
    with monkeypatch.context() as patch:
        patch.setattr(cost, "ROUTE_HOPS", 10 ** 6)
        uncapped = CostModel(topology, islands, FULL_FRAMES_MODEL, aggregator=aggregator, reduce_in_path=True)
        uncapped_tree = uncapped.profile(clique).tree
    assert max(len(p) for p in member_paths(islands, root, uncapped_tree).values()) > 1 + ROUTE_HOPS
    tree = capped.profile(clique).tree
    paths = member_paths(islands, root, tree)
    assert max(len(p) for p in paths.values()) <= 1 + ROUTE_HOPS
    clique_routes(islands, root, tree, lambda city: 1)  # raises for a path the frame cannot name
    # Loads rebuilt from the tree alone: each member's vector to its first aggregator, each aggregator's
    # partial to its parent, and the result down the same multicast tree as without reduction.
    vector = capped.vector_bits
    expected = plain.profile(clique).loads_bits.copy()
    for member in islands:
        if member != root:
            expected[[capped.edge_index[hop] for hop in pairwise(up_route(topology, member, root))]] -= vector
    sending = [(member, paths[member][0]) for member in islands]
    sending += [(city, up) for city, up in tree.items() if city in {root, *tree.values()}]
    received = {}
    for city, to in sending:
        received[to] = received.get(to, 0) + 1
        if city != to:
            expected[[capped.edge_index[hop] for hop in pairwise(up_route(topology, city, to))]] += vector
    aggregators = capped._aggregator_index
    for city, first in aggregators.items():
        expected[first:first + 3] = [received.get(city, 0) * vector] * 2 + [(city in received) * vector]
    assert np.array_equal(capped.profile(clique).loads_bits, expected)
    assert (uncapped.clique_time_alone(clique) <= capped.clique_time_alone(clique) + 1e-9
            <= plain.clique_time_alone(clique) + 2e-9)
    return capped.clique_time_alone(clique), uncapped.clique_time_alone(clique)


def chain():
    """C0 - C1 - C2 - C3 - C4 - R, 1 ms each, at 1 Gb/s except C2 - C3 and C3 - C4 at 10 Gb/s."""
    names = ["C0", "C1", "C2", "C3", "C4", "R"]
    return hand(names, [(a, b, 1, 10 if a in ("C2", "C3") else 1) for a, b in pairwise(names)])


def test_a_tree_deeper_than_a_frame_is_capped_where_it_costs_least(monkeypatch):
    # Uncapped, C1 to C4 all sum: C0's vector climbs five levels. Two must stop; stopping C2 and C3 puts
    # their extra vectors (2 and 3) on the 10 Gb/s links, which stay below one vector at 1 Gb/s, so the cap
    # costs nothing here: 10 ms there and back plus one vector on a 1 Gb/s link.
    islands = ["C0", "C1", "C2", "C3", "C4", "R"]
    capped_ms, uncapped_ms = check_capped(chain(), islands, "R", "ideal", monkeypatch)
    assert capped_ms == pytest.approx(uncapped_ms) == pytest.approx(10 + V_MS_AT_1G)
    model = CostModel(chain(), islands, FULL_FRAMES_MODEL, reduce_in_path=True)
    assert model.profile(Clique(tuple(islands), "R")).tree == {"C0": "C1", "C1": "C4", "C2": "C4", "C3": "C4",
                                                               "C4": "R"}


@pytest.mark.parametrize("aggregator", ["ideal", "port10g", AggregatorProfile("half", 1, 0.5)],
                         ids=["ideal", "port10g", "half"])
def test_every_too_deep_doublezero9_global_tree_is_capped(aggregator, monkeypatch):
    dz9 = load_topology("doublezero9")
    islands = dz9.resolve_islands()
    roots = []
    for root in islands:
        with monkeypatch.context() as patch:
            patch.setattr(cost, "ROUTE_HOPS", 10 ** 6)
            tree = CostModel(dz9, islands, FULL_FRAMES_MODEL, reduce_in_path=True).profile(Clique(islands, root)).tree
        if max(len(p) for p in member_paths(islands, root, tree).values()) > 1 + ROUTE_HOPS:
            roots.append(root)
    assert {"NYC", "LAX", "LON"} <= set(roots)  # SIN's vector climbs four levels or more to each of them
    for root in roots:
        check_capped(dz9, islands, root, aggregator, monkeypatch)


# --- routing --------------------------------------------------------------------------------------

def detour():
    """A -- B direct, 1 ms at 1 Gb/s; or A -- C -- B, 2 + 2 ms at 10 Gb/s."""
    return hand(["A", "B", "C"], [("A", "B", 1, 1), ("A", "C", 2, 10), ("C", "B", 2, 10)])


def test_bandwidth_routing_takes_the_wider_path_when_the_short_one_saturates():
    clique = Clique(("A", "B"), "B")
    by_latency = CostModel(detour(), ["A", "B"], FULL_FRAMES_MODEL)
    by_bandwidth = CostModel(detour(), ["A", "B"], FULL_FRAMES_MODEL, routing="bandwidth")
    assert by_latency.round_time([clique]) == pytest.approx(2 + V_MS_AT_1G)
    assert by_bandwidth.round_time([clique]) == pytest.approx(8 + V_MS_AT_1G / 10)
    assert loads_by_edge(by_bandwidth, clique) == {("A", "C"): 1, ("C", "B"): 1, ("B", "C"): 1, ("C", "A"): 1}
    # A small model is done sooner on the short path, and stays there.
    small = CostModel(detour(), ["A", "B"], 4000, routing="bandwidth")
    assert set(loads_by_edge(small, clique)) == {("A", "B"), ("B", "A")}


def test_bandwidth_routing_spreads_a_ring_over_both_paths():
    by_bandwidth = CostModel(detour(), ["A", "B"], FULL_FRAMES_MODEL, routing="bandwidth")
    ring = by_bandwidth.profile(Clique(("A", "B"), None, "ring"))
    assert ring.latency_ms == pytest.approx(2 * 4)  # both hops on the 4 ms detour
    with pytest.raises(ScheduleError, match="routing must be one of"):
        CostModel(detour(), ["A", "B"], FULL_FRAMES_MODEL, routing="shortest")


def near_parallel():
    """H is the root; N is 10 ms from H, F 1 ms behind N. F's other way, F -- M -- H, is 11.5 ms against
    11 through N: half a millisecond longer. Every link 1 Gb/s."""
    return hand(["H", "N", "F", "M"], [("N", "H", 10, 1), ("F", "N", 1, 1), ("F", "M", 1, 1), ("M", "H", 10.5, 1)])


def test_balanced_routing_splits_two_vectors_over_near_equal_parallel_paths(monkeypatch):
    """Clique {F, N, H} summed at H, without reduction. By hand: through N, the N -> H link carries F's and
    N's vectors (2V) and the farthest member is 11 ms away, 2 x 11 + 2V; F by M instead puts one vector on
    every link and is 11.5 ms away, 2 x 11.5 + V, the best any tree does (H has two links and two vectors
    must reach it). Latency routing and the greedy bandwidth mode (F first, before N's vector is counted)
    keep the shared link; balanced routing moves F."""
    clique, islands = Clique(("F", "N", "H"), "H"), ["H", "N", "F"]
    shared_ms, split_ms = 2 * 11 + 2 * V_MS_AT_1G, 2 * 11.5 + V_MS_AT_1G
    for routing in ("latency", "bandwidth"):
        assert CostModel(near_parallel(), islands, FULL_FRAMES_MODEL, routing=routing).round_time([clique]) == \
            pytest.approx(shared_ms), routing
    balanced = CostModel(near_parallel(), islands, FULL_FRAMES_MODEL, routing="balanced")
    assert balanced.round_time([clique]) == pytest.approx(split_ms)
    assert loads_by_edge(balanced, clique) == {edge: 1 for edge in [
        ("F", "M"), ("M", "H"), ("N", "H"), ("H", "M"), ("M", "F"), ("H", "N")]}
    # The move bound holds: with no moves allowed it stays on the faster start, the shared path.
    monkeypatch.setattr(cost, "ROUTING_MOVES", 0)
    assert CostModel(near_parallel(), islands, FULL_FRAMES_MODEL, routing="balanced").round_time([clique]) == \
        pytest.approx(shared_ms)


def test_balanced_routing_keeps_the_short_path_when_moving_does_not_help():
    """With reduction N sums F's vector with its own, so the shared link carries one vector: 2 x 11 + V
    beats moving F (2 x 11.5 + V). A small model is latency-bound: the 11 ms path wins too."""
    clique, islands = Clique(("F", "N", "H"), "H"), ["H", "N", "F"]
    reduced = CostModel(near_parallel(), islands, FULL_FRAMES_MODEL, reduce_in_path=True, routing="balanced")
    assert reduced.round_time([clique]) == pytest.approx(2 * 11 + V_MS_AT_1G)
    assert reduced.profile(clique).tree == {"F": "N", "N": "H"}
    small = CostModel(near_parallel(), islands, 4000, routing="balanced")
    assert set(loads_by_edge(small, clique)) == {("F", "N"), ("N", "H"), ("H", "N"), ("N", "F")}


def two_crossings():
    """A and C reach S, S reaches T over 10 ms, T reaches B and D; every hop 1 ms. A's other way to B, by P,
    and C's to D, by Q, are 1 + 11.5 ms against 12 through S and T: half a millisecond longer. Every link
    1 Gb/s."""
    return hand(["A", "B", "C", "D", "S", "T", "P", "Q"],
                [("A", "S", 1, 1), ("C", "S", 1, 1), ("S", "T", 10, 1), ("T", "B", 1, 1), ("T", "D", 1, 1),
                 ("A", "P", 1, 1), ("P", "B", 11.5, 1), ("C", "Q", 1, 1), ("Q", "D", 11.5, 1)])


def test_balanced_routing_sends_one_of_two_cliques_of_a_round_the_other_way(monkeypatch):
    """Cliques {A, B} summed at B and {C, D} summed at D in one round. By hand: alone, each is done soonest
    through S and T (2 x 12 + V against 2 x 12.5 + V by its own detour), so routed alone both put a vector
    on S -> T and on T -> S and the round takes 2 x 12 + 2V. Routed as a round, the first clique's A moves
    to P: it takes 2 x 12.5 + V, the other clique 2 x 12 + V alone on S -- T, and the round 2 x 12.5 + V;
    no move of C shortens that. Every figure of each clique alone stays as it was."""
    first, second = Clique(("A", "B"), "B"), Clique(("C", "D"), "D")
    islands = ["A", "B", "C", "D"]
    model = CostModel(two_crossings(), islands, FULL_FRAMES_MODEL, routing="balanced")
    assert model.clique_time_alone(first) == pytest.approx(2 * 12 + V_MS_AT_1G)
    assert model.clique_time_alone(second) == pytest.approx(2 * 12 + V_MS_AT_1G)
    assert model.clique_times([first, second]) == pytest.approx([2 * 12.5 + V_MS_AT_1G, 2 * 12 + V_MS_AT_1G])
    assert model.round_time([first, second]) == pytest.approx(2 * 12.5 + V_MS_AT_1G)
    edges = {index: edge for edge, index in model.edge_index.items()}
    routed = [{edges[i] for i in profile.used} for profile in model.round_profiles([first, second])]
    assert routed == [{("A", "P"), ("P", "B"), ("B", "P"), ("P", "A")},
                      {("C", "S"), ("S", "T"), ("T", "D"), ("D", "T"), ("T", "S"), ("S", "C")}]
    # Latency routing, and balanced routing with no moves allowed, leave both on S -- T.
    assert CostModel(two_crossings(), islands, FULL_FRAMES_MODEL).round_time([first, second]) == \
        pytest.approx(2 * 12 + 2 * V_MS_AT_1G)
    monkeypatch.setattr(cost, "ROUTING_MOVES", 0)
    assert CostModel(two_crossings(), islands, FULL_FRAMES_MODEL, routing="balanced").round_time(
        [first, second]) == pytest.approx(2 * 12 + 2 * V_MS_AT_1G)


def test_balanced_routing_fits_the_doublezero9_global_tree_in_three_levels():
    """Global clique at NYC, 100 MB, with reduction. By hand: FRA sending straight to LON (4.96 ms instead of
    3.56 through AMS) sums SIN's vector with its own, LON sums AMS's and FRA's with its own, TYO sums SEO's
    and LAX TYO's: SIN's and SEO's vectors climb three summing levels, which a frame carries, and every link
    carries one vector each way. The farthest member is SIN, 52.42 + 4.96 + 45.60 ms away; one vector of
    100 MB in full frames at 10 Gb/s on top. Latency routing keeps FRA -> AMS and pays a second vector."""
    dz9 = load_topology("doublezero9")
    islands = dz9.resolve_islands()
    elements = 100_000_000 // 4
    frames = -(-elements // MAX_ELEMENTS_PER_FRAME)
    vector_ms = (frames * (FRAME_HEADER_BYTES + WIRE_OVERHEAD_BYTES) + 4 * elements) * 8 / 10e9 * 1e3
    clique = Clique(islands, "NYC")
    balanced = CostModel(dz9, islands, 100_000_000, reduce_in_path=True, routing="balanced")
    assert balanced.round_time([clique]) == pytest.approx(2 * (52.42 + 4.96 + 45.60) + vector_ms)
    assert balanced.profile(clique).tree == {"AMS": "LON", "FRA": "LON", "LON": "NYC", "SEO": "TYO", "SIN": "FRA",
                                             "TYO": "LAX", "LAX": "NYC"}
    by_latency = CostModel(dz9, islands, 100_000_000, reduce_in_path=True)
    assert by_latency.round_time([clique]) > balanced.round_time([clique]) + 0.9 * vector_ms


def balanced_cases():
    """(topology, islands, member groups): a generated topology dense enough to offer other paths (links up
    to 6000 km, 25 for 12 cities), and doublezero9's global clique and three-island cliques with SIN and AMS
    (SIN's vector reaches AMS, LON and NYC through FRA and AMS, or past AMS by FRA -> LON; some need two
    moves)."""
    generated = generate_topology(12, seed=1, radius_km=6000)
    islands = generated.resolve_islands()
    dz9 = load_topology("doublezero9")
    others = [city for city in dz9.resolve_islands() if city not in ("SIN", "AMS")]
    return [(generated, islands, [islands, islands[:5], islands[3:10:2], islands[6:]]),
            (dz9, dz9.resolve_islands(), [dz9.resolve_islands()] + [("SIN", "AMS", city) for city in others])]


def balanced_cliques(model, topology, groups):
    """Each group's clique at every root, then as a ring."""
    for members in groups:
        members = model.canonical(members)
        yield from (Clique(members, hub) for hub in topology.cities)
        yield Clique(model.ring_order(members), None, "ring")


def balanced_rounds(model, topology, groups):
    """Rounds of `balanced_cases`: every group but the first at each of the topology's first six cities
    (by name), with the second group's ring."""
    groups = [model.canonical(members) for members in groups[1:]]
    for hub in sorted(topology.cities)[:6]:
        yield [Clique(members, hub) for members in groups] + [Clique(model.ring_order(groups[0]), None, "ring")]


def test_balanced_routing_of_a_round_is_never_slower_than_its_cliques_alone():
    """For every round of `balanced_rounds`, with and without reduction: routed together its time is no
    longer than with each clique's own balanced routes, and shorter in some (the generated topology's and
    doublezero9's both have rounds where one clique steps off a link another needs)."""
    shorter = 0
    for topology, islands, groups in balanced_cases():
        for reduce_in_path in (False, True):
            model = CostModel(topology, islands, 100_000_000, reduce_in_path=reduce_in_path, routing="balanced")
            for cliques in balanced_rounds(model, topology, groups):
                alone = max(model.clique_time_alone(c) for c in cliques)
                assert model.round_time(cliques) <= model._round_time_alone(cliques) + 1e-9
                assert model.round_time(cliques) >= alone - 1e-9  # sharing never beats the slowest alone
                shorter += model.round_time(cliques) < model._round_time_alone(cliques) - 1.0
    assert shorter >= 10


def test_balanced_routing_is_never_slower_and_stops_where_no_move_helps():
    """For every clique of `balanced_cases`, with and without reduction: balanced routing is never slower
    than latency or bandwidth routing alone, and no single move of its own kind would shorten an
    aggregating clique it returns (it stopped at a local optimum, not at the move bound)."""
    for topology, islands, groups in balanced_cases():
        for reduce_in_path in (False, True):
            models = {routing: CostModel(topology, islands, 100_000_000, reduce_in_path=reduce_in_path,
                                         routing=routing) for routing in ("latency", "bandwidth", "balanced")}
            balanced = models["balanced"]
            for clique in balanced_cliques(balanced, topology, groups):
                times = {routing: model.clique_time_alone(clique) for routing, model in models.items()}
                assert times["balanced"] <= min(times["latency"], times["bandwidth"]) + 1e-9, (clique, times)
                if clique.exchange != AGGREGATE:
                    continue
                hub, parent = clique.aggregator, balanced._balanced_tree(clique)
                best = balanced._aggregate_time_ms(clique, parent)[0]
                for city in parent:
                    for path in balanced._reroutes(city, hub):
                        trial = balanced._moved(parent, city, path, hub, clique.members)
                        if trial is not None:
                            assert balanced._aggregate_time_ms(clique, trial)[0] >= best - cost.ROUTING_TOLERANCE_MS


def test_balanced_routing_stops_by_itself(monkeypatch):
    """Every move strictly shortens the clique, so the search ends without its move bound: with the bound
    lifted, no clique of `balanced_cases` (with and without reduction, rings too) is scored more than 2,000
    times."""
    monkeypatch.setattr(cost, "ROUTING_MOVES", 10 ** 9)
    scored = 0

    def counting(score):
        def counted(*args):
            nonlocal scored
            scored += 1
            assert scored <= 2000, "still routing"
            return score(*args)
        return counted

    for name in ("_aggregate_time_ms", "_ring_time_ms"):
        monkeypatch.setattr(CostModel, name, counting(getattr(CostModel, name)))
    for topology, islands, groups in balanced_cases():
        for reduce_in_path in (False, True):
            model = CostModel(topology, islands, 100_000_000, reduce_in_path=reduce_in_path, routing="balanced")
            for clique in balanced_cliques(model, topology, groups):
                scored = 0
                model.profile(clique)


def test_balanced_routing_is_deterministic():
    """The cliques of `balanced_cases`, alone and in the rounds of `balanced_rounds`, routed in two fresh
    processes with different hash seeds give the same propagation terms, loads and trees."""
    here = str(Path(__file__).parent)
    path = os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")]))
    outputs = {subprocess.run([sys.executable, "-c", "from test_plan import balanced_report; print(balanced_report())"],
                              capture_output=True, text=True, check=True,
                              env={**os.environ, "PYTHONPATH": path, "PYTHONHASHSEED": seed}).stdout
               for seed in ("1", "2")}
    assert len(outputs) == 1 and "round Clique" in outputs.pop()


def balanced_report():
    """Every clique of `balanced_cases`, without and with reduction: its propagation term, loads and tree."""
    lines = []
    for topology, islands, groups in balanced_cases():
        for reduce_in_path in (False, True):
            model = CostModel(topology, islands, 100_000_000, reduce_in_path=reduce_in_path, routing="balanced")
            for clique in balanced_cliques(model, topology, groups):
                profile = model.profile(clique)
                lines.append(f"{clique} {profile.latency_ms!r} {profile.loads_bits.tolist()} {profile.tree}")
            for cliques in balanced_rounds(model, topology, groups):
                for clique, profile in zip(cliques, model.round_profiles(cliques)):
                    lines.append(f"round {clique} {profile.latency_ms!r} {profile.loads_bits.tolist()} {profile.tree}")
    return "\n".join(lines)


# --- mixing and the local-step objective ------------------------------------------------------------

def test_spectral_radius_and_reach_of_a_chain_by_hand():
    islands, rounds = ["a", "b", "c"], [[["a", "b"]], [["b", "c"]]]
    # W2 W1 = [[1/2,1/2,0],[1/4,1/4,1/2],[1/4,1/4,1/2]]: eigenvalues 1, 0 and 1/4 (the trace less the 1).
    assert spectral_radius(islands, rounds) == pytest.approx(0.25)
    assert mixing_rate(islands, rounds) > 0.25  # the norm bounds every period, so it is no smaller
    # a never hears from c within one period (entry (a, c) is 0); after two periods everyone has everyone.
    assert mixing_product(islands, rounds)[0, 2] == 0 and reach_periods(islands, rounds) == 2
    assert progress_periods(0.25, 1e-3, 2) == pytest.approx(math.log(1e3) / math.log(4))
    assert progress_periods(0.0, 1e-3, 1) == 1 and progress_periods(0.5, 0.4, 3) == 3
    assert math.isinf(progress_periods(1.0, 1e-3, 1))


def test_local_step_objective_charges_compute_per_round():
    dz9 = load_topology("doublezero9")
    model = CostModel(dz9, dz9.resolve_islands(), 100_000_000)
    plain, local = Evaluator(model, 1e-3), Evaluator(model, 1e-3, local_steps=4, step_ms=25.0)
    rounds = exponential_rounds(list(model.islands))
    a, b = plain.evaluate(rounds), local.evaluate(rounds)
    assert b.round_times_ms == a.round_times_ms and b.period_ms == pytest.approx(a.period_ms + 4 * 100.0)
    expected = max(math.log(1e3) / -math.log(b.spectral_radius), reach_periods(model.islands, rounds))
    assert b.periods == pytest.approx(expected)
    assert b.time_to_epsilon_ms == pytest.approx(expected * b.period_ms)
    assert b.spectral_radius < b.rho  # the one-peer rounds do not commute: rate below the guarantee
    with pytest.raises(ScheduleError, match="step time"):
        Evaluator(model, 1e-3, local_steps=1, step_ms=-1.0)


def test_exponential_baseline_pairs_islands_one_peer_per_round():
    rounds = exponential_rounds(list(range(8)))
    assert len(rounds) == 3 and all(len(groups) == 4 for groups in rounds)
    assert np.allclose(mixing_product(list(range(8)), rounds), 1 / 8)  # a hypercube: exact for 2^k islands
    nine = exponential_rounds(list(range(9)))
    assert nine[-1] == [[0, 8]] and mixing_rate(list(range(9)), nine) > 0


# --- the optimizer ----------------------------------------------------------------------------------

@pytest.mark.parametrize("case", json.loads(REFERENCE.read_text())["cases"],
                         ids=lambda c: f"{c['model_mb']}MB-{'agg' if c['aggregation'] else 'noagg'}")
def test_ideal_profile_reproduces_the_recorded_doublezero9_schedules(case):
    plan = plan_schedule(load_topology("doublezero9"), model_bytes=round(case["model_mb"] * 1e6),
                         aggregation=case["aggregation"], aggregator="ideal")
    document = schedule_document(plan)

    def shape(rounds):
        return [{"cliques": [{k: c[k] for k in ("members", "aggregator", "exchange")} for c in r["cliques"]],
                 "time_ms": r["time_ms"]} for r in rounds]

    assert document["time_to_epsilon_ms"] == case["time_to_epsilon_ms"]
    assert shape(document["rounds"]) == case["rounds"]
    assert document["lower_bound_ms"] == case["lower_bound_ms"]
    for name, recorded in case["baselines"].items():
        assert document["baselines"][name]["time_to_epsilon_ms"] == recorded["time_to_epsilon_ms"], name
        assert shape(document["baselines"][name]["rounds"]) == recorded["rounds"], name


@pytest.mark.parametrize("options", [dict(aggregator="port10g"), dict(aggregator="versa_ecp5", reduce_in_path=True),
                                     dict(aggregator="alveo_u200", routing="bandwidth"),
                                     dict(local_steps=2, step_ms=50.0), dict(host_tree=True, host_nic_gbps=10)])
def test_optimizer_is_never_worse_than_a_baseline_it_reports(options):
    plan = plan_schedule(load_topology("doublezero9"), model_bytes=100_000_000, seed=1, iterations=150, **options)
    assert set(plan.baselines) == set(BASELINE_NAMES)
    # The host-side tree is a competitor the optimizer may use only when offered host trees.
    for name, baseline in plan.baselines.items():
        if name != HOST_TREE or plan.host_tree:
            assert plan.best.time_to_epsilon_ms <= baseline.time_to_epsilon_ms, name
    assert plan.best.time_to_epsilon_ms >= plan.lower_bound_ms


def test_a_capped_aggregator_flips_the_doublezero9_answer():
    dz9 = load_topology("doublezero9")
    ideal = plan_schedule(dz9, model_bytes=100_000_000, iterations=100)
    capped = plan_schedule(dz9, model_bytes=100_000_000, iterations=100, aggregator="port10g")
    # Ideal: the global clique aggregates at NYC. Capped at one 10 Gb/s port, it falls back to all-to-all.
    assert ideal.baselines["global"].rounds[0][0].aggregator == "NYC"
    assert capped.baselines["global"].rounds[0][0].exchange == "all-to-all"
    assert capped.baselines["global"].time_to_epsilon_ms > 1.5 * ideal.baselines["global"].time_to_epsilon_ms
    assert capped.best.time_to_epsilon_ms < 0.8 * capped.baselines["global"].time_to_epsilon_ms
    assert len(capped.best.rounds) > 1


# --- schedule file and CLI --------------------------------------------------------------------------

def schedule_cli(*argv):
    return main(["schedule", *argv])


def test_schedule_file_states_the_hardware_and_objective(tmp_path, capsys):
    out = tmp_path / "s.json"
    assert schedule_cli("--islands", "LON,NYC,FRA,TYO,SIN,LAX", "--model-mb", "100", "--aggregator", "port10g",
                        "--reduce-in-path", "--local-steps", "2", "--step-ms", "10", "--out", str(out)) == 0
    document = json.loads(out.read_text())
    kept = {"topology", "islands", "model_bytes", "epsilon", "multicast", "aggregation", "seed", "rounds",
            "period_ms", "rho", "periods", "time_to_epsilon_ms", "baselines", "lower_bound_ms", "method"}
    assert kept <= set(document)
    assert document["aggregator"]["profile"] == "port10g" and document["aggregator"]["ingress_gbps"] == 10
    assert document["reduce_in_path"] is True and document["local_steps"] == 2 and document["step_ms"] == 10
    assert 0 <= document["spectral_radius"] <= document["rho"] + 1e-12
    for entry in document["rounds"]:
        assert max(c["time_ms"] for c in entry["cliques"]) == pytest.approx(entry["time_ms"])
        for clique in entry["cliques"]:
            assert ("tree" in clique) == (clique["exchange"] == AGGREGATE)
    assert load_schedule_file(out).document == document
    assert "reduce in path on" in capsys.readouterr().out


def test_the_schedule_says_balanced_routing_was_used(tmp_path, capsys):
    """`--routing balanced` is accepted, printed in the header and written in the file, and every clique time
    in the file is the cost model's under that routing."""
    out = tmp_path / "s.json"
    islands = ["SIN", "FRA", "AMS", "LON"]
    assert schedule_cli("--islands", ",".join(islands), "--model-mb", "100", "--routing", "balanced",
                        "--out", str(out)) == 0
    assert "routing balanced" in capsys.readouterr().out
    document = json.loads(out.read_text())
    assert document["routing"] == "balanced"
    model = CostModel(load_topology("doublezero9"), islands, 100_000_000, routing="balanced")
    for entry in document["rounds"]:
        cliques = [Clique(tuple(c["members"]), c["aggregator"], c["exchange"]) for c in entry["cliques"]]
        assert [c["time_ms"] for c in entry["cliques"]] == pytest.approx(model.clique_times(cliques))


def test_a_tree_that_does_not_reach_the_root_is_rejected(tmp_path):
    document = {"islands": ["A", "B"], "rounds": [{"cliques": [
        {"members": ["A", "B"], "aggregator": "B", "exchange": "aggregate", "tree": {"X": "Y", "Y": "X"}}]}]}
    path = tmp_path / "s.json"
    path.write_text(json.dumps(document))
    with pytest.raises(ScheduleError, match="does not lead every city to the aggregator 'B'"):
        load_schedule_file(path)


@pytest.mark.parametrize("tree, message", [
    ({"B": "X", "X": "B"}, "gives the aggregator 'B' a parent"),
    ({"Q": "B"}, "maps 'Q', which is neither a member nor a city that others send to"),
    ({"A": "X"}, "does not lead every city to the aggregator 'B'"),
    ({"A": 3}, "must map city names to their parent city"),
])
def test_a_malformed_tree_is_rejected(tmp_path, tree, message):
    document = {"islands": ["A", "B"], "rounds": [{"cliques": [
        {"members": ["A", "B"], "aggregator": "B", "exchange": "aggregate", "tree": tree}]}]}
    path = tmp_path / "s.json"
    path.write_text(json.dumps(document))
    with pytest.raises(ScheduleError, match=message):
        load_schedule_file(path)


def test_a_tree_is_kept_per_clique(tmp_path):
    document = {"islands": ["A", "B", "C"], "rounds": [{"cliques": [
        {"members": ["A", "B", "C"], "aggregator": "C", "tree": {"X": "C", "A": "X", "B": "X"}}]},
        {"cliques": [{"members": ["A", "C"], "aggregator": "A"}]}]}
    path = tmp_path / "s.json"
    path.write_text(json.dumps(document))
    plan = load_schedule_file(path)
    assert plan.trees == (({"X": "C", "A": "X", "B": "X"},), (None,))
    assert plan.period == (((("A", "B", "C"), "C"),), ((("A", "C"), "A"),))


@pytest.mark.parametrize("argv, message", [
    (["--aggregator", "fpga9"], "unknown aggregator profile 'fpga9'"),
    (["--aggregator", "/no/such/report.json"], "cannot read build report"),
    (["--step-ms", "-5"], "--step-ms must be 0 or more"),
    (["--local-steps", "-1"], "--local-steps must be 0 or more"),
    (["--sweep", "--step-ms", "10,-1"], "--step-ms"),
    (["--sweep", "--aggregator", "ideal,nope"], "unknown aggregator profile 'nope'"),
    (["--aggregator", "ideal,port10g"], "a comma-separated list only with --sweep"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, argv, message):
    assert schedule_cli(*argv, "--out", str(tmp_path / "s.json")) == 2
    error = capsys.readouterr().err
    assert message in error and error.count("\n") == 1


def test_a_report_without_a_core_clock_is_one_line(tmp_path, capsys):
    report = tmp_path / "report.json"
    report.write_text(json.dumps({"board": "versa_ecp5", "data_width": 8, "timing_met": True}))
    assert schedule_cli("--aggregator", str(report), "--out", str(tmp_path / "s.json")) == 2
    error = capsys.readouterr().err
    assert "needs a positive 'core_clock_mhz'" in error and error.count("\n") == 1
