"""Network topologies for the rotating-clique schedule: cities, links and what each city can do.

A topology is read from JSON (format in docs/schedule.md), validated, and routed by shortest one-way
latency. `doublezero9` is built in; `generate_topology` makes seeded random geometric topologies for
scaling tests.
"""

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property
from importlib import resources
from typing import Any

import networkx as nx
import numpy as np

from ..errors import InwireError
from .aggregator import AggregatorProfile, finite_number, profile_from_entry, shown
from .errors import ScheduleError
from .jsonfile import read_json

LINK_KINDS = ("dedicated", "public")
FIBER_MS_PER_KM = 4.9e-3
"""Light in fiber: about 4.9 microseconds per kilometre."""
EARTH_RADIUS_KM = 6371.0
BUILTIN_TOPOLOGIES = ("doublezero9", "doublezero-public")
ROUTINGS = ("latency", "bandwidth", "balanced")
"""How transfers find their paths (inwire.plan.cost.CostModel); a topology may name the one its network uses."""

_CITY_KEYS = {"name", "lat", "lon", "aggregation", "multicast", "aggregator"}
_LINK_KEYS = {"a", "b", "latency_ms", "bandwidth_gbps", "kind", "contributor"}
_TOP_KEYS = {"name", "description", "cities", "links", "routing"}


class TopologyError(InwireError, ValueError):
    """A topology file or an island list that cannot be used; the message names the offending entry."""


@dataclass(frozen=True)
class City:
    name: str
    lat: float
    lon: float
    aggregation: bool = True
    multicast: bool = True
    aggregator: AggregatorProfile | None = None
    """The city's AggregatorProfile, or None for the planner's default (`--aggregator`)."""


@dataclass(frozen=True)
class Link:
    """A full-duplex link: `latency_ms` one way, `bandwidth_gbps` in each direction."""
    a: str
    b: str
    latency_ms: float
    bandwidth_gbps: float
    kind: str = "dedicated"
    contributor: str = ""
    """Who provides the link: parallel links of one kind between two cities need different contributors."""


class Topology:
    """Validated cities and links with shortest-latency routes between every pair of cities."""

    def __init__(self, name: str, cities: Iterable[City], links: Iterable[Link], description: str = "",
                 source: str | None = None, routing: str | None = None) -> None:
        self.name = name
        self.routing = routing
        """The routing the network itself uses (its controller's, not the endpoints' choice), or None."""
        # What load_topology was given (a built-in name or a file path): a schedule names it so the
        # host can load the same topology again.
        self.source = source or name
        self.description = description
        self.cities = {city.name: city for city in cities}
        self.links = tuple(links)
        _validate_connected(self)

    @cached_property
    def graph(self) -> nx.Graph:
        """One edge per city pair: the lowest-latency link between them carries the traffic routed by latency
        (`link`); `parallel_gbps` adds the bandwidth of the other links of its kind between the same cities,
        which a sender that splits its flows can use too."""
        graph = nx.Graph()
        graph.add_nodes_from(sorted(self.cities))
        for link in self.links:
            current = graph.get_edge_data(link.a, link.b)
            if current is None or link.latency_ms < current["link"].latency_ms:
                graph.add_edge(link.a, link.b, latency_ms=link.latency_ms, link=link)
        for a, b, data in graph.edges(data=True):
            data["parallel_gbps"] = sum(link.bandwidth_gbps for link in self.links
                                        if {link.a, link.b} == {a, b} and link.kind == data["link"].kind)
        return graph

    @cached_property
    def _routes(self) -> tuple[dict[str, dict[str, float]], dict[str, dict[str, list[str]]]]:
        distances: dict[str, dict[str, float]] = {}
        paths: dict[str, dict[str, list[str]]] = {}
        for source, (dist, path) in nx.all_pairs_dijkstra(self.graph, weight="latency_ms"):
            distances[source] = dist
            paths[source] = path
        return distances, paths

    def latency_ms(self, a: str, b: str) -> float:
        """One-way latency of the shortest path from city a to city b."""
        return self._routes[0][a][b]

    def path(self, a: str, b: str) -> list[str]:
        """Cities on the shortest path from a to b, both included."""
        return self._routes[1][a][b]

    def link_between(self, a: str, b: str) -> Link:
        link: Link = self.graph.edges[a, b]["link"]
        return link

    def parallel_gbps(self, a: str, b: str) -> float:
        """Bandwidth of every link of the routed link's kind between a and b, parallel ones included."""
        return float(self.graph.edges[a, b]["parallel_gbps"])

    def resolve_islands(self, names: Iterable[str] | None = None) -> tuple[str, ...]:
        """The island cities in a stable order; all cities when `names` is None."""
        if names is None:
            names = list(self.cities)
        islands: list[str] = []
        for name in names:
            if name not in self.cities:
                raise TopologyError(f"unknown island {name!r}: topology {self.name!r} has "
                                    f"cities {', '.join(self.cities)}")
            if name in islands:
                raise TopologyError(f"island {name!r} is listed twice")
            islands.append(name)
        if len(islands) < 2:
            raise TopologyError(f"a schedule needs at least two islands, got {', '.join(islands) or 'none'}")
        return tuple(islands)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": self.description,
            "cities": [{"name": c.name, "lat": c.lat, "lon": c.lon, "aggregation": c.aggregation,
                        "multicast": c.multicast,
                        **({} if c.aggregator is None else {"aggregator": c.aggregator.to_json()})}
                       for c in self.cities.values()],
            "links": [{"a": link.a, "b": link.b, "latency_ms": link.latency_ms, "bandwidth_gbps": link.bandwidth_gbps,
                       "kind": link.kind, **({"contributor": link.contributor} if link.contributor else {})}
                      for link in self.links],
            **({} if self.routing is None else {"routing": self.routing}),
        }


