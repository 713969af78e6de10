import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inwire.cli import main
from inwire.cli.schedule import run_sweep
from inwire.plan.aggregator import load_aggregator
from inwire.plan.baselines import BASELINE_NAMES, lower_bound_ms
from inwire.plan.cost import ALL_TO_ALL, HOST_TREE, RING, Clique, CostModel, Schedule, ScheduleError, wire_bytes
from inwire.plan.mixing import mixing_product, mixing_rate, periods_to_epsilon, time_to_epsilon_ms
from inwire.plan.schedule_file import load_schedule_file, member_paths, schedule_document
from inwire.plan.search import Evaluator, PlanResult, plan_schedule
from inwire.plan.topology import generate_topology, load_topology, topology_from_dict
from inwire.protocol import FRAME_HEADER_BYTES, MAX_ELEMENTS_PER_FRAME, ROUTE_HOPS, WIRE_OVERHEAD_BYTES
from inwire.stream import clique_routes, clique_trees, load_plan

# A model of exactly 1000 full frames, and the time one copy of it takes on a 1 Gb/s link
# (16.6 ms at 482 elements per frame).
FULL_FRAMES_MODEL = 1000 * MAX_ELEMENTS_PER_FRAME * 4
FRAME_MS_AT_1G = 1000 * (FRAME_HEADER_BYTES + WIRE_OVERHEAD_BYTES + 4 * MAX_ELEMENTS_PER_FRAME) * 8 / 1e6


def topology(cities, links):
    return topology_from_dict({
        "name": "hand",
        "cities": [{"name": c, "lat": 0, "lon": i} for i, c in enumerate(cities)],
        "links": [{"a": a, "b": b, "latency_ms": ms, "bandwidth_gbps": 1} for a, b, ms in links]})


def dumbbell(aggregation=True, multicast=True):
    """A1, A2 -- X == Y -- B1, B2: leaves 1 ms away, the X-Y trunk 10 ms; every link 1 Gb/s."""
    hand = topology(["A1", "A2", "X", "Y", "B1", "B2"],
                    [("A1", "X", 1), ("A2", "X", 1), ("X", "Y", 10), ("Y", "B1", 1), ("Y", "B2", 1)])
    return CostModel(hand, ["A1", "A2", "B1", "B2"], FULL_FRAMES_MODEL, multicast, aggregation)


# --- wire bytes -----------------------------------------------------------------------------------

def test_wire_bytes_counts_headers_and_wire_overhead_per_frame():
    per_frame = FRAME_HEADER_BYTES + WIRE_OVERHEAD_BYTES
    assert wire_bytes(4) == per_frame + 4
    assert wire_bytes(1) == per_frame + 4  # a partial element still takes a whole int32
    assert wire_bytes(4 * MAX_ELEMENTS_PER_FRAME) == per_frame + 4 * MAX_ELEMENTS_PER_FRAME
    assert wire_bytes(4 * MAX_ELEMENTS_PER_FRAME + 4) == 2 * per_frame + 4 * MAX_ELEMENTS_PER_FRAME + 4
    assert wire_bytes(FULL_FRAMES_MODEL) == 1000 * (per_frame + 4 * MAX_ELEMENTS_PER_FRAME)
    with pytest.raises(ScheduleError):
        wire_bytes(0)


# --- mixing ---------------------------------------------------------------------------------------

def test_a_three_by_three_grid_mixes_exactly_in_two_rounds():
    islands = list("abcdefghi")
    rows = [["a", "b", "c"], ["d", "e", "f"], ["g", "h", "i"]]
    columns = [list(c) for c in zip(*rows)]
    assert np.allclose(mixing_product(islands, [rows, columns]), 1 / 9)
    assert mixing_rate(islands, [rows, columns]) < 1e-12
    assert periods_to_epsilon(mixing_rate(islands, [rows, columns]), 1e-6) == 1
    # Rows alone never mix across rows: rho stays 1 and consensus never comes.
    assert mixing_rate(islands, [rows]) == pytest.approx(1)
    assert math.isinf(time_to_epsilon_ms(mixing_rate(islands, [rows]), 10.0, 1e-3))


