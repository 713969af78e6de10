import copy
import json

import networkx as nx
import pytest

from inwire.plan.topology import (
    FIBER_MS_PER_KM,
    TopologyError,
    generate_topology,
    great_circle_km,
    load_topology,
    topology_from_dict,
)

DZ9_DEDICATED = {("SEO", "TYO"): 4.50, ("TYO", "LAX"): 57.62, ("TYO", "SIN"): 44.95, ("SIN", "LAX"): 121.56,
                 ("SIN", "FRA"): 52.42, ("LAX", "NYC"): 25.72, ("NYC", "BAR"): 55.32, ("NYC", "LON"): 45.60,
                 ("LON", "AMS"): 1.45, ("LON", "FRA"): 4.96, ("AMS", "FRA"): 2.11}
DZ9_PUBLIC = {("AMS", "NYC"): 78.43, ("LAX", "NYC"): 52.63, ("LON", "NYC"): 74.52, ("NYC", "SIN"): 204.68,
              ("SEO", "TYO"): 15.41}


def small():
    return {"name": "small",
            "cities": [{"name": "A", "lat": 0, "lon": 0}, {"name": "B", "lat": 0, "lon": 10},
                       {"name": "C", "lat": 10, "lon": 0}],
            "links": [{"a": "A", "b": "B", "latency_ms": 5, "bandwidth_gbps": 10},
                      {"a": "B", "b": "C", "latency_ms": 7, "bandwidth_gbps": 10, "kind": "public"}]}


def test_doublezero9_has_the_published_links():
    topology = load_topology("doublezero9")
    assert list(topology.cities) == ["SIN", "TYO", "SEO", "LAX", "NYC", "LON", "AMS", "FRA", "BAR"]
    dedicated = {(link.a, link.b): link.latency_ms for link in topology.links if link.kind == "dedicated"}
    public = {(link.a, link.b): link.latency_ms for link in topology.links if link.kind == "public"}
    assert dedicated == DZ9_DEDICATED
    assert public == DZ9_PUBLIC
    assert all(link.bandwidth_gbps == 10 for link in topology.links if link.kind == "dedicated")
    assert all(link.bandwidth_gbps < 10 for link in topology.links if link.kind == "public")
    assert all(c.aggregation and c.multicast for c in topology.cities.values())


def test_shortest_paths_prefer_dedicated_links_and_chain_hops():
    topology = load_topology("doublezero9")
    assert topology.latency_ms("SEO", "TYO") == 4.50
    assert topology.link_between("SEO", "TYO").kind == "dedicated"
    # SIN to BAR: SIN-FRA-AMS-LON-NYC-BAR beats SIN-LAX-NYC-BAR (202.6 ms) and SIN-FRA-LON-NYC-BAR.
    assert topology.path("SIN", "BAR") == ["SIN", "FRA", "AMS", "LON", "NYC", "BAR"]
    assert topology.latency_ms("SIN", "BAR") == pytest.approx(52.42 + 2.11 + 1.45 + 45.60 + 55.32)
    assert topology.latency_ms("BAR", "SIN") == pytest.approx(topology.latency_ms("SIN", "BAR"))


def test_round_trip_through_a_file(tmp_path):
    path = tmp_path / "dz.json"
    path.write_text(json.dumps(load_topology("doublezero9").to_dict()))
    again = load_topology(str(path))
    assert again.source == str(path) and again.name == "doublezero9"
    assert again.latency_ms("SIN", "BAR") == pytest.approx(156.9)
    assert len(again.links) == 16


def test_capabilities_default_on_and_can_be_switched_off_per_city():
    document = small()
    topology = topology_from_dict(document)
    assert all(c.aggregation and c.multicast for c in topology.cities.values())
    document["cities"][1].update(aggregation=False, multicast=False)
    city = topology_from_dict(document).cities["B"]
    assert not city.aggregation and not city.multicast


def _broken(edit):
    document = copy.deepcopy(small())
    edit(document)
    return document


