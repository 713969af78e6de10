"""The planner with reduction trees carried by the aggregators' tables (issue #37, `--tree-tables`, the default since
`inwire stream` registers trees): no cap on a tree's summing levels, results down the same tree, and each
aggregator's tables written for the control plane; `--no-tree-tables` plans the capped trees of version 2 frames."""

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
    carries two vectors (8 ms + 2V); with the tables every city sums and every link carries one (8 ms + V). The
    tables are the default: `--tree-tables` plans the same schedule as no switch at all."""
    capped = plan_chain(tmp_path, "--no-tree-tables")
    tables = plan_chain(tmp_path, "--tree-tables")
    assert plan_chain(tmp_path).document == tables.document
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


@pytest.mark.parametrize(("aggregator", "root"), [("ideal", "NYC"), ("versa_ecp5", "LAX")])
def test_the_depth_cause_counts_the_aggregators_a_contribution_climbs(aggregator, root):
    """The uncapped tree to the root takes SIN's vector through FRA, AMS, LON and NYC (ideal aggregators, 2 MB) or
    AMS -> LON -> NYC -> LAX (Versa boards, 100 MB): four summing levels, the root included. SIN's own city
    aggregates but gathers only SIN's stream, so it sums nothing and is no level; the cause says four."""
    from inwire.plan.aggregator import load_aggregator

    dz9 = load_topology("doublezero9")
    islands = dz9.resolve_islands()
    model_bytes = 2_000_000 if aggregator == "ideal" else 100_000_000
    profile = load_aggregator(aggregator)

    def model(tree_tables):
        return CostModel(dz9, islands, model_bytes, aggregator=profile, reduce_in_path=True, tree_tables=tree_tables)

    uncapped = model(True).profile(Clique(islands, root)).tree
    climbs = deepest(islands, root, uncapped)
    assert climbs == 4
    [depth] = [line for line in model(False).aggregation_limits(Clique(islands, None, ALL_TO_ALL))
               if line.startswith("depth:")]
    assert depth.startswith(f"depth: the tree to {root} has {climbs} summing levels;")


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


# --- the aggregators' tables for the control plane (--tables) ------------------------------------------------

def chain_levels():
    """Each aggregator city of the chain's global clique at C4 -> the members its level gathers, as a bitmap of
    the clique's member indices (C0 is 0): C1 gathers C0 and C1, ..., C5 gathers C5 to C8; C4, the root, all."""
    below = {f"C{i}": (1 << i + 1) - 1 for i in range(1, 4)}
    above = {f"C{i}": (1 << 9) - (1 << i) for i in range(5, 8)}
    return {**below, ROOT: 0, **above}


def test_tables_give_every_aggregator_of_the_chain_its_level_parent_and_children(tmp_path):
    tables_path = tmp_path / "tables.json"
    plan_chain(tmp_path, "--tree-tables", "--tables", str(tables_path))
    tables = json.loads(tables_path.read_text())
    levels = chain_levels()
    parents = {**{f"C{i}": f"C{i + 1}" for i in range(1, 4)}, ROOT: None, **{f"C{i}": f"C{i - 1}" for i in range(5, 8)}}
    children = {city: {child: levels[child] for child, up in parents.items() if up == city} for city in levels}
    assert tables["islands"] == CHAIN
    assert tables["cities"] == {
        city: {"members": {"C1": ["C0", "C1"], "C7": ["C7", "C8"]}.get(city, [city]),
               "routes": {"0": {"level": levels[city], "parent": parents[city], "children": children[city]}}}
        for city in CHAIN[1:8]}


def test_tables_are_the_entries_the_averager_registers(tmp_path):
    """What `tree_job_entries` builds for the written schedule (the islands and aggregators at addresses of their
    own) is what the tables file says, city by city, with the addresses named back."""
    pytest.importorskip("torch")
    from inwire.datagram import ip_int
    from inwire.jobs import JobEntry
    from inwire.train.averaging import tree_job_entries

    tables_path = tmp_path / "tables.json"
    schedule = plan_chain(tmp_path, "--tree-tables", "--tables", str(tables_path))
    islands = {city: (f"10.0.1.{i + 1}", 7000) for i, city in enumerate(CHAIN)}
    aggregators = {city: (f"10.0.2.{i + 1}", 18775) for i, city in enumerate(CHAIN)}
    named = {(ip_int(host), port): city for table in (islands, aggregators) for city, (host, port) in table.items()}
    entries = tree_job_entries(JobEntry(job=1, token=2, slots=8, members=frozenset()), schedule, islands, aggregators)
    assert {city: {"members": sorted(named[member] for member in entry.members),
                   "routes": {str(clique): {"level": route.level,
                                            "parent": None if route.parent is None else named[route.parent],
                                            "children": {named[child]: held for child, held in route.children.items()}}
                              for clique, route in entry.routes.items()}}
            for city, entry in entries.items()} == json.loads(tables_path.read_text())["cities"]


