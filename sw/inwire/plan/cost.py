"""Round times of cliques over a topology: links and aggregators as resources with rates.

A schedule is a periodic sequence of rounds; each round partitions the islands into cliques (islands
left out of every clique of a round sit it out), and every clique either sums at an aggregation city
and multicasts the sum back, or exchanges directly (all-to-all or ring). docs/schedule.md derives the
cost model.
"""

import itertools
import math
from dataclasses import dataclass

import numpy as np

from inwire.protocol import ELEMENT_BYTES, FRAME_HEADER_BYTES, MAX_ELEMENTS_PER_FRAME, WIRE_OVERHEAD_BYTES

AGGREGATE, ALL_TO_ALL, RING = "aggregate", "all-to-all", "ring"
EXCHANGES = (AGGREGATE, ALL_TO_ALL, RING)
EXHAUSTIVE_AGGREGATOR_LIMIT = 2048
"""Aggregator assignments of a round tried exhaustively up to this many combinations."""
SHORTLIST = 6
"""Beyond that, each clique's cities are first cut to this many by latency, then to 4 by time alone."""
class ScheduleError(ValueError):
    """A schedule file or request that cannot be used; the message names the offending entry."""


def wire_bytes(model_bytes):
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
    """Members (in ring order for a ring exchange) and where their sum is formed."""
    members: tuple
    aggregator: str | None = None
    exchange: str = AGGREGATE


@dataclass(frozen=True)
class _Profile:
    latency_ms: float
    loads_bits: np.ndarray
    used: np.ndarray


@dataclass
class Schedule:
    """An evaluated periodic schedule: rounds of cliques with their times, rho and time to epsilon."""
    rounds: tuple
    round_times_ms: tuple
    rho: float
    periods: float
    time_to_epsilon_ms: float

    @property
    def period_ms(self):
        return float(sum(self.round_times_ms))