@pytest.mark.parametrize("edit, words", [
    (lambda d: d["links"][0].update(b="XYZ"), ["links[0]", "unknown city 'XYZ'"]),
    (lambda d: d["links"][1].update(latency_ms=-1), ["links[1] (B-C)", "latency_ms", "-1"]),
    (lambda d: d["links"][0].pop("latency_ms"), ["links[0] (A-B)", "missing latency_ms"]),
    (lambda d: d["links"][0].update(latency_ms="fast"), ["links[0]", "latency_ms", "'fast'"]),
    (lambda d: d["links"][0].update(bandwidth_gbps=0), ["links[0]", "bandwidth_gbps"]),
    (lambda d: d["cities"].append({"name": "D", "lat": 1, "lon": 1}), ["'D'", "not connected"]),
    (lambda d: d["cities"].append({"name": "B", "lat": 1, "lon": 1}), ["cities[3]", "duplicate city name 'B'"]),
    (lambda d: d["links"].append(dict(d["links"][0])), ["links[2]", "duplicate dedicated link", "links[0]"]),
    (lambda d: d["links"][0].update(kind="leased"), ["links[0]", "'leased'"]),
    (lambda d: d["links"][0].update(b="A"), ["links[0]", "two different cities"]),
    (lambda d: d["cities"][0].update(lat=123), ["cities[0] (A)", "lat"]),
    (lambda d: d["cities"][1].update(multicast="yes"), ["cities[1] (B)", "multicast"]),
    (lambda d: d["links"][0].update(latency=3), ["links[0]", "unknown field 'latency'"]),
    (lambda d: d["cities"][2].pop("name"), ["cities[2]", "missing name"]),
])
def test_bad_topologies_are_rejected_naming_the_entry(edit, words):
    with pytest.raises(TopologyError) as error:
        topology_from_dict(_broken(edit))
    for word in words:
        assert word in str(error.value)


def test_a_disconnected_pair_is_named():
    document = _broken(lambda d: d["cities"].extend([{"name": "P", "lat": 1, "lon": 1},
                                                     {"name": "Q", "lat": 2, "lon": 2}]))
    document["links"].append({"a": "P", "b": "Q", "latency_ms": 1, "bandwidth_gbps": 1})
    with pytest.raises(TopologyError, match="'P' is not connected.*P, Q"):
        topology_from_dict(document)


def test_unreadable_files_are_reported_by_name(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{ not json")
    with pytest.raises(TopologyError, match="bad.json: not valid JSON"):
        load_topology(str(bad))
    with pytest.raises(TopologyError, match="cannot read topology"):
        load_topology(str(tmp_path / "missing.json"))


def test_islands_are_checked_against_the_cities():
    topology = load_topology("doublezero9")
    assert topology.resolve_islands(["LON", "NYC"]) == ("LON", "NYC")
    assert len(topology.resolve_islands(None)) == 9
    with pytest.raises(TopologyError, match="unknown island 'PAR'"):
        topology.resolve_islands(["LON", "PAR"])
    with pytest.raises(TopologyError, match="'LON' is listed twice"):
        topology.resolve_islands(["LON", "LON"])
    with pytest.raises(TopologyError, match="at least two"):
        topology.resolve_islands(["LON"])
    lonely = topology_from_dict({"cities": [{"name": "A", "lat": 0, "lon": 0}], "links": []})
    with pytest.raises(TopologyError, match="at least two islands, got A"):
        lonely.resolve_islands(None)


def test_generated_topologies_are_connected_seeded_and_at_fiber_speed():
    first, again, other = generate_topology(32, seed=3), generate_topology(32, seed=3), generate_topology(32, seed=4)
    assert nx.is_connected(first.graph)
    assert first.to_dict() == again.to_dict()
    assert first.to_dict() != other.to_dict()
    for link in first.links:
        a, b = first.cities[link.a], first.cities[link.b]
        # Coordinates are rounded to 3 decimals (about 100 m), so allow a few microseconds.
        assert link.latency_ms == pytest.approx(great_circle_km(a.lat, a.lon, b.lat, b.lon) * FIBER_MS_PER_KM,
                                                abs=2e-3)


def test_great_circle_distance_london_new_york():
    assert great_circle_km(51.507, -0.128, 40.713, -74.006) == pytest.approx(5570, rel=0.01)
