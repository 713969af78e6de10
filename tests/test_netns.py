"""A real multi-host run on one machine: aggregator and islands in namespaces, delayed links, multicast."""

import subprocess

import pytest

from inwire.netns import Lab, link_delays, run_lab, unavailable_reason
from inwire.stream import StreamConfig, clique_group, load_plan

REASON = unavailable_reason()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"network namespaces unavailable: {REASON}")
SCALE = 0.05


def namespaces():
    return subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=10).stdout


@pytest.fixture(scope="module")
def optimized(tmp_path_factory):
    from inwire.netns import demo_schedule
    path = tmp_path_factory.mktemp("lab") / "schedule.json"
    demo_schedule(path)
    return load_plan(path)


def test_optimized_schedule_runs_bit_exact_across_namespaces(optimized):
    config = StreamConfig(rounds=4, elements=1500, window=2, loss=0.05, seed=3, timeout_ms=100, job=77)
    report, final = run_lab(optimized, config, SCALE)
    assert report["bit_exact"] and report["finished"]
    assert len(report["rounds"]) == 4
    assert all(count > 0 for count in report["relayed"].values())
    # Results reached the islands by multicast: the service ran without the unicast fallback.
    assert "unicast_copies" not in final and final.startswith("inwire serve: stopped; final counters")
    # Every round waits at least for its slowest member's delayed round trip.
    for entry in report["rounds"]:
        cliques = optimized.cliques(entry["round"])
        slowest = max(optimized.topology.latency_ms(m, agg) for members, agg in cliques for m in members)
        assert entry["time_ms"] >= 2 * slowest * SCALE


def test_link_delays_follow_the_topology(optimized):
    island = optimized.islands[0]
    delays = link_delays(optimized, island, SCALE)
    assert len(delays) == len(optimized.period)
    for period_round, cliques in enumerate(optimized.period):
        clique = next(c for c, (members, _) in enumerate(cliques) if island in members)
        expected = optimized.topology.latency_ms(island, cliques[clique][1]) * SCALE / 1000
        assert delays[clique_group(period_round, clique)] == expected


def test_lab_removes_its_namespaces(optimized):
    with Lab(optimized.islands[:2]) as lab:
        names = [lab.switch, lab.aggregator, *lab.namespaces.values()]
        listed = namespaces()
        assert all(name in listed for name in names)
    listed = namespaces()
    assert not any(name in listed for name in names)