def test_rho_of_a_hand_built_chain():
    # Round 1 averages a,b; round 2 averages b,c. By hand, W2 W1 = [[1/2,1/2,0],[1/4,1/4,1/2],[1/4,1/4,1/2]].
    hand = np.array([[0.5, 0.5, 0], [0.25, 0.25, 0.5], [0.25, 0.25, 0.5]])
    islands = ["a", "b", "c"]
    assert np.allclose(mixing_product(islands, [[["a", "b"]], [["b", "c"]]]), hand)
    deviation = hand - 1 / 3
    # rho is the largest singular value: the square root of the top eigenvalue of D^T D.
    expected = math.sqrt(max(np.linalg.eigvalsh(deviation.T @ deviation)))
    assert mixing_rate(islands, [[["a", "b"]], [["b", "c"]]]) == pytest.approx(expected)
    assert 0 < expected < 1


def test_periods_to_epsilon():
    assert periods_to_epsilon(0.5, 1e-3) == 10  # 0.5**10 < 1e-3 < 0.5**9
    assert periods_to_epsilon(0.1, 1e-3) == 3  # exactly 0.1**3, despite round-off in the logarithms
    assert periods_to_epsilon(1e-12, 1e-3) == 1
    assert math.isinf(periods_to_epsilon(1.0, 1e-3))
    assert time_to_epsilon_ms(0.5, 20.0, 1e-3) == 200.0


# --- time model on hand-checked cases ---------------------------------------------------------------

def test_two_islands_one_link():
    hand = topology(["A", "B"], [("A", "B", 10)])
    model = CostModel(hand, ["A", "B"], FULL_FRAMES_MODEL)
    # Aggregating at A: B's vector goes up and the sum comes back, 20 ms round trip + one vector per direction.
    assert model.round_time([Clique(("A", "B"), "A")]) == pytest.approx(20 + FRAME_MS_AT_1G)
    # Direct exchange needs one way only.
    assert model.round_time([Clique(("A", "B"), None, ALL_TO_ALL)]) == pytest.approx(10 + FRAME_MS_AT_1G)
    # A two-member ring: 2 steps of 10 ms, each carrying half the vector (500 full frames) each way.
    assert model.round_time([Clique(("A", "B"), None, RING)]) == pytest.approx(20 + FRAME_MS_AT_1G)


def test_concurrent_cliques_share_the_trunk():
    model = dumbbell()
    left = Clique(("A1", "B1"), "Y")
    right = Clique(("A2", "B2"), "Y")
    alone = 2 * 11 + FRAME_MS_AT_1G
    assert model.round_time([left]) == pytest.approx(alone)
    # Both upstream vectors cross X->Y in the same round.
    assert model.round_time([left, right]) == pytest.approx(2 * 11 + 2 * FRAME_MS_AT_1G)


def test_global_clique_aggregated_at_the_trunk_end():
    model = dumbbell()
    # At Y: A1 and A2 send over X->Y (two vectors); the farthest member is 11 ms away.
    assert model.round_time([Clique(("A1", "A2", "B1", "B2"), "Y")]) == pytest.approx(22 + 2 * FRAME_MS_AT_1G)


def test_multicast_saves_the_trunk_in_direct_exchange():
    everyone = ("A1", "A2", "B1", "B2")
    # All-to-all: the longest one-way path is 12 ms. With multicast each sender crosses the trunk once
    # (2 vectors on X->Y) and a leaf receives 3 vectors; without, the trunk carries A1, A2 to B1, B2: 4.
    with_multicast = dumbbell(aggregation=False, multicast=True)
    without = dumbbell(aggregation=False, multicast=False)
    assert with_multicast.round_time([Clique(everyone, None, ALL_TO_ALL)]) == pytest.approx(12 + 3 * FRAME_MS_AT_1G)
    assert without.round_time([Clique(everyone, None, ALL_TO_ALL)]) == pytest.approx(12 + 4 * FRAME_MS_AT_1G)