def _number(value: object, where: str, field: str, minimum: float | None = None, maximum: float | None = None,
            positive: bool = False) -> float:
    if value is None:
        raise TopologyError(f"{where}: missing {field}")
    number = finite_number(value)
    if number is None:
        raise TopologyError(f"{where}: {field} must be a finite number, got {shown(value)}")
    if positive and number <= 0:
        raise TopologyError(f"{where}: {field} must be positive, got {value!r}")
    if minimum is not None and number < minimum:
        raise TopologyError(f"{where}: {field} must be at least {minimum}, got {value!r}")
    if maximum is not None and number > maximum:
        raise TopologyError(f"{where}: {field} must be at most {maximum}, got {value!r}")
    return number


def _flag(entry: dict[str, Any], key: str, where: str) -> bool:
    value = entry.get(key, True)
    if not isinstance(value, bool):
        raise TopologyError(f"{where}: {key} must be true or false, got {value!r}")
    return value


def _reject_unknown_keys(entry: dict[str, Any], allowed: set[str], where: str) -> None:
    unknown = sorted(set(entry) - allowed)
    if unknown:
        raise TopologyError(f"{where}: unknown field {unknown[0]!r} (allowed: {', '.join(sorted(allowed))})")


def topology_from_dict(document: object, source: str | None = None) -> Topology:
    """Validate a parsed topology document and build the Topology; `source` (a file) prefixes messages."""
    label = source or "topology"
    if not isinstance(document, dict):
        raise TopologyError(f"{label}: the top level must be a JSON object")
    _reject_unknown_keys(document, _TOP_KEYS, label)
    name = document.get("name", label)
    cities_in, links_in = document.get("cities"), document.get("links")
    if not isinstance(cities_in, list) or not cities_in:
        raise TopologyError(f"{label}: 'cities' must be a non-empty list")
    if not isinstance(links_in, list):
        raise TopologyError(f"{label}: 'links' must be a list")

    cities: list[City] = []
    seen: dict[str, int] = {}
    for i, entry in enumerate(cities_in):
        where = f"cities[{i}]"
        if not isinstance(entry, dict):
            raise TopologyError(f"{where}: must be an object")
        _reject_unknown_keys(entry, _CITY_KEYS, where)
        city_name = entry.get("name")
        if not isinstance(city_name, str) or not city_name:
            raise TopologyError(f"{where}: missing name")
        where = f"cities[{i}] ({city_name})"
        if city_name in seen:
            raise TopologyError(f"{where}: duplicate city name {city_name!r}, first at cities[{seen[city_name]}]")
        seen[city_name] = i
        aggregator = None
        if "aggregator" in entry:
            try:
                aggregator = profile_from_entry(entry["aggregator"], where)
            except ScheduleError as error:
                raise TopologyError(str(error)) from None
        cities.append(City(city_name,
                           _number(entry.get("lat"), where, "lat", -90, 90),
                           _number(entry.get("lon"), where, "lon", -180, 180),
                           _flag(entry, "aggregation", where), _flag(entry, "multicast", where), aggregator))

    links: list[Link] = []
    seen_links: dict[tuple[str, str, str, str], int] = {}
    for i, entry in enumerate(links_in):
        where = f"links[{i}]"
        if not isinstance(entry, dict):
            raise TopologyError(f"{where}: must be an object")
        _reject_unknown_keys(entry, _LINK_KEYS, where)
        # Either end may be anything until it is found among the cities below.
        a: Any = entry.get("a")
        b: Any = entry.get("b")
        for end_key, end in (("a", a), ("b", b)):
            if end is not None and not isinstance(end, str):
                raise TopologyError(f"links[{i}]: {end_key} must name a city, got {end!r}")
        where = f"links[{i}] ({a}-{b})"
        for end in (a, b):
            if end not in seen:
                raise TopologyError(f"{where}: unknown city {end!r}")
        if a == b:
            raise TopologyError(f"{where}: a link must join two different cities")
        kind = entry.get("kind", "dedicated")
        if kind not in LINK_KINDS:
            raise TopologyError(f"{where}: kind must be one of {', '.join(LINK_KINDS)}, got {kind!r}")
        contributor = entry.get("contributor", "")
        if not isinstance(contributor, str):
            raise TopologyError(f"{where}: contributor must be a name, got {contributor!r}")
        key = (min(a, b), max(a, b), kind, contributor)
        if key in seen_links:
            raise TopologyError(f"{where}: duplicate {kind} link, first at links[{seen_links[key]}] (parallel links "
                                f"need different contributors)")
        seen_links[key] = i
        links.append(Link(a, b, _number(entry.get("latency_ms"), where, "latency_ms", minimum=0),
                          _number(entry.get("bandwidth_gbps"), where, "bandwidth_gbps", positive=True), kind,
                          contributor))
    routing = document.get("routing")
    if routing is not None and routing not in ROUTINGS:
        raise TopologyError(f"{label}: routing must be one of {', '.join(ROUTINGS)}, got {routing!r}")
    return Topology(str(name), cities, links, str(document.get("description", "")), source, routing)


