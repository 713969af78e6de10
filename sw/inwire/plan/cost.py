"""Round times of cliques over a topology: links and aggregators as resources with rates.

A schedule is a periodic sequence of rounds; each round partitions the islands into cliques (islands
left out of every clique of a round sit it out), and every clique either sums at an aggregation city
and multicasts the sum back, or exchanges directly (all-to-all, ring, or a host-side tree all-reduce
with no aggregator). docs/schedule.md derives the cost model.
"""

import itertools
import math
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import networkx as nx
import numpy as np

from inwire.protocol import (
    ELEMENT_BYTES,
    FRAME_HEADER_BYTES,
    MAX_ELEMENTS_PER_FRAME,
    ROUTE_HOPS,
    WIRE_OVERHEAD_BYTES,
)

from .aggregator import AggregatorProfile, load_aggregator
from .errors import ScheduleError
from .topology import ROUTINGS, Topology

AGGREGATE, ALL_TO_ALL, RING, HOST_TREE = "aggregate", "all-to-all", "ring", "host-tree"
EXCHANGES = (AGGREGATE, ALL_TO_ALL, RING, HOST_TREE)
GLOO_RING = "gloo-ring"
"""gloo's ring all-reduce over its TCP pairs: a ring whose every step first waits for the receiver's
ready-to-receive. A predicted baseline only: never slower to run as a plain ring, so never offered to the
optimizer and not an exchange a schedule file holds."""
CANDIDATE_PATHS = 4
"""Bandwidth-aware routing chooses among this many latency-shortest simple paths per transfer."""
ROUTING_MOVES = 100
"""Balanced routing re-routes at most this many flows per clique, then as many per round (each move strictly
shortens the clique, then the round)."""
ROUTING_TOLERANCE_MS = 1e-9
"""A move must shorten the clique (the round) by more than this to count, so rounding cannot make it cycle."""
EXHAUSTIVE_AGGREGATOR_LIMIT = 2048
"""Aggregator assignments of a round tried exhaustively up to this many combinations."""
SHORTLIST = 6
"""Beyond that, each clique's cities are first cut to this many by latency, then to 4 by time alone."""

Parent = dict[str, str]
"""A tree as each city's next city toward the root."""
RingRoutes = list[tuple[list[int], float]]
"""A ring's hops in order, each as (directed edge indices, one-way latency ms)."""
_Cost = tuple[float, float]
"""(longest, total) seconds over the resources a choice loads."""
_RoundState = tuple[tuple["_Profile", Any], ...]
"""A round's cliques as (profile, balanced routes or None) each."""
_State = TypeVar("_State")
_Element = TypeVar("_Element")


def ring_chain_ms(hop_ms: Sequence[float], steps: int, handshake: bool = False) -> float:
    """Propagation term of a ring whose hops (in ring order) take `hop_ms` one way, over `steps` steps.

    Step s of a member forwards what it received at step s-1 from its predecessor, so the last chunk to
    arrive has crossed `steps` consecutive hops of the ring one after the other: the term is the longest
    sum of `steps` consecutive hops (cyclically), not `steps` times the longest hop. With `handshake`
    (gloo's TCP pair) the receiver first tells the sender it is ready, so every step costs its hop's round
    trip (the ready-to-receive back, the data forth) instead of one way.
    """
    k = len(hop_ms)
    per_step = [2.0 * ms for ms in hop_ms] if handshake else list(hop_ms)
    whole, left = divmod(steps, k)
    chains = [whole * sum(per_step) + sum(per_step[(start + j) % k] for j in range(left)) for start in range(k)]
    return max(chains)