def test_without_aggregation_cliques_exchange_directly():
    model = dumbbell(aggregation=False)
    kinds = {clique.exchange for clique in model.options(("A1", "B1", "B2"))}
    assert kinds == {ALL_TO_ALL, RING}
    cliques, duration, exhaustive = model.best_round([["A1", "B1"], ["A2", "B2"]])
    assert exhaustive and all(c.aggregator is None for c in cliques)
    assert duration == pytest.approx(model.round_time(cliques))


def test_best_round_picks_the_fastest_aggregators():
    model = dumbbell()
    cliques, duration, exhaustive = model.best_round([["A1", "A2", "B1", "B2"]])
    assert exhaustive
    alone = {city: model.round_time([Clique(cliques[0].members, city)]) for city in model.aggregation_cities}
    assert duration == pytest.approx(min(alone.values()))


# --- lower bound, baselines and the optimizer -------------------------------------------------------

@settings(max_examples=40, deadline=None)
@given(st.lists(st.lists(st.integers(0, 3), min_size=9, max_size=9), min_size=1, max_size=4),
       st.sampled_from([1e5, 1e8, 1e10]), st.booleans(), st.booleans())
def test_no_schedule_beats_the_lower_bound(labels, model_bytes, multicast, aggregation):
    dz9 = load_topology("doublezero9")
    model = CostModel(dz9, dz9.resolve_islands(), model_bytes, multicast, aggregation)
    evaluator = Evaluator(model, 1e-3)
    rounds = [[[island for island, label in zip(model.islands, round_labels) if label == group]
               for group in range(4)] for round_labels in labels]
    schedule = evaluator.evaluate(rounds)
    assert schedule.time_to_epsilon_ms >= lower_bound_ms(model, 1e-3)


def check_valid(plan, islands, aggregation_cities):
    for schedule in [plan.best, *plan.baselines.values()]:
        assert len(schedule.round_times_ms) == len(schedule.rounds)
        for cliques in schedule.rounds:
            seen = [m for c in cliques for m in c.members]
            assert len(seen) == len(set(seen)), "an island in two cliques of one round"
            assert set(seen) <= set(islands)
            for clique in cliques:
                assert len(clique.members) >= 2
                if clique.aggregator is not None:
                    assert clique.aggregator in aggregation_cities


@pytest.fixture(scope="module")
def dz9_plan():
    return plan_schedule(load_topology("doublezero9"), model_bytes=100_000_000, epsilon=1e-3, seed=1,
                         iterations=300)


def runnable(baselines):
    """The baselines the optimizer takes as candidates: all but the host-side tree, a competitor it is not
    offered by default."""
    return {name: baseline for name, baseline in baselines.items() if name != HOST_TREE}


def test_optimizer_is_never_worse_than_a_baseline(dz9_plan):
    assert set(dz9_plan.baselines) == set(BASELINE_NAMES)
    for name, baseline in runnable(dz9_plan.baselines).items():
        assert dz9_plan.best.time_to_epsilon_ms <= baseline.time_to_epsilon_ms, name
    # At 100 MB the host-side tree (unlimited NICs) beats every schedule through ideal aggregators.
    assert dz9_plan.baselines[HOST_TREE].time_to_epsilon_ms < 0.6 * dz9_plan.best.time_to_epsilon_ms
    assert dz9_plan.best.time_to_epsilon_ms >= dz9_plan.lower_bound_ms
    check_valid(dz9_plan, dz9_plan.islands, set(dz9_plan.islands))
    assert "exhaustive" in dz9_plan.method


def test_reported_figures_are_consistent(dz9_plan):
    for schedule in [dz9_plan.best, *dz9_plan.baselines.values()]:
        groups = [[c.members for c in cliques] for cliques in schedule.rounds]
        assert schedule.rho == pytest.approx(mixing_rate(dz9_plan.islands, groups), abs=1e-12)
        assert schedule.period_ms == pytest.approx(sum(schedule.round_times_ms))
        assert schedule.time_to_epsilon_ms == time_to_epsilon_ms(schedule.rho, schedule.period_ms, 1e-3)