def _validate_connected(topology: Topology) -> None:
    graph = nx.Graph()
    graph.add_nodes_from(topology.cities)
    graph.add_edges_from((link.a, link.b) for link in topology.links)
    components = sorted(nx.connected_components(graph), key=lambda c: (-len(c), sorted(c)))
    if len(components) > 1:
        stranded = sorted(components[1])
        raise TopologyError(f"city {stranded[0]!r} is not connected to the rest of topology "
                            f"{topology.name!r} (cut off: {', '.join(stranded)})")


def load_topology(spec: str) -> Topology:
    """A built-in topology by name, or a JSON topology file by path."""
    if spec in BUILTIN_TOPOLOGIES:
        text = resources.files("inwire").joinpath("data", f"{spec}.json").read_text()
        return topology_from_dict(json.loads(text), spec)
    document = read_json(spec, "topology", TopologyError)
    return topology_from_dict(document, spec)


def great_circle_km(lat1: float, lon1: float, lat2: float, lon2: float) -> float:
    p1, p2 = math.radians(lat1), math.radians(lat2)
    dp, dl = p2 - p1, math.radians(lon2 - lon1)
    h = math.sin(dp / 2) ** 2 + math.cos(p1) * math.cos(p2) * math.sin(dl / 2) ** 2
    return 2 * EARTH_RADIUS_KM * math.asin(math.sqrt(min(1.0, h)))


def generate_topology(n: int, seed: int = 0, radius_km: float = 2500.0, bandwidth_gbps: float = 10.0) -> Topology:
    """A connected random geometric topology of n cities, reproducible from `seed`.

    Cities are scattered over the populated latitudes; cities closer than `radius_km` are linked, and
    any components left over are joined by their closest pair. Latency is the great-circle distance
    at 4.9 microseconds per km; every link is dedicated at `bandwidth_gbps`.
    """
    if n < 2:
        raise TopologyError("a generated topology needs at least two cities")
    rng = np.random.default_rng(seed)
    lats = np.degrees(np.arcsin(rng.uniform(np.sin(np.radians(-40)), np.sin(np.radians(60)), n)))
    lons = rng.uniform(-130.0, 150.0, n)
    names = [f"C{i:02d}" for i in range(n)]
    # Chord length on the unit sphere grows monotonically with great-circle distance, so a 3-D random
    # geometric graph on these points links exactly the pairs within radius_km.
    xyz = {i: (math.cos(math.radians(la)) * math.cos(math.radians(lo)),
               math.cos(math.radians(la)) * math.sin(math.radians(lo)), math.sin(math.radians(la)))
           for i, (la, lo) in enumerate(zip(lats, lons))}
    chord = 2 * math.sin(radius_km / EARTH_RADIUS_KM / 2)
    graph = nx.random_geometric_graph(n, chord, dim=3, pos=xyz)

    def km(i: int, j: int) -> float:
        return great_circle_km(lats[i], lons[i], lats[j], lons[j])

    components = [sorted(c) for c in nx.connected_components(graph)]
    while len(components) > 1:
        first = components[0]
        rest = [node for other in components[1:] for node in other]
        i, j = min(((i, j) for i in first for j in rest), key=lambda pair: km(*pair))
        graph.add_edge(i, j)
        components = [sorted(c) for c in nx.connected_components(graph)]

    cities = [City(names[i], round(float(lats[i]), 3), round(float(lons[i]), 3)) for i in range(n)]
    links = [Link(names[i], names[j], round(km(i, j) * FIBER_MS_PER_KM, 3), bandwidth_gbps)
             for i, j in sorted(tuple(sorted(edge)) for edge in graph.edges)]
    return Topology(f"generated{n}-seed{seed}", cities, links,
                    f"random geometric topology, {n} cities, seed {seed}")