def wire_bytes(model_bytes: int) -> int:
    """Bytes on the wire to send a model of `model_bytes` bytes once, as int32 elements in full frames.

    Each frame carries up to MAX_ELEMENTS_PER_FRAME elements behind the 128-byte header and costs the
    24 bytes of preamble, FCS and inter-frame gap on top.
    """
    if model_bytes <= 0:
        raise ScheduleError(f"model size must be positive, got {model_bytes} bytes")
    elements = -(-int(model_bytes) // ELEMENT_BYTES)
    frames = -(-elements // MAX_ELEMENTS_PER_FRAME)
    return frames * (FRAME_HEADER_BYTES + WIRE_OVERHEAD_BYTES) + elements * ELEMENT_BYTES


@dataclass(frozen=True)
class Clique:
    """Members (in ring order for a ring exchange, the root first for a host tree) and where their sum is
    formed."""
    members: tuple[str, ...]
    aggregator: str | None = None
    exchange: str = AGGREGATE

    @property
    def hub(self) -> str:
        """The city an aggregating clique sums at; only those are routed to one."""
        assert self.aggregator is not None, f"the {self.exchange} clique {self.members} aggregates nowhere"
        return self.aggregator


@dataclass(frozen=True)
class _Profile:
    latency_ms: float
    loads_bits: np.ndarray
    used: np.ndarray
    tree: Parent | None = None
    """With in-path reduction: every city that sums, to the next city that sums toward the root."""


@dataclass
class Schedule:
    """An evaluated periodic schedule: rounds of cliques with their times, rho and time to epsilon."""
    rounds: tuple[tuple[Clique, ...], ...]
    round_times_ms: tuple[float, ...]
    rho: float
    periods: float
    time_to_epsilon_ms: float
    spectral_radius: float = math.nan
    compute_ms_per_round: float = 0.0
    """H local steps x T ms before every round (the local-step objective); 0 for pure communication."""

    @property
    def period_ms(self) -> float:
        return float(sum(self.round_times_ms)) + len(self.round_times_ms) * self.compute_ms_per_round





def _descend(state: _State, state_ms: float, elements: Callable[[_State], Iterable[_Element]],
             moves: Callable[[_State, _Element], Iterable[_State]], time_ms: Callable[[_State], float]) -> _State:
    """First-improvement descent of the balanced routings: sweeps over `elements(state)` (listed once per
    sweep), each taking the first of `moves(state, element)` (from the current state) that finishes sooner
    than the current state by more than ROUTING_TOLERANCE_MS, until a sweep moves nothing or ROUTING_MOVES
    moves are made; returns the last state."""
    made, improved = 0, True
    while improved and made < ROUTING_MOVES:
        improved = False
        for element in elements(state):
            for trial in moves(state, element):
                trial_ms = time_ms(trial)
                if trial_ms < state_ms - ROUTING_TOLERANCE_MS:
                    state, state_ms, improved, made = trial, trial_ms, True, made + 1
                    break
            if made == ROUTING_MOVES:
                break
    return state

class CostModel:
    """Round times of cliques over a topology for one model size and capability setting.

    Every directed link is a resource, and so are each aggregator's ingress ports, core and egress ports
    (when its profile limits them): a round puts on each the bits of every clique that uses it, and a
    clique's time is its propagation term plus the time its busiest resource needs for all of that
    traffic. A round lasts as long as its slowest clique.

    `aggregator` is the default profile (a name, a build report path or an AggregatorProfile); a city of
    the topology may set its own. `reduce_in_path` lets every aggregating city on the way to a clique's
    root sum what it forwards. `routing` is "latency" (fixed latency-shortest paths, as DoubleZero's
    controller routes), "bandwidth" (each transfer takes the candidate path that completes soonest, in
    turn) or "balanced" (from the better of those two, flows are re-routed one at a time while that
    shortens the clique, then, among the cliques of a round, while that shortens the round).
    `host_nic_gbps` limits every island's host NIC, in and out (None: unlimited). `host_tree` offers the
    host-side tree all-reduce among each clique's options (it is always available as a baseline).
    `tree_tables`: the reduction trees are carried by each aggregator's tables (a registered job,
    `jobs.tree_routes`), not by the frames' route fields, so every aggregating city on the way sums, however
    deep the tree; without it (unregistered frames, as `inwire stream` and the lab send) no member's path
    climbs more than ROUTE_HOPS + 1 summing levels (`_cap_levels`).
    """

    def __init__(self, topology: Topology, islands: Iterable[str], model_bytes: int, multicast: bool = True,
                 aggregation: bool = True, aggregator: str | AggregatorProfile = "ideal", reduce_in_path: bool = False,
                 routing: str = "latency", host_nic_gbps: float | None = None, host_tree: bool = False,
                 tree_tables: bool = False) -> None:
        if routing not in ROUTINGS:
            raise ScheduleError(f"routing must be one of {', '.join(ROUTINGS)}, got {routing!r}")
        if host_nic_gbps is not None and not (host_nic_gbps > 0 and math.isfinite(host_nic_gbps)):
            raise ScheduleError(f"host NIC rate must be a positive number of Gb/s, got {host_nic_gbps}")
        self.topology = topology
        self.islands = tuple(islands)
        self.model_bytes = int(model_bytes)
        self.multicast = multicast
        self.aggregation = aggregation
        self.reduce_in_path = bool(reduce_in_path)
        self.routing = routing
        self.host_nic_gbps = None if host_nic_gbps is None else float(host_nic_gbps)
        self.host_tree = bool(host_tree)
        self.tree_tables = bool(tree_tables)
        self.default_aggregator = load_aggregator(aggregator)
        self.vector_bits = 8 * wire_bytes(self.model_bytes)
        directed = sorted(edge for u, v in topology.graph.edges for edge in ((u, v), (v, u)))
        self.edge_index = {edge: i for i, edge in enumerate(directed)}
        # Routed by latency, a pair's traffic takes its lowest-latency link alone (as IS-IS with delay metrics
        # does); a sender that chooses its paths splits flows over parallel links too (their extra latency, a
        # millisecond or so on NYC-LON, is not charged).
        self.bandwidth_bps = np.array([(topology.link_between(u, v).bandwidth_gbps if routing == "latency" else
                                        topology.parallel_gbps(u, v)) * 1e9 for u, v in directed])
        cities = topology.cities
        self.aggregation_cities = tuple(name for name in cities if aggregation and cities[name].aggregation)
        # Aggregators that limit anything get three resources after the links: ingress, core, egress.
        # Unlimited ones get none, so the ideal profile leaves every figure exactly as before.
        self.aggregator_of = {name: cities[name].aggregator or self.default_aggregator
                              for name in self.aggregation_cities}
        capacities: list[float] = list(self.bandwidth_bps)
        self._aggregator_index: dict[str, int] = {}
        for name in self.aggregation_cities:
            profile = self.aggregator_of[name]
            if not profile.ideal:
                self._aggregator_index[name] = len(capacities)
                capacities += [profile.ingress_bps, profile.core_bps, profile.egress_bps]
        # A limited host NIC adds two resources per island, in and out; unlimited ones add none.
        self._nic_index: dict[str, int] = {}
        if self.host_nic_gbps is not None:
            for island in self.islands:
                self._nic_index[island] = len(capacities)
                capacities += [self.host_nic_gbps * 1e9] * 2
        self.capacity_bps = np.array(capacities, dtype=float)
        self._candidates: dict[tuple[str, str], list[list[str]]] = {}
        self._replicates = {name: multicast and cities[name].multicast for name in cities}
        self._position = {name: i for i, name in enumerate(self.islands)}
        self._profiles: dict[Clique, _Profile] = {}
        self._path_edges: dict[tuple[str, str], np.ndarray] = {}
        self._trees: dict[str, tuple[Parent, dict[str, int]]] = {}
        self._ring_orders: dict[frozenset[str], tuple[str, ...]] = {}
        self._host_trees: dict[frozenset[str], Clique] = {}
        self._best_rounds: dict[frozenset[frozenset[str]], tuple[tuple[Clique, ...], float, bool]] = {}
        self._reroute_paths: dict[tuple[str, str], list[tuple[str, ...]]] = {}
        self._balanced_routes: dict[Clique, Any] = {}
        """A balanced clique's routes: its Parent when it aggregates, its RingRoutes when it is a ring."""
        self._round_profiles: dict[tuple[Clique, ...], list[_Profile]] = {}

    def latency_ms(self, a: str, b: str) -> float:
        return self.topology.latency_ms(a, b)

    def canonical(self, members: Iterable[str]) -> tuple[str, ...]:
        return tuple(sorted(members, key=self._position.__getitem__))

    # -- one clique ------------------------------------------------------------------------------
    def _busiest_ms(self, loads: np.ndarray) -> float:
        """Time the busiest resource needs for `loads`."""
        used = loads > 0
        return 1e3 * float(np.max(loads[used] / self.capacity_bps[used])) if used.any() else 0.0

    def _add_path(self, loads: np.ndarray, a: str, b: str, bits: float) -> None:
        edges = self._path_edges.get((a, b))
        if edges is None:
            path = self.topology.path(a, b)
            edges = np.array([self.edge_index[hop] for hop in zip(path, path[1:])], dtype=int)
            self._path_edges[(a, b)] = edges
        loads[edges] += bits

    def _tree(self, source: str) -> tuple[Parent, dict[str, int]]:
        """Predecessor and hop depth of every city on the shortest-path tree rooted at `source`."""
        tree = self._trees.get(source)
        if tree is None:
            paths = {city: self.topology.path(source, city) for city in self.topology.cities}
            tree = ({city: path[-2] for city, path in paths.items() if len(path) > 1},
                    {city: len(path) - 1 for city, path in paths.items()})
            self._trees[source] = tree
        return tree

    def _add_distribution(self, loads: np.ndarray, source: str, destinations: Iterable[str], bits: float) -> None:
        """Send one vector from `source` to `destinations` along the shortest-path tree.

        A city that multicasts needs one copy and replicates it; one that cannot needs a copy for
        every destination at or below it.
        """
        parent, depth = self._tree(source)
        self._add_down_tree(loads, parent, depth, source, destinations, bits)

    def _add_down_tree(self, loads: np.ndarray, parent: Parent, depth: dict[str, int], source: str,
                       destinations: Iterable[str], bits: float, relays: Collection[str] = frozenset()) -> None:
        """Distribution along a tree given as each city's parent toward `source`; `relays` (the summing
        cities of a reduction tree) take one copy and pass it on to their own subtree, as an aggregator
        does where there is no multicast (`inwire serve --unicast`)."""
        wanted = set(destinations)
        reached: set[str] = set()
        for destination in destinations:
            city = destination
            while city != source and city not in reached:
                reached.add(city)
                city = parent[city]
        below: dict[str, int] = {}
        for city in sorted(reached, key=depth.__getitem__, reverse=True):
            copies = 1 if self._replicates[city] or city in relays else below.get(city, 0) + (city in wanted)
            loads[self.edge_index[(parent[city], city)]] += copies * bits
            below[parent[city]] = below.get(parent[city], 0) + copies

    def _charge_aggregator(self, loads: np.ndarray, city: str, streams_in: int, copies_out: int) -> None:
        """The aggregator at `city` takes in `streams_in` vectors, sums them in its core and sends out
        `copies_out` (its partial sum, or the result: one copy where the city multicasts)."""
        first = self._aggregator_index.get(city)
        if first is not None:
            loads[first] += streams_in * self.vector_bits
            loads[first + 1] += streams_in * self.vector_bits
            loads[first + 2] += copies_out * self.vector_bits

    def _charge_nic(self, loads: np.ndarray, island: str, bits_in: float, bits_out: float) -> None:
        """What the island's host receives and sends, where its NIC is limited."""
        first = self._nic_index.get(island)
        if first is not None:
            loads[first] += bits_in
            loads[first + 1] += bits_out

    def _host_tree(self, loads: np.ndarray, members: Sequence[str]) -> float:
        """Loads of a host-side tree all-reduce rooted at members[0], and its propagation term.

        The tree is the latency-shortest-path tree from the root. Each member's host sends one partial
        sum (its own vector plus its children's partials) to its parent, the first member on its way to
        the root; the root's host forms the total and it comes back down the same tree, each host
        sending one copy to each child. Cities between two members only forward. Sums are pipelined
        chunk by chunk, so the propagation term is the farthest member's path there and back.
        """
        root, bits = members[0], self.vector_bits
        parent = self._tree(root)[0]
        wanted = set(members)
        host_parent: Parent = {}
        for member in members[1:]:
            city = parent[member]
            while city not in wanted:
                city = parent[city]
            host_parent[member] = city
            city = member
            while city != host_parent[member]:
                loads[self.edge_index[(city, parent[city])]] += bits  # the partial, up
                loads[self.edge_index[(parent[city], city)]] += bits  # the result, down
                city = parent[city]
        children = Counter(host_parent.values())
        for member in members:
            transfers = children[member] + (member != root)
            self._charge_nic(loads, member, transfers * bits, transfers * bits)
        return max(self.latency_ms(m, root) + self.latency_ms(root, m) for m in members)

    def host_tree_clique(self, members: Iterable[str]) -> Clique:
        """These members' host-side tree all-reduce at the root where it is fastest alone (ties: the
        first member in island order)."""
        key = frozenset(members)
        if key not in self._host_trees:
            ordered = self.canonical(members)
            trials = [Clique((root,) + tuple(m for m in ordered if m != root), None, HOST_TREE)
                      for root in ordered]
            self._host_trees[key] = min(trials, key=self.clique_time_alone)
        return self._host_trees[key]

    def _route_latency_ms(self, parent: Parent, city: str, root: str) -> float:
        total = 0.0
        while city != root:
            total += self.topology.graph.edges[city, parent[city]]["latency_ms"]
            city = parent[city]
        return total

    def candidate_paths(self, a: str, b: str) -> list[list[str]]:
        """The CANDIDATE_PATHS latency-shortest simple paths from a to b (networkx)."""
        key = (a, b)
        if key not in self._candidates:
            paths = nx.shortest_simple_paths(self.topology.graph, a, b, weight="latency_ms")
            self._candidates[key] = list(itertools.islice(paths, CANDIDATE_PATHS))
        return self._candidates[key]

    def _completion_ms(self, estimate: np.ndarray, up: list[int], down: list[int], bits: float,
                       latency_ms: float) -> float:
        """Latency plus the serialization of `bits` behind what `estimate` already puts on the path."""
        worst = 0.0
        for edges in (up, down):
            if edges:
                worst = max(worst, float(np.max((estimate[edges] + bits) / self.capacity_bps[edges])))
        return latency_ms + 1e3 * worst

    def _bandwidth_tree(self, hub: str, members: Iterable[str]) -> Parent:
        """Each member's route to `hub`, chosen greedily (farthest member first) among its candidate
        paths by completion time given the clique's transfers routed so far. A route that meets a city
        already routed follows it from there, so the routes form a tree (each city's parent)."""
        parent: Parent = {}
        estimate = np.zeros(len(self.capacity_bps))
        bits = self.vector_bits
        for member in sorted(members, key=lambda m: (-self.latency_ms(m, hub), self._position.get(m, 0))):
            if member == hub or member in parent:
                continue
            best: tuple[float, list[str], list[int], list[int], int] | None = None
            for path in self.candidate_paths(member, hub):
                route: list[str] = []
                for city in path:
                    route.append(city)
                    if city == hub or city in parent:
                        break
                full = list(route)
                while full[-1] != hub:
                    full.append(parent[full[-1]])
                if len(set(full)) < len(full):
                    continue
                up = [self.edge_index[hop] for hop in zip(full, full[1:])]
                down = [self.edge_index[(b, a)] for a, b in zip(full, full[1:])]
                latency = 2 * sum(self.topology.graph.edges[a, b]["latency_ms"] for a, b in zip(full, full[1:]))
                cost = self._completion_ms(estimate, up, down, bits, latency)
                if best is None or cost < best[0] - 1e-9:
                    best = (cost, route, up, down, len(route) - 1)
            assert best is not None, "the latency-shortest path never meets its own routes"
            _, route, up, down, fresh = best
            for a, b in zip(route, route[1:]):
                parent[a] = b
            # Fresh hops carry this vector; with in-path reduction the shared remainder carries no more.
            carried = fresh if self.reduce_in_path else len(up)
            estimate[up[:carried]] += bits
            estimate[down[:carried]] += bits
        return parent

    def _route(self, path: Sequence[str]) -> tuple[list[int], float]:
        """Directed edges of a path of cities and its one-way latency."""
        hops = list(zip(path, path[1:]))
        return ([self.edge_index[hop] for hop in hops],
                sum(self.topology.graph.edges[a, b]["latency_ms"] for a, b in hops))

    def _reroutes(self, city: str, target: str) -> list[tuple[str, ...]]:
        """Paths a balanced move may give a flow from `city` to `target`: the candidate paths, then through
        each neighbour (in name order) the neighbour's latency-shortest path on, where it does not come back."""
        key = (city, target)
        if key not in self._reroute_paths:
            paths = [tuple(path) for path in self.candidate_paths(city, target)]
            for neighbour in sorted(self.topology.graph[city]):
                path = (city,) + tuple(self.topology.path(neighbour, target))
                if city not in path[1:] and path not in paths:
                    paths.append(path)
            self._reroute_paths[key] = paths
        return self._reroute_paths[key]

    @staticmethod
    def _routes_of(parent: Parent, hub: str, members: Iterable[str]) -> Parent:
        """`parent` cut to the cities on some member's route to `hub`."""
        kept: Parent = {}
        for member in members:
            city = member
            while city != hub and city not in kept:
                kept[city] = parent[city]
                city = parent[city]
        return kept

    def _aggregate_time_ms(self, clique: Clique, parent: Parent) -> tuple[float, np.ndarray, Parent | None, float]:
        """An aggregating clique routed along `parent`: (its time alone, loads, tree, propagation term)."""
        loads = np.zeros(len(self.capacity_bps))
        tree = self._aggregate_on_tree(loads, clique, parent)
        for member in clique.members:
            self._charge_nic(loads, member, self.vector_bits, self.vector_bits)
        latency = max(2 * self._route_latency_ms(parent, m, clique.hub) for m in clique.members)
        return latency + self._busiest_ms(loads), loads, tree, latency

    def _moved(self, parent: Parent, city: str, path: Sequence[str], hub: str, members: Iterable[str]) -> Parent | None:
        """`parent` with `city` (its own vector and every flow behind it) sent along `path` until the path
        meets a city already routed; None where the path runs into the flows behind `city` or changes nothing."""
        children: dict[str, list[str]] = {}
        for child, up in parent.items():
            children.setdefault(up, []).append(child)
        behind, stack = {city}, [city]
        while stack:
            for child in children.get(stack.pop(), ()):
                behind.add(child)
                stack.append(child)
        trial = dict(parent)
        for a, b in zip(path, path[1:]):
            if b in behind:
                return None
            trial[a] = b
            if b == hub or b in parent:
                break
        trial = self._routes_of(trial, hub, members)
        return None if trial == parent else trial

    def _balanced_tree(self, clique: Clique) -> Parent:
        """Routes to an aggregating clique's root that shorten its time (propagation plus busiest resource).

        It starts from the faster of the latency-shortest tree and the bandwidth-aware one (the latency
        tree on a tie). A move sends one routed city's flow (its vector and all behind it) another way:
        along one of `_reroutes` until it meets the tree. Sweeps go over the routed cities in name order,
        each taking its first move that makes the clique finish sooner by more than ROUTING_TOLERANCE_MS,
        and repeat until a sweep moves nothing or ROUTING_MOVES moves are made. So it is deterministic,
        never slower than its start, and ends at a tree no single such move improves.
        """
        hub, members = clique.hub, clique.members
        starts = [self._routes_of(self._tree(hub)[0], hub, members), self._bandwidth_tree(hub, members)]
        best_ms, parent = min(((self._aggregate_time_ms(clique, p)[0], p) for p in starts), key=lambda t: t[0])
        return _descend(parent, best_ms, sorted, self._tree_moves(clique),
                        lambda trial: self._aggregate_time_ms(clique, trial)[0])

    def _tree_moves(self, clique: Clique) -> Callable[[Parent, str], Iterator[Parent]]:
        """The balanced moves of an aggregating clique: (parent, city) -> each tree with `city` re-routed."""
        hub, members = clique.hub, clique.members

        def moves(parent: Parent, city: str) -> Iterator[Parent]:
            if city not in parent:  # no longer on any member's route
                return
            for path in self._reroutes(city, hub):
                trial = self._moved(parent, city, path, hub, members)
                if trial is not None:
                    yield trial
        return moves

    def _ring_time_ms(self, members: Iterable[str], routes: RingRoutes, steps: int,
                      bits: float) -> tuple[float, np.ndarray]:
        """A ring whose hops take `routes` ((edges, one-way ms) each, `bits` per hop): its time alone and loads."""
        loads = np.zeros(len(self.capacity_bps))
        for edges, _ in routes:
            loads[edges] += bits
        for member in members:
            self._charge_nic(loads, member, bits, bits)
        return ring_chain_ms([ms for _, ms in routes], steps) + self._busiest_ms(loads), loads

    def _bandwidth_ring(self, hops: Sequence[tuple[str, str]], steps: int, bits: float) -> RingRoutes:
        """Each hop in ring order on the candidate path that completes soonest behind the hops before it."""
        loads = np.zeros(len(self.capacity_bps))
        routes: RingRoutes = []
        for a, b in hops:
            best: tuple[float, list[int], float] | None = None
            for path in self.candidate_paths(a, b):
                edges = [self.edge_index[hop] for hop in zip(path, path[1:])]
                hop_ms = sum(self.topology.graph.edges[u, v]["latency_ms"] for u, v in zip(path, path[1:]))
                cost = self._completion_ms(loads, edges, [], bits, steps * hop_ms)
                if best is None or cost < best[0] - 1e-9:
                    best = (cost, edges, hop_ms)
            assert best is not None, "a connected topology has a path between any two cities"
            loads[best[1]] += bits
            routes.append((best[1], best[2]))
        return routes

    def _balanced_ring(self, members: Iterable[str], hops: Sequence[tuple[str, str]], steps: int,
                       bits: float) -> RingRoutes:
        """Ring hops re-routed one at a time, as `_balanced_tree` does, from the faster of latency-shortest
        and bandwidth-aware hops; a move gives one hop another of `_reroutes`."""
        starts = [[self._route(self.topology.path(a, b)) for a, b in hops], self._bandwidth_ring(hops, steps, bits)]
        best_ms, routes = min(((self._ring_time_ms(members, r, steps, bits)[0], r) for r in starts),
                              key=lambda t: t[0])

        return _descend(routes, best_ms, lambda routes: range(len(hops)), self._ring_moves(hops),
                        lambda trial: self._ring_time_ms(members, trial, steps, bits)[0])

    def _ring_moves(self, hops: Sequence[tuple[str, str]]) -> Callable[[RingRoutes, int], Iterator[RingRoutes]]:
        """The balanced moves of a ring: (routes, i) -> each routing with hop i on another of `_reroutes`."""
        def moves(routes: RingRoutes, i: int) -> Iterator[RingRoutes]:
            for path in self._reroutes(*hops[i]):
                yield routes[:i] + [self._route(path)] + routes[i + 1:]
        return moves

    def _aggregate_on_tree(self, loads: np.ndarray, clique: Clique, parent: Parent) -> Parent | None:
        """Loads of an aggregating clique whose members reach the root along `parent` pointers.

        Without in-path reduction every member's vector travels the whole way. With it, a city that
        aggregates and receives two or more streams (its own island counts) sums them and forwards one;
        unless the trees are in the aggregators' tables (`tree_tables`), only as long as no member's path
        climbs more than ROUTE_HOPS + 1 summing levels, the root included (a frame names only ROUTE_HOPS
        aggregators above the one it reaches; `_cap_levels` chooses which cities keep summing). A city that
        does not sum forwards its streams unsummed and is not charged. The result comes back down the same
        tree: one copy per link where a city multicasts, and every summing city takes one copy and passes it
        to its own subtree (`_add_down_tree`), as an aggregator of a tree sends the result to its children.
        Returns the schedule's tree: each summing city to the next summing city toward the root, and
        each member city that does not sum to the summing city its vector meets first, when that is not
        the root (the islands send their contributions there; docs/schedule.md).
        """
        hub, members = clique.hub, clique.members
        depth, own, upward, summing = self._summing(hub, members, parent)
        down = np.zeros(len(self.capacity_bps))
        self._add_down_tree(down, parent, depth, hub, members, self.vector_bits)

        if summing:
            if not self.tree_tables:
                summing = self._cap_levels(summing, hub, members, parent, upward, own, down)
            if not all(self._replicates[city] for city in summing):
                down = np.zeros(len(self.capacity_bps))
                self._add_down_tree(down, parent, depth, hub, members, self.vector_bits, summing)
        loads += down
        streams = {city: own.get(city, 0) for city in depth}
        for city in upward:
            sent = 1 if city in summing else streams[city]
            if city in summing:
                self._charge_aggregator(loads, city, streams[city], 1)
            loads[self.edge_index[(city, parent[city])]] += sent * self.vector_bits
            streams[parent[city]] += sent
        first_up: Parent = {}
        for city in summing | (set(members) - {hub}):
            up = parent[city]
            while up != hub and up not in summing:
                up = parent[up]
            first_up[city] = up
        # Without multicast the root sends a copy to each member and each summing city it serves directly.
        served = sum(1 for m in members if m == hub or (m not in summing and first_up[m] == hub))
        served += sum(1 for city in summing if first_up[city] == hub)
        self._charge_aggregator(loads, hub, streams[hub], 1 if self._replicates[hub] else served)
        if not self.reduce_in_path:
            return None
        return {city: up for city, up in sorted(first_up.items()) if city in summing or up != hub}

    def _summing(self, hub: str, members: Collection[str], parent: Parent
                 ) -> tuple[dict[str, int], dict[str, int], list[str], set[str]]:
        """(hop depth of every city on the members' paths to `hub`, islands per member city, those cities but
        the hub leaves first, the cities that sum uncapped: every aggregating city with two or more streams, its
        own island counted; none without `reduce_in_path`)."""
        depth = {hub: 0}
        own: dict[str, int] = {}
        for member in members:
            own[member] = own.get(member, 0) + 1
            path: list[str] = []
            city = member
            while city not in depth:
                path.append(city)
                city = parent[city]
            for step in reversed(path):
                depth[step] = depth[parent[step]] + 1
        upward = sorted((c for c in depth if c != hub), key=lambda c: (-depth[c], c))  # leaves first
        summing: set[str] = set()
        if self.reduce_in_path:
            aggregates = set(self.aggregation_cities)
            streams = {city: own.get(city, 0) for city in depth}
            for city in upward:
                if city in aggregates and streams[city] >= 2:
                    summing.add(city)
                streams[parent[city]] += 1 if city in summing else streams[city]
        return depth, own, upward, summing

    @staticmethod
    def _levels(summing: Collection[str], hub: str, parent: Parent, upward: Sequence[str]) -> dict[str, int]:
        """City -> the summing levels a contribution from there climbs, the root included: a member's path
        starts at the first city of it that sums, its own when that sums (docs/schedule.md)."""
        levels = {hub: 1}
        for city in reversed(upward):  # the root side first
            levels[city] = levels[parent[city]] + (city in summing)
        return levels

    def _cap_levels(self, summing: set[str], hub: str, members: Collection[str], parent: Parent, upward: Sequence[str],
                    own: dict[str, int], down: np.ndarray) -> set[str]:
        """The cities that sum, out of `summing` (every aggregating city with two or more streams), such
        that no member's path climbs more than ROUTE_HOPS + 1 of them, the root included.

        When `summing` already fits it is kept as is. Otherwise the subset with the least busiest
        resource (then the least total time over all resources) is found by dynamic programming over the
        tree: a clique's time is its propagation term, which the tree does not change, plus its busiest
        resource's load, and every resource but the fixed result tree belongs to one city (its uplink and
        its aggregator), whose load depends only on how many streams it receives and whether it sums. So
        per city, per summing levels still allowed below it and per streams it sends up, the best subtree
        is built from its children's; exact for the busiest resource, greedy on the tie-break. A city that
        stops summing forwards every stream it receives, which its uplink and the next summing aggregator
        carry; with aggregators at least as fast as the links, the result is never faster than `summing`.
        """
        levels = self._levels(summing, hub, parent, upward)
        if max(levels[member] for member in members) <= ROUTE_HOPS + 1:
            return summing
        vector, capacity = self.vector_bits, self.capacity_bps
        children: dict[str, list[str]] = {}
        for city in reversed(upward):
            children.setdefault(parent[city], []).append(city)

        def charge(city: str, streams_in: int, copies_out: int) -> _Cost:
            """(longest, total) seconds of the aggregator at `city`; nothing where it is ideal."""
            first = self._aggregator_index.get(city)
            if first is None:
                return (0.0, 0.0)
            times = [streams_in * vector / capacity[first], streams_in * vector / capacity[first + 1],
                     copies_out * vector / capacity[first + 2]]
            return (max(times), sum(times))

        def join(a: _Cost, b: _Cost) -> _Cost:
            return (max(a[0], b[0]), a[1] + b[1])

        gathered: dict[tuple[str, int], dict[int, tuple[_Cost, tuple[int, ...]]]] = {}
        sending: dict[tuple[str, int], dict[int, tuple[_Cost, tuple[bool, int, tuple[int, ...]]]]] = {}

        def gather(city: str, budget: int) -> dict[int, tuple[_Cost, tuple[int, ...]]]:
            """Streams received from the children -> (best cost, streams each child sends)."""
            key = (city, budget)
            if key not in gathered:
                table: dict[int, tuple[_Cost, tuple[int, ...]]] = {0: ((0.0, 0.0), ())}
                for child in children.get(city, ()):
                    options = send(child, budget)
                    merged: dict[int, tuple[_Cost, tuple[int, ...]]] = {}
                    for total, (cost, split) in table.items():
                        for sent, (child_cost, _) in options.items():
                            trial = join(cost, child_cost)
                            if total + sent not in merged or trial < merged[total + sent][0]:
                                merged[total + sent] = (trial, split + (sent,))
                    table = merged
                gathered[key] = table
            return gathered[key]

        def send(city: str, budget: int) -> dict[int, tuple[_Cost, tuple[bool, int, tuple[int, ...]]]]:
            """Streams sent up by `city` with `budget` summing levels left -> (best cost, how)."""
            key = (city, budget)
            if key not in sending:
                result: dict[int, tuple[_Cost, tuple[bool, int, tuple[int, ...]]]] = {}
                link = self.edge_index[(city, parent[city])]
                ways = [(False, budget)] + ([(True, budget - 1)] if budget and city in summing else [])
                for sums, below in ways:
                    for total, (cost, split) in gather(city, below).items():
                        received = own.get(city, 0) + total
                        if sums and received < 2:
                            continue
                        sent = 1 if sums else received
                        link_s = sent * vector / capacity[link]
                        trial = join(cost, (link_s, link_s))
                        if sums:
                            trial = join(trial, charge(city, received, 1))
                        if sent not in result or trial < result[sent][0]:
                            result[sent] = (trial, (sums, below, split))
                sending[key] = result
            return sending[key]

        fixed = (float(np.max(down / capacity)), float(np.sum(down / capacity)))
        copies = 1 if self._replicates[hub] else len(members)
        best: tuple[_Cost, tuple[int, ...]] | None = None
        for total, (cost, split) in gather(hub, ROUTE_HOPS).items():
            trial = join(join(cost, fixed), charge(hub, own.get(hub, 0) + total, copies))
            if best is None or trial < best[0]:
                best = (trial, split)
        assert best is not None, "not summing anywhere always fits"
        chosen: set[str] = set()
        stack = [(hub, ROUTE_HOPS, best[1])]
        while stack:
            city, budget, split = stack.pop()
            for child, sent in zip(children.get(city, ()), split):
                sums, below, child_split = send(child, budget)[sent][1]
                if sums:
                    chosen.add(child)
                stack.append((child, below, child_split))
        return chosen

    def profile(self, clique: Clique) -> _Profile:
        cached = self._profiles.get(clique)
        if cached is not None:
            return cached
        members, k = clique.members, len(clique.members)
        loads = np.zeros(len(self.capacity_bps))
        tree: Parent | None = None
        if clique.exchange == AGGREGATE:
            hub = clique.hub
            if self.routing == "latency":
                latency = max(self.latency_ms(m, hub) + self.latency_ms(hub, m) for m in members)
            if self.routing == "latency" and not self.reduce_in_path:
                for member in members:
                    if member != hub:
                        self._add_path(loads, member, hub, self.vector_bits)
                self._add_distribution(loads, hub, members, self.vector_bits)
                self._charge_aggregator(loads, hub, k, 1 if self._replicates[hub] else k)
            else:
                if self.routing == "latency":
                    parent = self._tree(hub)[0]
                elif self.routing == "bandwidth":
                    parent = self._bandwidth_tree(hub, members)
                else:
                    parent = self._balanced_routes[clique] = self._balanced_tree(clique)
                tree = self._aggregate_on_tree(loads, clique, parent)
                if self.routing != "latency":
                    latency = max(2 * self._route_latency_ms(parent, m, hub) for m in members)
            for member in members:
                self._charge_nic(loads, member, self.vector_bits, self.vector_bits)
        elif clique.exchange == ALL_TO_ALL:
            latency = max(self.latency_ms(a, b) for a in members for b in members if a != b)
            for sender in members:
                self._add_distribution(loads, sender, [m for m in members if m != sender], self.vector_bits)
                copies = 1 if self._replicates[sender] else k - 1
                self._charge_nic(loads, sender, (k - 1) * self.vector_bits, copies * self.vector_bits)
        elif clique.exchange in (RING, GLOO_RING):
            hops, steps, bits = self._ring_shape(members)
            if self.routing == "latency" or clique.exchange == GLOO_RING:  # gloo's pairs use the network's routes
                latency = ring_chain_ms([self.latency_ms(a, b) for a, b in hops], steps, clique.exchange == GLOO_RING)
                for a, b in hops:
                    self._add_path(loads, a, b, bits)
            else:
                if self.routing == "bandwidth":
                    routes = self._bandwidth_ring(hops, steps, bits)
                else:
                    routes = self._balanced_routes[clique] = self._balanced_ring(members, hops, steps, bits)
                for edges, _ in routes:
                    loads[edges] += bits
                latency = ring_chain_ms([ms for _, ms in routes], steps)
            for member in members:
                self._charge_nic(loads, member, bits, bits)
        elif clique.exchange == HOST_TREE:
            latency = self._host_tree(loads, members)
        else:
            raise ScheduleError(f"unknown exchange {clique.exchange!r}")
        result = _Profile(latency, loads, np.flatnonzero(loads), tree)
        self._profiles[clique] = result
        return result

    def _ring_shape(self, members: tuple[str, ...]) -> tuple[list[tuple[str, str]], int, int]:
        """A ring's hops in order, its steps and the bits each hop carries over all of them: reduce-scatter
        then all-gather, 2(k-1) steps, each moving a 1/k chunk to the next member."""
        k = len(members)
        steps = 2 * (k - 1)
        return list(zip(members, members[1:] + members[:1])), steps, steps * 8 * wire_bytes(-(-self.model_bytes // k))

    def ring_order(self, members: Iterable[str]) -> tuple[str, ...]:
        """A ring order whose dependency chain (the longest 2(k-1) consecutive hops, `ring_chain_ms`) is
        short; it sets the ring's propagation term.

        Up to 9 members: the order with the shortest chain (ties: shortest longest hop), by trying all.
        Beyond: nearest neighbour and 2-opt on the total, then 2-opt moves that shorten the chain.
        """
        key = frozenset(members)
        if key in self._ring_orders:
            return self._ring_orders[key]
        ordered = self.canonical(members)
        k = len(ordered)
        d = np.array([[self.latency_ms(a, b) for b in ordered] for a in ordered])
        whole, left = divmod(2 * (k - 1), k)

        def hops(orders: np.ndarray) -> np.ndarray:
            return d[orders, np.roll(orders, -1, axis=-1)]

        def chains(lengths: np.ndarray) -> np.ndarray:
            windows = sum((np.roll(lengths, -j, axis=-1) for j in range(left)), np.zeros_like(lengths))
            return whole * lengths.sum(axis=-1) + (windows.max(axis=-1) if left else 0.0)

        if k <= 9:
            orders = np.array([(0,) + p for p in itertools.permutations(range(1, k))])
            lengths = hops(orders)
            best = list(orders[np.lexsort((lengths.max(axis=1), chains(lengths)))[0]])
        else:
            best, remaining = [0], list(range(1, k))
            while remaining:
                nearest = min(remaining, key=lambda j: d[best[-1], j])
                best.append(nearest)
                remaining.remove(nearest)
            improved = True
            while improved:
                improved = False
                for i in range(1, k - 1):
                    for j in range(i + 1, k):
                        a, b, c, e = best[i - 1], best[i], best[j], best[(j + 1) % k]
                        if d[a, c] + d[b, e] < d[a, b] + d[c, e] - 1e-9:
                            best[i:j + 1] = best[i:j + 1][::-1]
                            improved = True
            improved = True
            while improved:
                improved = False
                lengths = hops(np.array(best))
                current = (float(chains(lengths)), lengths.max())
                for i in range(1, k - 1):
                    for j in range(i + 1, k):
                        trial = best[:i] + best[i:j + 1][::-1] + best[j + 1:]
                        trial_lengths = hops(np.array(trial))
                        if (float(chains(trial_lengths)), trial_lengths.max()) < (current[0] - 1e-9, current[1]):
                            best, improved = trial, True
                            break
                    if improved:
                        break
        order = tuple(ordered[int(i)] for i in best)
        self._ring_orders[key] = order
        return order

    def options(self, members: Iterable[str], shortlist: int | None = None) -> list[Clique]:
        """Ways a clique of these members can combine its vectors: in line at any city that aggregates,
        or directly (all-to-all, ring, and with `host_tree` a host-side tree at its best root), which
        needs no aggregation and can win on latency.

        With a shortlist, only the members' own cities and the `shortlist` cities with the least
        round-trip latency to the farthest member are offered for aggregation.
        """
        ordered = self.canonical(members)
        direct = [Clique(ordered, None, ALL_TO_ALL), Clique(self.ring_order(ordered), None, RING)]
        if self.host_tree:
            direct.append(self.host_tree_clique(ordered))
        cities: Sequence[str] = self.aggregation_cities
        if shortlist is not None and len(cities) > shortlist:
            lat = self.latency_ms
            reach = sorted(cities, key=lambda g: max(lat(m, g) + lat(g, m) for m in ordered))[:shortlist]
            cities = [g for g in cities if g in reach or g in ordered]
        # A board drops a contribution whose fan-in is above its maximum: no such clique sums there.
        cities = [g for g in cities if (self.aggregator_of[g].max_fanin or math.inf) >= len(ordered)]
        return [Clique(ordered, city, AGGREGATE) for city in cities] + direct

    def aggregation_limits(self, clique: Clique) -> list[str]:
        """Why a clique exchanged between hosts is not summed in the network: one line per cause (fan-in,
        ingress, core or egress rate, links, elements per frame), set against the clique's own time."""
        members, k = clique.members, len(clique.members)
        direct_ms = self.clique_time_alone(clique)
        fanin = {self.aggregator_of[g].name: self.aggregator_of[g].max_fanin for g in self.aggregation_cities
                 if (self.aggregator_of[g].max_fanin or math.inf) < k}
        causes = [f"fan-in: {name} takes at most {most} contributions a slot, the clique has {k}"
                  for name, most in sorted(fanin.items())]
        options = [c for c in self.options(members) if c.exchange == AGGREGATE]
        if not options:
            return causes or ["no city of the topology aggregates in line (or --no-aggregation is given)"]
        best = min(options, key=self.clique_time_alone)
        best_ms = self.clique_time_alone(best)
        if best_ms <= direct_ms:
            return causes + [f"shared round: summed at {best.hub} alone it takes {best_ms:,.1f} ms against "
                             f"{direct_ms:,.1f} by {clique.exchange}, but not beside the round's other cliques"]
        hub, profile = best.hub, self.aggregator_of[best.hub]
        loads, latency = self.profile(best).loads_bits, self.profile(best).latency_ms
        first = self._aggregator_index.get(hub)
        megabytes = self.vector_bits / 8e6
        against = f"against {direct_ms:,.1f} ms for the whole clique by {clique.exchange}"
        if first is not None:
            for offset, what in enumerate(("ingress rate", "core rate", "egress rate")):
                busy_ms = 1e3 * loads[first + offset] / self.capacity_bps[first + offset]
                if latency + busy_ms > direct_ms:
                    causes.append(f"{what}: {profile.name} at {hub} moves {loads[first + offset] / 8e6:,.1f} MB "
                                  f"({loads[first + offset] / self.vector_bits:g} x the {megabytes:,.1f} MB vector) at "
                                  f"{self.capacity_bps[first + offset] / 1e9:g} Gb/s: {latency + busy_ms:,.1f} ms "
                                  f"with its propagation, {against}")
        if self.reduce_in_path and not self.tree_tables:
            # The aggregators a contribution climbs through: the cities that would sum uncapped on its way (a
            # member's own city only where it gathers two or more streams), the root included.
            parent = self._tree(hub)[0]
            _, _, upward, summing = self._summing(hub, members, parent)
            climbs = self._levels(summing, hub, parent, upward)
            levels = max(climbs[member] for member in members)
            if levels > ROUTE_HOPS + 1:
                causes.append(f"depth: the tree to {hub} has {levels} summing levels; a frame's route names at most "
                              f"{ROUTE_HOPS} aggregators above the first, so the levels beyond forward unsummed")
        if first is None or len(causes) == len(fanin):
            links = loads[:len(self.bandwidth_bps)] / self.bandwidth_bps
            causes.append(f"links: summed at {hub} (its fastest city) the clique takes {best_ms:,.1f} ms, its "
                          f"busiest link {1e3 * float(links.max()):,.1f} ms of it, {against}")
        if profile.max_elements is not None and profile.max_elements < MAX_ELEMENTS_PER_FRAME:
            causes.append(f"elements: {profile.name} takes at most {profile.max_elements} elements a frame (the "
                          f"planner's frames carry {MAX_ELEMENTS_PER_FRAME}), so every vector summed there needs "
                          f"{MAX_ELEMENTS_PER_FRAME / profile.max_elements:.1f}x the frames (headers not charged)")
        return causes

    def clique_time_alone(self, clique: Clique) -> float:
        p = self.profile(clique)
        return p.latency_ms + (1e3 * float(np.max(p.loads_bits[p.used] / self.capacity_bps[p.used]))
                               if p.used.size else 0.0)

    # -- one round -------------------------------------------------------------------------------
    def clique_times(self, cliques: Sequence[Clique]) -> list[float]:
        """Each clique's time in a round where all of them run at once and share links and aggregators."""
        return self._times(self.round_profiles(cliques)) if cliques else []

    def _times(self, profiles: Sequence[_Profile]) -> list[float]:
        """Each clique's time, from its profile, when these profiles share the resources."""
        seconds = sum(p.loads_bits for p in profiles) / self.capacity_bps
        return [p.latency_ms + (1e3 * float(seconds[p.used].max()) if p.used.size else 0.0) for p in profiles]

    def round_profiles(self, cliques: Sequence[Clique]) -> list[_Profile]:
        """Each clique's profile in a round where all of them run at once.

        Latency and bandwidth routing route each clique alone (`profile`). Balanced routing starts there
        too, from each clique's own balanced routes, then re-routes flows of any aggregating or ring clique
        of the round with the same moves, scored by the round's time (its slowest clique: propagation plus
        the busiest resource it shares with the others): sweeps over the cliques in round order, their
        routed cities in name order or hops in ring order, each taking its first move that shortens the
        round by more than ROUTING_TOLERANCE_MS, at most ROUTING_MOVES moves (`_descend`). So a clique
        can step off a link another clique of its round needs, and the round is never slower than its
        cliques routed alone.
        """
        profiles = [self.profile(c) for c in cliques]
        key = tuple(cliques)
        if self.routing != "balanced" or len(key) < 2 or not any(c in self._balanced_routes for c in key):
            return profiles
        if key not in self._round_profiles:
            start: _RoundState = tuple((p, self._balanced_routes.get(c)) for c, p in zip(key, profiles))
            movers: list[Callable[[Any, Any], Iterator[Any]]] = [self._tree_moves(c) if c.exchange == AGGREGATE
                      else self._ring_moves(self._ring_shape(c.members)[0]) for c in key]

            def elements(state: _RoundState) -> list[tuple[int, Any]]:
                return [(i, element) for i, (_, routes) in enumerate(state) if routes is not None
                        for element in (sorted(routes) if key[i].exchange == AGGREGATE else range(len(routes)))]

            def moves(state: _RoundState, element: tuple[int, Any]) -> Iterator[_RoundState]:
                i, item = element
                for routes in movers[i](state[i][1], item):
                    yield state[:i] + ((self._routed_profile(key[i], routes), routes),) + state[i + 1:]

            end = _descend(start, max(self._times(profiles)), elements, moves,
                           lambda state: max(self._times([p for p, _ in state])))
            self._round_profiles[key] = [p for p, _ in end]
        return self._round_profiles[key]

    def _routed_profile(self, clique: Clique, routes: Any) -> _Profile:
        """The profile of a balanced clique given its routes (parent pointers to its root, or its ring hops')."""
        if clique.exchange == AGGREGATE:
            _, loads, tree, latency = self._aggregate_time_ms(clique, routes)
        else:
            _, steps, bits = self._ring_shape(clique.members)
            loads, tree = self._ring_time_ms(clique.members, routes, steps, bits)[1], None
            latency = ring_chain_ms([ms for _, ms in routes], steps)
        return _Profile(latency, loads, np.flatnonzero(loads), tree)

    def round_time(self, cliques: Sequence[Clique]) -> float:
        """Time of a round whose cliques run at once and share links: its slowest clique's."""
        return max(self.clique_times(cliques), default=0.0)

    def _round_time_alone(self, cliques: Sequence[Clique]) -> float:
        """A round's time with each clique routed alone, as options are compared."""
        return max(self._times([self.profile(c) for c in cliques]))

    def best_round(self, groups: Iterable[Collection[str]]) -> tuple[tuple[Clique, ...], float, bool]:
        """Cliques for these member groups with the combination of options that finishes soonest.

        Exhaustive over every option of every clique (each aggregation city and direct exchange) when the
        combinations number at most EXHAUSTIVE_AGGREGATOR_LIMIT; otherwise each clique keeps its 4 best
        shortlisted options when alone and the assignment is improved one clique at a time.
        Returns (cliques, time_ms, exhaustive).
        """
        kept = [self.canonical(g) for g in groups if len(g) > 1]
        key = frozenset(frozenset(g) for g in kept)
        if key in self._best_rounds:
            return self._best_rounds[key]
        kept.sort(key=lambda g: self._position[g[0]])
        result: tuple[tuple[Clique, ...], float, bool]
        if not kept:
            result = ((), 0.0, True)
        else:
            direct = 3 if self.host_tree else 2
            exhaustive = (len(self.aggregation_cities) + direct) ** len(kept) <= EXHAUSTIVE_AGGREGATOR_LIMIT
            if exhaustive:
                option_lists = [self.options(g) for g in kept]
            else:
                option_lists = [sorted(self.options(g, SHORTLIST), key=self.clique_time_alone)[:4]
                                for g in kept]
            if math.prod(len(o) for o in option_lists) <= EXHAUSTIVE_AGGREGATOR_LIMIT:
                cliques, duration = self._assign_exhaustively(option_lists)
            else:
                cliques, duration = self._assign_by_descent(option_lists)
            if self.routing == "balanced":  # options are compared routed alone; the chosen ones routed together
                duration = self.round_time(cliques)
            result = (cliques, duration, exhaustive)
        self._best_rounds[key] = result
        return result

    def _assign_exhaustively(self, option_lists: Sequence[Sequence[Clique]]) -> tuple[tuple[Clique, ...], float]:
        count = len(option_lists)
        edges = len(self.capacity_bps)
        shape = tuple(len(o) for o in option_lists)
        total = np.zeros(shape + (edges,))
        per_clique = []
        for c, options in enumerate(option_lists):
            axes = [1] * count
            axes[c] = len(options)
            profiles = [self.profile(o) for o in options]
            loads = np.stack([p.loads_bits for p in profiles]).reshape(axes + [edges])
            latency = np.array([p.latency_ms for p in profiles]).reshape(axes)
            used = np.stack([p.loads_bits > 0 for p in profiles]).reshape(axes + [edges])
            total = total + loads
            per_clique.append((latency, used))
        seconds = total / self.capacity_bps
        duration = np.zeros(shape)
        for latency, used in per_clique:
            duration = np.maximum(duration, latency + 1e3 * np.where(used, seconds, 0.0).max(axis=-1))
        best = np.unravel_index(int(np.argmin(duration)), shape)
        return tuple(options[int(i)] for options, i in zip(option_lists, best)), float(duration[best])

    def _assign_by_descent(self, option_lists: Sequence[Sequence[Clique]]) -> tuple[tuple[Clique, ...], float]:
        chosen = [min(options, key=self.clique_time_alone) for options in option_lists]
        duration = self._round_time_alone(chosen)
        for _ in range(3):
            improved = False
            for c, options in enumerate(option_lists):
                for option in options:
                    if option == chosen[c]:
                        continue
                    trial = chosen[:c] + [option] + chosen[c + 1:]
                    trial_time = self._round_time_alone(trial)
                    if trial_time < duration - 1e-9:
                        chosen, duration, improved = trial, trial_time, True
            if not improved:
                break
        return tuple(chosen), duration