def test_small_models_take_one_global_clique():
    dz9 = load_topology("doublezero9")
    plan = plan_schedule(dz9, model_bytes=1000, epsilon=1e-3, iterations=100)
    # Latency dominates: one round, everyone sending straight to everyone, as long as the longest path.
    diameter = max(dz9.latency_ms(a, b) for a in dz9.cities for b in dz9.cities)
    assert plan.best.rounds == ((Clique(plan.islands, None, ALL_TO_ALL),),)
    assert plan.best.period_ms == pytest.approx(diameter, abs=0.1)
    # Aggregating in line costs the round trip to the city nearest the farthest island: NYC.
    model = CostModel(dz9, plan.islands, 1000)
    at = {city: model.round_time([Clique(plan.islands, city)]) for city in dz9.cities}
    assert min(at, key=at.get) == "NYC"
    assert at["NYC"] == pytest.approx(2 * dz9.latency_ms("SIN", "NYC"), abs=0.1)


def test_no_aggregation_plan_uses_direct_exchange():
    plan = plan_schedule(load_topology("doublezero9"), islands=["LON", "NYC", "FRA", "AMS"],
                         model_bytes=10_000_000, aggregation=False, iterations=100)
    assert all(c.aggregator is None and c.exchange in (ALL_TO_ALL, RING)
               for cliques in plan.best.rounds for c in cliques)
    for baseline in runnable(plan.baselines).values():
        assert plan.best.time_to_epsilon_ms <= baseline.time_to_epsilon_ms


def test_generated_topology_plan_is_valid_and_seeded():
    topology = generate_topology(16, seed=2)
    first = plan_schedule(topology, model_bytes=10_000_000, seed=5, iterations=100)
    again = plan_schedule(topology, model_bytes=10_000_000, seed=5, iterations=100)
    assert first.best.rounds == again.best.rounds
    check_valid(first, first.islands, set(topology.cities))
    for baseline in runnable(first.baselines).values():
        assert first.best.time_to_epsilon_ms <= baseline.time_to_epsilon_ms


def test_result_does_not_depend_on_hash_seeds():
    script = ("from inwire.plan.search import plan_schedule; from inwire.plan.schedule_file import "
              "schedule_document; from inwire.plan.topology import load_topology; import json; "
              "print(json.dumps(schedule_document(plan_schedule(load_topology('doublezero9'), model_bytes=10**9, "
              "seed=7, iterations=150, reduce_in_path=True, routing='bandwidth'))))")
    outputs = {subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                              env={**os.environ, "PYTHONHASHSEED": seed}).stdout for seed in ("1", "2")}
    assert len(outputs) == 1


# --- schedule file and CLI --------------------------------------------------------------------------

def schedule_cli(*argv):
    return main(["schedule", *argv])


def test_cli_writes_a_schedule_the_host_can_load(tmp_path, capsys):
    out = tmp_path / "schedule.json"
    assert schedule_cli("--islands", "LON,NYC,FRA,TYO", "--model-mb", "10", "--out", str(out), "--map",
                 str(tmp_path / "map.png")) == 0
    table = capsys.readouterr().out
    assert "optimized" in table and "lower bound" in table
    # The two mixing columns carry the JSON's names and are explained under the table.
    header = next(line for line in table.splitlines() if line.startswith("schedule "))
    assert header.split()[4:7] == ["rho", "spectral", "radius"] and "lambda" not in table
    assert "rho: ||P - J||" in table and "spectral radius: the largest |eigenvalue|" in table
    document = json.loads(out.read_text())
    assert document["islands"] == ["LON", "NYC", "FRA", "TYO"]
    assert document["model_bytes"] == 10_000_000
    # The spectral radius is filled in for the schedules written even when only rho scored them.
    assert all(0 <= entry["spectral_radius"] <= entry["rho"] + 1e-12
               for entry in [document, *document["baselines"].values()])
    assert set(document["baselines"]) == set(BASELINE_NAMES)
    for baseline in document["baselines"].values():
        assert {"period_ms", "rho", "time_to_epsilon_ms", "rounds"} <= set(baseline)
    assert document["time_to_epsilon_ms"] <= min(b["time_to_epsilon_ms"]
                                                  for b in runnable(document["baselines"]).values())
    loaded = load_schedule_file(out)
    assert loaded.document == document and loaded.islands == ("LON", "NYC", "FRA", "TYO")
    assert loaded.period == tuple(tuple((tuple(c["members"]), c["aggregator"]) for c in r["cliques"])
                                  for r in document["rounds"])
    assert (tmp_path / "map.png").stat().st_size > 0


