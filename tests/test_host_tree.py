"""The host-side tree all-reduce (exchange "host-tree"): no aggregator, each island's host sums what passes
through it on the latency-shortest-path tree from a root, then sends the result back down the same tree.

The expected times are worked out here from the rules alone (docs/schedule.md), not with the cost model's
helpers: a clique's time is the farthest member's path from the root there and back (sums are pipelined
chunk by chunk) plus the serialization of what its busiest resource carries. A link of the tree carries one
vector per direction (a partial up, the result down), a host NIC the vectors it receives and sends.
"""

import heapq
import json

import pytest

from inwire.cli import main
from inwire.plan.baselines import BASELINE_NAMES
from inwire.plan.cost import HOST_TREE, Clique, CostModel, ScheduleError
from inwire.plan.schedule_file import load_schedule_file
from inwire.plan.search import plan_schedule
from inwire.plan.topology import load_topology, topology_from_dict
from inwire.protocol import ELEMENT_BYTES, FRAME_HEADER_BYTES, MAX_ELEMENTS_PER_FRAME, WIRE_OVERHEAD_BYTES
from inwire.stream import load_plan

DOUBLEZERO9 = [("SEO", "TYO", 4.50), ("TYO", "LAX", 57.62), ("TYO", "SIN", 44.95), ("SIN", "LAX", 121.56),
               ("SIN", "FRA", 52.42), ("LAX", "NYC", 25.72), ("NYC", "BAR", 55.32), ("NYC", "LON", 45.60),
               ("LON", "AMS", 1.45), ("LON", "FRA", 4.96), ("AMS", "FRA", 2.11)]
"""The dedicated links (one-way ms, 10 Gb/s each); its public paths are all slower than the dedicated routes."""
TRUNK_GBPS = 10


