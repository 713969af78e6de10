"""The planner with reduction trees carried by the aggregators' tables (issue #37, `--tree-tables`): no cap on a
tree's summing levels, results down the same tree, and each aggregator's tables written for the control plane."""

import json

import pytest

from inwire.cli import main
from inwire.plan.cost import ALL_TO_ALL, Clique, CostModel
from inwire.plan.schedule_file import load_schedule_file, member_paths
from inwire.plan.topology import load_topology, topology_from_dict
from inwire.protocol import FRAME_HEADER_BYTES, MAX_ELEMENTS_PER_FRAME, ROUTE_HOPS, WIRE_OVERHEAD_BYTES

FULL_FRAMES_MODEL = 1000 * MAX_ELEMENTS_PER_FRAME * 4
V_MS_AT_1G = 1000 * (FRAME_HEADER_BYTES + WIRE_OVERHEAD_BYTES + 4 * MAX_ELEMENTS_PER_FRAME) * 8 / 1e6
"""One vector of FULL_FRAMES_MODEL on a 1 Gb/s resource: 16.6 ms."""
CHAIN = [f"C{i}" for i in range(9)]
ROOT = "C4"
CHAIN_MS = 2 * 4
"""The chain's propagation term summed at its middle city: C0 (or C8) is 4 hops of 1 ms away, there and back."""


def chain_document():
    """C0 - C1 - ... - C8, 1 ms and 1 Gb/s each, an aggregator (ideal, multicast) in every city."""
    return {"name": "chain9", "cities": [{"name": city, "lat": 0, "lon": i} for i, city in enumerate(CHAIN)],
            "links": [{"a": a, "b": b, "latency_ms": 1, "bandwidth_gbps": 1} for a, b in zip(CHAIN, CHAIN[1:])]}


def chain_model(**options):
    return CostModel(topology_from_dict(chain_document()), CHAIN, FULL_FRAMES_MODEL, reduce_in_path=True, **options)


def deepest(members, root, tree):
    """The most summing levels a member's contribution climbs, its first aggregator's and the root included."""
    return max(len(path) for path in member_paths(members, root, tree).values())


def plan_chain(tmp_path, *argv):
    """`inwire schedule` on the chain (host NICs at the links' 1 Gb/s, so the host tree, whose middle hosts
    relay two vectors each way, does not tie the in-network tree): the loaded schedule file."""
    topology, out = tmp_path / "chain9.json", tmp_path / f"schedule{len(list(tmp_path.iterdir()))}.json"
    topology.write_text(json.dumps(chain_document()))
    assert main(["schedule", "--topology", str(topology), "--model-mb", str(FULL_FRAMES_MODEL / 1e6), "--routing",
                 "latency", "--host-nic-gbps", "1", "--out", str(out), *argv]) == 0
    return load_schedule_file(out)


def test_with_tree_tables_the_chain_sums_at_every_level_and_finishes_sooner(tmp_path):
    """Summed at C4, C0's contribution climbs C1, C2, C3 and C4 (C0 has one stream and sums nothing): 4 summing
    levels, more than the 3 a version 2 frame names. Capped, one city on each side forwards unsummed, so one link
    carries two vectors (8 ms + 2V); with the tables every city sums and every link carries one (8 ms + V)."""
    capped = plan_chain(tmp_path)
    tables = plan_chain(tmp_path, "--tree-tables")
    for plan in (capped, tables):
        assert plan.period == (((tuple(CHAIN), ROOT),),)
    capped_tree, tables_tree = capped.trees[0][0], tables.trees[0][0]
    assert deepest(CHAIN, ROOT, capped_tree) == 1 + ROUTE_HOPS
    assert tables_tree == {**dict(zip(CHAIN[:4], CHAIN[1:5])), **dict(zip(CHAIN[5:], CHAIN[4:]))}
    assert deepest(CHAIN, ROOT, tables_tree) == 4
    assert capped.document["time_to_epsilon_ms"] == pytest.approx(CHAIN_MS + 2 * V_MS_AT_1G)
    assert tables.document["time_to_epsilon_ms"] == pytest.approx(CHAIN_MS + V_MS_AT_1G)
    assert (capped.document["tree_tables"], tables.document["tree_tables"]) == (False, True)


def test_the_depth_cause_is_given_only_where_the_tree_is_capped():
    """doublezero9 at 2 MB: the all-to-all exchange beats summing at NYC either way (propagation alone is more);
    only the capped planner gives the depth of the tree to NYC as a cause."""
    dz9 = load_topology("doublezero9")
    islands = dz9.resolve_islands()
    clique = Clique(islands, None, ALL_TO_ALL)

    def causes(tree_tables):
        model = CostModel(dz9, islands, 2_000_000, reduce_in_path=True, tree_tables=tree_tables)
        return [line.split(":")[0] for line in model.aggregation_limits(clique)]

    assert causes(False) == ["depth", "links"]
    assert causes(True) == ["links"]


@pytest.mark.parametrize("multicast", [True, False], ids=["multicast", "unicast"])
def test_results_come_down_the_same_tree_one_copy_per_link(multicast):
    """Every link of the chain carries one vector each way: the partial up, the result down. Without multicast
    each summing city takes one copy of the result and passes it on (an aggregator sends it to its children), so
    no link carries the copies of the members below it."""
    model = chain_model(tree_tables=True, multicast=multicast)
    profile = model.profile(Clique(tuple(CHAIN), ROOT))
    loads = {edge: profile.loads_bits[i] / model.vector_bits for edge, i in model.edge_index.items()}
    assert loads == {edge: 1.0 for edge in model.edge_index}
    assert model.clique_time_alone(Clique(tuple(CHAIN), ROOT)) == pytest.approx(CHAIN_MS + V_MS_AT_1G)