class CostModel:
    """Round times of cliques over a topology for one model size and capability setting.

    Every directed link is a resource: a round puts on it the bits of every clique that routes over it,
    and a clique's time is its propagation term plus the time its busiest link needs for all of that
    traffic. A round lasts as long as its slowest clique.
    """

    def __init__(self, topology, islands, model_bytes, multicast=True, aggregation=True):
        self.topology = topology
        self.islands = tuple(islands)
        self.model_bytes = int(model_bytes)
        self.multicast = multicast
        self.aggregation = aggregation
        self.vector_bits = 8 * wire_bytes(self.model_bytes)
        directed = sorted(edge for u, v in topology.graph.edges for edge in ((u, v), (v, u)))
        self.edge_index = {edge: i for i, edge in enumerate(directed)}
        self.bandwidth_bps = np.array([topology.link_between(u, v).bandwidth_gbps * 1e9 for u, v in directed])
        cities = topology.cities
        self.aggregation_cities = tuple(name for name in cities if aggregation and cities[name].aggregation)
        self._replicates = {name: multicast and cities[name].multicast for name in cities}
        self._position = {name: i for i, name in enumerate(self.islands)}
        self._profiles = {}
        self._path_edges = {}
        self._trees = {}
        self._ring_orders = {}
        self._best_rounds = {}

    def latency_ms(self, a, b):
        return self.topology.latency_ms(a, b)

    def canonical(self, members):
        return tuple(sorted(members, key=self._position.__getitem__))

    # -- one clique ------------------------------------------------------------------------------
    def _add_path(self, loads, a, b, bits):
        edges = self._path_edges.get((a, b))
        if edges is None:
            path = self.topology.path(a, b)
            edges = np.array([self.edge_index[hop] for hop in zip(path, path[1:])], dtype=int)
            self._path_edges[(a, b)] = edges
        loads[edges] += bits

    def _tree(self, source):
        """Predecessor and hop depth of every city on the shortest-path tree rooted at `source`."""
        tree = self._trees.get(source)
        if tree is None:
            paths = {city: self.topology.path(source, city) for city in self.topology.cities}
            tree = ({city: path[-2] for city, path in paths.items() if len(path) > 1},
                    {city: len(path) - 1 for city, path in paths.items()})
            self._trees[source] = tree
        return tree

    def _add_distribution(self, loads, source, destinations, bits):
        """Send one vector from `source` to `destinations` along the shortest-path tree.

        A city that multicasts needs one copy and replicates it; one that cannot needs a copy for
        every destination at or below it.
        """
        parent, depth = self._tree(source)
        wanted = set(destinations)
        reached = set()
        for destination in destinations:
            city = destination
            while city != source and city not in reached:
                reached.add(city)
                city = parent[city]
        below = {}
        for city in sorted(reached, key=depth.__getitem__, reverse=True):
            copies = 1 if self._replicates[city] else below.get(city, 0) + (city in wanted)
            loads[self.edge_index[(parent[city], city)]] += copies * bits
            below[parent[city]] = below.get(parent[city], 0) + copies

    def profile(self, clique):
        cached = self._profiles.get(clique)
        if cached is not None:
            return cached
        members, k = clique.members, len(clique.members)
        loads = np.zeros(len(self.edge_index))
        if clique.exchange == AGGREGATE:
            hub = clique.aggregator
            latency = max(self.latency_ms(m, hub) + self.latency_ms(hub, m) for m in members)
            for member in members:
                if member != hub:
                    self._add_path(loads, member, hub, self.vector_bits)
            self._add_distribution(loads, hub, members, self.vector_bits)
        elif clique.exchange == ALL_TO_ALL:
            latency = max(self.latency_ms(a, b) for a in members for b in members if a != b)
            for sender in members:
                self._add_distribution(loads, sender, [m for m in members if m != sender], self.vector_bits)
        elif clique.exchange == RING:
            # Reduce-scatter then all-gather: 2(k-1) steps, each moving a 1/k chunk to the next member.
            steps = 2 * (k - 1)
            chunk_bits = 8 * wire_bytes(-(-self.model_bytes // k))
            hops = list(zip(members, members[1:] + members[:1]))
            latency = steps * max(self.latency_ms(a, b) for a, b in hops)
            for a, b in hops:
                self._add_path(loads, a, b, steps * chunk_bits)
        else:
            raise ScheduleError(f"unknown exchange {clique.exchange!r}")
        result = _Profile(latency, loads, np.flatnonzero(loads))
        self._profiles[clique] = result
        return result

    def ring_order(self, members):
        """A ring order with short hops; the longest sets the ring's latency (2(k-1) times it).

        Up to 9 members: the order with the shortest longest hop (ties: shortest total), by trying all.
        Beyond: nearest neighbour and 2-opt on the total, then 2-opt moves that shorten the longest hop.
        """
        key = frozenset(members)
        if key in self._ring_orders:
            return self._ring_orders[key]
        members = self.canonical(members)
        k = len(members)
        d = np.array([[self.latency_ms(a, b) for b in members] for a in members])

        def hops(orders):
            return d[orders, np.roll(orders, -1, axis=-1)]

        if k <= 9:
            orders = np.array([(0,) + p for p in itertools.permutations(range(1, k))])
            lengths = hops(orders)
            best = list(orders[np.lexsort((lengths.sum(axis=1), lengths.max(axis=1)))[0]])
        else:
            best, left = [0], list(range(1, k))
            while left:
                nearest = min(left, key=lambda j: d[best[-1], j])
                best.append(nearest)
                left.remove(nearest)
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
                worst = int(np.argmax(lengths))
                best = best[worst + 1:] + best[:worst + 1]  # the longest hop now closes the ring
                current = (lengths.max(), lengths.sum())
                for j in range(1, k - 1):
                    trial = best[:j][::-1] + best[j:]
                    trial_lengths = hops(np.array(trial))
                    if (trial_lengths.max(), trial_lengths.sum()) < current:
                        best, improved = trial, True
                        break
        order = tuple(members[int(i)] for i in best)
        self._ring_orders[key] = order
        return order

    def options(self, members, shortlist=None):
        """Ways a clique of these members can combine its vectors: in line at any city that aggregates,
        or directly (all-to-all, ring), which needs no aggregation and can win on latency.

        With a shortlist, only the members' own cities and the `shortlist` cities with the least
        round-trip latency to the farthest member are offered for aggregation.
        """
        members = self.canonical(members)
        direct = [Clique(members, None, ALL_TO_ALL), Clique(self.ring_order(members), None, RING)]
        cities = self.aggregation_cities
        if shortlist is not None and len(cities) > shortlist:
            lat = self.latency_ms
            reach = sorted(cities, key=lambda g: max(lat(m, g) + lat(g, m) for m in members))[:shortlist]
            cities = [g for g in cities if g in reach or g in members]
        return [Clique(members, city, AGGREGATE) for city in cities] + direct

    def clique_time_alone(self, clique):
        p = self.profile(clique)
        return p.latency_ms + (1e3 * float(np.max(p.loads_bits[p.used] / self.bandwidth_bps[p.used]))
                               if p.used.size else 0.0)

    # -- one round -------------------------------------------------------------------------------
    def round_time(self, cliques):
        """Time of a round whose cliques run at once and share links."""
        if not cliques:
            return 0.0
        profiles = [self.profile(c) for c in cliques]
        seconds = sum(p.loads_bits for p in profiles) / self.bandwidth_bps
        return max(p.latency_ms + (1e3 * float(seconds[p.used].max()) if p.used.size else 0.0)
                   for p in profiles)

    def best_round(self, groups):
        """Cliques for these member groups with the combination of options that finishes soonest.

        Exhaustive over every option of every clique (each aggregation city, all-to-all, ring) when the
        combinations number at most EXHAUSTIVE_AGGREGATOR_LIMIT; otherwise each clique keeps its 4 best
        shortlisted options when alone and the assignment is improved one clique at a time.
        Returns (cliques, time_ms, exhaustive).
        """
        groups = [self.canonical(g) for g in groups if len(g) > 1]
        key = frozenset(frozenset(g) for g in groups)
        if key in self._best_rounds:
            return self._best_rounds[key]
        groups.sort(key=lambda g: self._position[g[0]])
        if not groups:
            result = ((), 0.0, True)
        else:
            exhaustive = (len(self.aggregation_cities) + 2) ** len(groups) <= EXHAUSTIVE_AGGREGATOR_LIMIT
            if exhaustive:
                option_lists = [self.options(g) for g in groups]
            else:
                option_lists = [sorted(self.options(g, SHORTLIST), key=self.clique_time_alone)[:4]
                                for g in groups]
            if math.prod(len(o) for o in option_lists) <= EXHAUSTIVE_AGGREGATOR_LIMIT:
                cliques, duration = self._assign_exhaustively(option_lists)
            else:
                cliques, duration = self._assign_by_descent(option_lists)
            result = (cliques, duration, exhaustive)
        self._best_rounds[key] = result
        return result

    def _assign_exhaustively(self, option_lists):
        count = len(option_lists)
        edges = len(self.edge_index)
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
        seconds = total / self.bandwidth_bps
        duration = np.zeros(shape)
        for latency, used in per_clique:
            duration = np.maximum(duration, latency + 1e3 * np.where(used, seconds, 0.0).max(axis=-1))
        best = np.unravel_index(int(np.argmin(duration)), shape)
        return tuple(options[i] for options, i in zip(option_lists, best)), float(duration[best])

    def _assign_by_descent(self, option_lists):
        chosen = [min(options, key=self.clique_time_alone) for options in option_lists]
        duration = self.round_time(chosen)
        for _ in range(3):
            improved = False
            for c, options in enumerate(option_lists):
                for option in options:
                    if option == chosen[c]:
                        continue
                    trial = chosen[:c] + [option] + chosen[c + 1:]
                    trial_time = self.round_time(trial)
                    if trial_time < duration - 1e-9:
                        chosen, duration, improved = trial, trial_time, True
            if not improved:
                break
        return tuple(chosen), duration