def clashing_plan(real_plan_schedule):
    """`plan_schedule` with its schedule replaced by two rounds of clique 0 that the tables cannot both hold:
    the global clique summed at C4 (C3 sends its level up to C4), then C0 to C3 summed at C3 (C3 the root)."""
    from dataclasses import replace

    from inwire.plan.search import Evaluator

    def plan(*args, **options):
        planned = real_plan_schedule(*args, **options)
        model = planned.cost_model
        rounds = [(Clique(tuple(CHAIN), ROOT),), (Clique(tuple(CHAIN[:4]), "C3"),)]
        return replace(planned, best=Evaluator(model, planned.epsilon).evaluate_cliques(rounds))
    return plan


def test_a_schedule_whose_cliques_clash_in_the_tables_is_refused_in_one_line_writing_nothing(
        tmp_path, capsys, monkeypatch):
    import inwire.cli.schedule as schedule_command

    monkeypatch.setattr(schedule_command, "plan_schedule", clashing_plan(schedule_command.plan_schedule))
    topology, out, tables = tmp_path / "chain9.json", tmp_path / "s.json", tmp_path / "tables.json"
    topology.write_text(json.dumps(chain_document()))
    argv = ["schedule", "--topology", str(topology), "--model-mb", "1", "--routing", "latency", "--out", str(out),
            "--tree-tables"]
    assert main([*argv, "--tables", str(tables)]) == 2
    assert capsys.readouterr().err == ("inwire schedule: --tables: schedule round 1, clique 0: C3's aggregator would "
                                       "hold another route for clique 0 than in an earlier round; a registered job's "
                                       "tables hold one route per clique index\n")
    assert not out.exists() and not tables.exists()
    # Without --tables the same schedule is written: only the tables cannot hold it.
    assert main(argv) == 0
    assert load_schedule_file(out).period == (((tuple(CHAIN), ROOT),), ((tuple(CHAIN[:4]), "C3"),))


@pytest.mark.parametrize("argv, message", [
    (["--no-tree-tables"], "--tables {tables}: only trees carried by the aggregators' tables have tables to write; "
                           "--no-tree-tables sends them in the frames"),
    (["--tree-tables", "--no-aggregation"], "--tables {tables}: no city of the topology aggregates in line (or "
                                            "--no-aggregation is given), so no aggregator holds tables"),
    (["--tree-tables", "--sweep"], "--tables writes one schedule's tables; --sweep compares the optimum over "
                                   "settings, give one or the other"),
    (["--tree-tables", "--sensitivity", "{sensitivity}"], "--sensitivity writes its own file and table; --tables "
                                                          "belongs to a plan, give one or the other"),
])
def test_tables_where_there_are_none_to_write_are_refused_in_one_line_writing_nothing(tmp_path, capsys, argv,
                                                                                      message):
    files = {"tables": tmp_path / "tables.json", "sensitivity": tmp_path / "sensitivity.json"}
    out = tmp_path / "s.json"
    argv = [part.format(**files) for part in argv]
    outputs = [] if "--sensitivity" in argv else ["--out", str(out)]
    assert main(["schedule", "--islands", "LON,NYC,FRA", "--model-mb", "1", *outputs, "--tables",
                 str(files["tables"]), *argv]) == 2
    assert capsys.readouterr().err == f"inwire schedule: {message.format(**files)}\n"
    assert list(tmp_path.iterdir()) == []


def test_on_doublezero9_the_uncapped_tree_ties_the_host_tree_and_the_capped_one_loses():
    """docs/schedule.md: at 100 MB the global clique summed at NYC takes 375.8 ms capped (LON forwards two
    vectors) and 289.5 ms with the tables, exactly the host tree's time (one vector per link and direction, the
    same propagation)."""
    dz9 = load_topology("doublezero9")
    islands = dz9.resolve_islands()

    def model(tree_tables):
        return CostModel(dz9, islands, 100_000_000, reduce_in_path=True, tree_tables=tree_tables)

    host_tree_ms = model(False).clique_time_alone(model(False).host_tree_clique(islands))
    capped_ms, tables_ms = (model(switch).clique_time_alone(Clique(islands, "NYC")) for switch in (False, True))
    assert (round(capped_ms, 1), round(tables_ms, 1), round(host_tree_ms, 1)) == (375.8, 289.5, 289.5)
    assert tables_ms == pytest.approx(host_tree_ms)