def vector_ms(model_bytes, gbps):
    """One model on the wire at `gbps`: int32 elements in frames of MAX_ELEMENTS_PER_FRAME, each frame with
    its header and the preamble, FCS and gap."""
    elements = -(-model_bytes // ELEMENT_BYTES)
    frames = -(-elements // MAX_ELEMENTS_PER_FRAME)
    return 8 * (frames * (FRAME_HEADER_BYTES + WIRE_OVERHEAD_BYTES) + elements * ELEMENT_BYTES) / (gbps * 1e6)


def shortest_path_tree(links, root):
    """Dijkstra by hand: each city's distance from `root` and its parent toward it."""
    neighbours = {}
    for a, b, ms in links:
        neighbours.setdefault(a, []).append((b, ms))
        neighbours.setdefault(b, []).append((a, ms))
    distance, parent, heap = {root: 0.0}, {}, [(0.0, root)]
    while heap:
        d, city = heapq.heappop(heap)
        if d > distance[city]:
            continue
        for other, ms in neighbours[city]:
            if d + ms < distance.get(other, float("inf")):
                distance[other], parent[other] = d + ms, city
                heapq.heappush(heap, (d + ms, other))
    return distance, parent


def independent_time_ms(links, root, model_bytes, nic_gbps=None):
    """Every city an island: one vector per tree link per direction at TRUNK_GBPS; a host with c children
    receives c partials (and the result unless it is the root) and sends as many."""
    distance, parent = shortest_path_tree(links, root)
    propagation = 2 * max(distance.values())
    busiest = vector_ms(model_bytes, TRUNK_GBPS)
    if nic_gbps is not None:
        children = {}
        for up in parent.values():
            children[up] = children.get(up, 0) + 1
        vectors = max(children.get(city, 0) + (city != root) for city in distance)
        busiest = max(busiest, vectors * vector_ms(model_bytes, nic_gbps))
    return propagation + busiest


@pytest.fixture(scope="module")
def dz9():
    return load_topology("doublezero9")


@pytest.mark.parametrize("model_mb, quoted_ms", [(1, 204.0), (10, 211.8), (100, 289.5), (1000, 1066.2)])
def test_doublezero9_host_tree_matches_the_independent_calculation(dz9, model_mb, quoted_ms):
    model_bytes = model_mb * 10**6
    cities = sorted({c for a, b, _ in DOUBLEZERO9 for c in (a, b)})
    expected = {root: independent_time_ms(DOUBLEZERO9, root, model_bytes) for root in cities}
    root = min(expected, key=expected.get)
    assert root == "NYC"
    assert expected[root] == pytest.approx(quoted_ms, abs=0.05)  # the figures docs/schedule.md quotes
    model = CostModel(dz9, dz9.resolve_islands(), model_bytes)
    clique = model.host_tree_clique(model.islands)
    assert clique.members[0] == root and clique.exchange == HOST_TREE and clique.aggregator is None
    assert model.round_time([clique]) == pytest.approx(expected[root], rel=1e-9)
    for other in cities:
        trial = Clique((other,) + tuple(m for m in model.islands if m != other), None, HOST_TREE)
        assert model.round_time([trial]) == pytest.approx(expected[other], rel=1e-9), other


def test_doublezero9_host_tree_behind_10_gbps_nics(dz9):
    # NYC has three tree neighbours whichever city is the root: three vectors through its 10 Gb/s NIC.
    cities = sorted({c for a, b, _ in DOUBLEZERO9 for c in (a, b)})
    expected = {root: independent_time_ms(DOUBLEZERO9, root, 10**8, nic_gbps=10) for root in cities}
    assert min(expected, key=expected.get) == "NYC"
    assert expected["NYC"] == pytest.approx(203.16 + 3 * vector_ms(10**8, 10))
    assert expected["NYC"] == pytest.approx(462.1, abs=0.05)
    model = CostModel(dz9, dz9.resolve_islands(), 10**8, host_nic_gbps=10)
    clique = model.host_tree_clique(model.islands)
    assert clique.members[0] == "NYC"
    assert model.round_time([clique]) == pytest.approx(expected["NYC"], rel=1e-9)
    # Unlimited NICs (and ideal aggregators) add no resource beside the links: every other figure stays.
    unlimited = CostModel(dz9, dz9.resolve_islands(), 10**8)
    assert len(unlimited.capacity_bps) == len(unlimited.edge_index)


def hand(links):
    """Links as (a, b, latency ms, Gb/s); every city aggregates and multicasts."""
    cities = sorted({c for a, b, *_ in links for c in (a, b)})
    return topology_from_dict({
        "name": "hand", "cities": [{"name": c, "lat": 0, "lon": i} for i, c in enumerate(cities)],
        "links": [{"a": a, "b": b, "latency_ms": ms, "bandwidth_gbps": gbps} for a, b, ms, gbps in links]})


STAR = [("A", "B", 10, 1), ("B", "C", 5, 1), ("B", "D", 20, 1)]
"""B in the middle: A 10 ms, C 5 ms, D 20 ms away, all at 1 Gb/s."""
MB = 10**6
V_1G = 8 * ((-(-250_000 // 482)) * (128 + 24) + 10**6) / 1e6
"""1 MB: 250,000 elements in 519 frames of up to 482 = 1,078,888 bytes on the wire, 8.631 ms at 1 Gb/s."""


def test_by_hand_on_a_star():
    assert V_1G == pytest.approx(8.631104)
    model = CostModel(hand(STAR), ["A", "B", "C", "D"], MB)
    # Rooted at B: the farthest member, D, 20 ms away and back; every link one vector each way.
    clique = model.host_tree_clique(["A", "B", "C", "D"])
    assert clique.members[0] == "B"
    assert model.round_time([clique]) == pytest.approx(40 + V_1G)
    # Rooted at A: D is 30 ms away; the same loads.
    assert model.round_time([Clique(("A", "B", "C", "D"), None, HOST_TREE)]) == pytest.approx(60 + V_1G)
    # B's host receives A's, C's and D's partials and sends each the result: three vectors on a 1 Gb/s NIC.
    nic = CostModel(hand(STAR), ["A", "B", "C", "D"], MB, host_nic_gbps=1)
    assert nic.round_time([nic.host_tree_clique(["A", "B", "C", "D"])]) == pytest.approx(40 + 3 * V_1G)


def test_by_hand_a_city_outside_the_clique_only_forwards():
    # Members A, C, D; B is no member, so it does not sum: rooted at C (D 25 ms away), the link B-C carries
    # A's and D's vectors up and the result down to each of them.
    model = CostModel(hand(STAR), ["A", "B", "C", "D"], MB)
    clique = model.host_tree_clique(["A", "C", "D"])
    assert clique.members[0] == "C"
    assert model.round_time([clique]) == pytest.approx(50 + 2 * V_1G)


def test_host_nics_limit_the_other_exchanges_too():
    model = CostModel(hand(STAR), ["A", "B", "C", "D"], MB, host_nic_gbps=0.5)
    # All-to-all of A, C, D: the farthest pair, A-D, is 30 ms apart; each host receives two vectors, at
    # 0.5 Gb/s as long as 4 at 1 Gb/s (B's links carry two each way, B multicasting).
    assert model.round_time([Clique(("A", "C", "D"), None, "all-to-all")]) == pytest.approx(30 + 4 * V_1G)
    # Aggregating at B: each member's host sends its vector and receives the sum, 2 V at 1 Gb/s on the NIC.
    assert model.round_time([Clique(("A", "C", "D"), "B")]) == pytest.approx(2 * 20 + 2 * V_1G)


def test_optimizer_takes_host_trees_only_when_offered(dz9):
    plain = plan_schedule(dz9, model_bytes=10**8, iterations=50)
    assert all(c.exchange != HOST_TREE for cliques in plain.best.rounds for c in cliques)
    offered = plan_schedule(dz9, model_bytes=10**8, iterations=50, host_tree=True)
    assert offered.best.rounds == offered.baselines[HOST_TREE].rounds
    assert offered.best.time_to_epsilon_ms == pytest.approx(plain.baselines[HOST_TREE].time_to_epsilon_ms)
    with pytest.raises(ScheduleError, match="host NIC"):
        CostModel(dz9, dz9.resolve_islands(), 10**8, host_nic_gbps=0)


def test_cli_reports_the_host_tree_and_its_file_loads(tmp_path, capsys):
    out = tmp_path / "s.json"
    assert main(["schedule", "--model-mb", "100", "--no-host-tree", "--out", str(out)]) == 0
    table = capsys.readouterr().out
    # Not offered, it is still printed, marked as no candidate.
    assert any(line.split()[:1] == [HOST_TREE + "*"] and "289.5" in line for line in table.splitlines())
    assert f"{HOST_TREE}*: not a candidate: host trees not offered (--no-host-tree)" in table
    document = json.loads(out.read_text())
    assert set(document["baselines"]) == set(BASELINE_NAMES)
    [[entry]] = [r["cliques"] for r in document["baselines"][HOST_TREE]["rounds"]]
    assert entry["exchange"] == HOST_TREE and entry["aggregator"] is None and entry["members"][0] == "NYC"
    assert "tree" not in entry and document["host_nic_gbps"] is None and document["host_tree"] is False
    assert document["excluded_baselines"] == {HOST_TREE: "host trees not offered (--no-host-tree)"}
    # A schedule of host trees loads (the stream sums it as any direct exchange); one naming an aggregator not.
    document["rounds"] = document["baselines"][HOST_TREE]["rounds"]
    out.write_text(json.dumps(document))
    assert load_schedule_file(out).period == (((tuple(entry["members"]), None),),)
    assert load_plan(out).cliques(0) == ((tuple(entry["members"]), None),)
    entry["aggregator"] = "NYC"
    out.write_text(json.dumps(document))
    with pytest.raises(ScheduleError, match="host-tree clique has no aggregator"):
        load_schedule_file(out)