@pytest.mark.parametrize("aggregator", ["ideal", "port10g"])
def test_planned_reduction_trees_fit_in_a_frame_with_no_tree_tables(tmp_path, aggregator):
    # Uncapped (the default: the trees are in the aggregators' tables), the global clique's tree takes SIN's vector
    # through four summing levels (to NYC with ideal aggregators, to LAX with port10g), which an unregistered stream
    # refuses; --no-tree-tables plans trees that stop at the header's limit.
    deepest = {}
    for switch in ("--tree-tables", "--no-tree-tables"):
        out = tmp_path / f"global{switch}.json"
        assert schedule_cli("--no-host-tree", "--aggregator", aggregator, switch, "--out", str(out)) == 0
        deepest[switch] = 0
        for _, _, members, root, tree in clique_trees(load_plan(out)):
            if tree:
                if switch == "--no-tree-tables":
                    clique_routes(members, root, tree, lambda city: 1)  # an unregistered stream's own check
                deepest[switch] = max(deepest[switch], *(len(path) for path in member_paths(members, root,
                                                                                           tree).values()))
    assert deepest == {"--tree-tables": 4, "--no-tree-tables": 1 + ROUTE_HOPS}


@pytest.mark.parametrize("argv, message", [
    (["--islands", "LON,PAR"], "unknown island 'PAR'"),
    (["--topology", "/no/such/file.json"], "cannot read topology"),
    (["--epsilon", "2"], "epsilon"),
    (["--model-mb", "0"], "--model-mb"),
    (["--model-mb", "inf"], "--model-mb"),
    (["--seed", "-1"], "--seed"),
    (["--sweep", "--model-mb", "1,x"], "--model-mb"),
    (["--model-mb", "10,100"], "--model-mb must be a number (a comma-separated list only with --sweep)"),
])
def test_cli_errors_are_one_line_and_exit_2(tmp_path, capsys, argv, message):
    assert schedule_cli(*argv, "--out", str(tmp_path / "s.json")) == 2
    error = capsys.readouterr().err
    assert message in error and error.count("\n") == 1


def test_cli_rejects_a_bad_topology_file(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"cities": [{"name": "A", "lat": 0, "lon": 0}, {"name": "B", "lat": 0, "lon": 1}],
                               "links": [{"a": "A", "b": "C", "latency_ms": 1, "bandwidth_gbps": 1}]}))
    assert schedule_cli("--topology", str(bad), "--out", str(tmp_path / "s.json")) == 2
    assert "links[0] (A-C): unknown city 'C'" in capsys.readouterr().err


def good_document():
    return {"islands": ["A", "B", "C"],
            "rounds": [{"cliques": [{"members": ["A", "B"], "aggregator": "A"}], "time_ms": 1},
                       {"cliques": [{"members": ["B", "C"], "aggregator": None, "exchange": "all-to-all"}],
                        "time_ms": 1}]}


@pytest.mark.parametrize("edit, message", [
    (lambda d: d["rounds"][0]["cliques"][0]["members"].append("Z"), "rounds[0].cliques[0]: 'Z'"),
    (lambda d: d["rounds"][0]["cliques"].append({"members": ["B", "C"], "aggregator": "C"}),
     "rounds[0].cliques[1]: island 'B' is in two cliques"),
    (lambda d: d["rounds"][0]["cliques"][0].update(aggregator=None), "needs an aggregator"),
    (lambda d: d["rounds"][1]["cliques"][0].update(exchange="gossip"), "'gossip'"),
    (lambda d: d.pop("rounds"), "'rounds'"),
])
def test_load_schedule_rejects_bad_files(tmp_path, edit, message):
    path = tmp_path / "s.json"
    path.write_text(json.dumps(good_document()))
    assert load_schedule_file(path).period == (((("A", "B"), "A"),), ((("B", "C"), None),))
    document = good_document()
    edit(document)
    path.write_text(json.dumps(document))
    with pytest.raises(ScheduleError, match=message.replace("[", r"\[").replace("]", r"\]").replace(".", r"\.")):
        load_schedule_file(path)


def test_infinite_times_are_written_as_null():
    never = Schedule(((Clique(("A", "B"), "A"),),), (5.0,), 1.0, math.inf, math.inf)
    plan = PlanResult("hand", ("A", "B", "C"), 1000, 1e-3, True, True, 0, never, {"rows": never}, 10.0, "hand", 1)
    document = json.loads(json.dumps(schedule_document(plan), allow_nan=False))
    assert document["time_to_epsilon_ms"] is None and document["periods"] is None
    assert document["baselines"]["rows"]["time_to_epsilon_ms"] is None


def test_sweep_writes_table_phase_plots_and_maps(tmp_path):
    dz9 = load_topology("doublezero9")
    profiles = [load_aggregator("ideal"), load_aggregator("versa_ecp5")]
    rows, table = run_sweep(dz9, ("LON", "NYC", "FRA", "TYO"), [1, 1000], 1e-3, 0, tmp_path, profiles=profiles,
                            steps_ms=[0, 100], iterations=50)
    assert len(rows) == 16  # 2 profiles x reduce off/on x 2 sizes x 2 step times
    assert table.count("\n") == 17
    for name in ("sweep.md", "sweep.json", "phase_global.png", "phase_grid2d.png", "phase_ring.png",
                 "map_1MB.png", "map_1000MB.png"):
        assert (tmp_path / name).stat().st_size > 0
    assert all(r["time_to_epsilon_ms"] <= min(r["best_baseline_ms"], r["global_ms"], r["grid2d_ms"], r["ring_ms"])
               for r in rows)
    assert {r["local_steps"] for r in rows if r["step_ms"] == 0} == {0}


def test_global_clique_writes_the_clique_of_every_island_the_ddp_hook_sums_in(tmp_path, capsys):
    """For nine islands the optimizer rotates cliques of three, which the DDP hook cannot sum in; with
    --global-clique the schedule is one clique of all nine at an aggregating city, and the hook takes it."""
    torch = pytest.importorskip("torch")  # noqa: F841  (inwire.train.ddp needs it)
    from inwire.train.ddp import global_clique

    optimized, one = tmp_path / "optimized.json", tmp_path / "global.json"
    assert main(["schedule", "--no-host-tree", "--no-reduce-in-path", "--out", str(optimized)]) == 0
    with pytest.raises(ValueError, match="inwire schedule --global-clique writes one"):
        global_clique(load_schedule_file(optimized))
    assert main(["schedule", "--global-clique", "--no-reduce-in-path", "--out", str(one)]) == 0
    assert "global clique schedule, one period:" in capsys.readouterr().out
    schedule = load_schedule_file(one)
    members, aggregator, tree = global_clique(schedule)
    assert sorted(members) == sorted(load_topology("doublezero9").cities) and len(schedule.period) == 1
    assert aggregator in members and tree is None
    # Its aggregating city is the fastest: no other city sums the nine sooner.
    model = CostModel(load_topology("doublezero9"), members, 100_000_000)
    times = {clique.aggregator: model.clique_time_alone(clique) for clique in model.options(members)
             if clique.aggregator is not None}
    assert times[aggregator] == min(times.values())


@pytest.mark.parametrize(("argv", "message"), [
    (["--global-clique", "--sweep"], "--global-clique writes one schedule; --sweep compares"),
    (["--global-clique", "--no-aggregation", "--out", "{tmp}/g.json"], "--global-clique: no city of the topology"),
])
def test_global_clique_refuses_what_it_cannot_write(tmp_path, capsys, argv, message):
    assert main(["schedule", *[word.format(tmp=tmp_path) for word in argv]]) == 2
    error = capsys.readouterr().err
    assert message in error and error.count("\n") == 1
    assert not list(tmp_path.iterdir())
