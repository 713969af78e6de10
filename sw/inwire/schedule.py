"""Rotating-clique schedules: cost model, mixing rate, baselines, optimizer and the schedule file.

A schedule is a periodic sequence of rounds; each round partitions the islands into cliques (islands
left out of every clique of a round sit it out), and every clique either sums at an aggregation city
and multicasts the sum back, or, where no city can aggregate, exchanges directly (all-to-all or ring).
docs/schedule.md derives the cost model, the mixing rate and the lower bound.
"""

import itertools
import json
import math
import time
from dataclasses import dataclass

import numpy as np

from inwire.protocol import ELEMENT_BYTES, FRAME_HEADER_BYTES, MAX_ELEMENTS_PER_FRAME, WIRE_OVERHEAD_BYTES

AGGREGATE, ALL_TO_ALL, RING = "aggregate", "all-to-all", "ring"
EXCHANGES = (AGGREGATE, ALL_TO_ALL, RING)
RHO_ZERO = 1e-9
"""rho at or below this counts as exact consensus after one period (round-off of an exact average)."""
RHO_ONE = 1 - 1e-12
"""rho at or above this never reaches consensus."""
EXHAUSTIVE_AGGREGATOR_LIMIT = 2048
"""Aggregator assignments of a round tried exhaustively up to this many combinations."""
SHORTLIST = 6
"""Beyond that, each clique's cities are first cut to this many by latency, then to 4 by time alone."""
BASELINE_NAMES = ("global", "ring", "hierarchical", "random", "grid")


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


# ---------------------------------------------------------------------------------------------------
# Mixing

def mixing_product(islands, rounds_of_groups):
    """W_T ... W_1 for rounds given as collections of member groups; unlisted islands keep their value."""
    index = {name: i for i, name in enumerate(islands)}
    product = np.eye(len(islands))
    for groups in rounds_of_groups:
        for group in groups:
            if len(group) > 1:
                rows = [index[member] for member in group]
                product[rows] = product[rows].mean(axis=0)
    return product


def mixing_rate(islands, rounds_of_groups):
    """rho = ||W_T ... W_1 - 11^T/n||_2: how much one period shrinks the disagreement, at worst."""
    product = mixing_product(islands, rounds_of_groups)
    return float(np.linalg.norm(product - 1.0 / len(islands), 2))


def periods_to_epsilon(rho, epsilon):
    """Periods until rho**periods <= epsilon: one for an exact average, infinity when rho is 1."""
    if rho <= RHO_ZERO:
        return 1
    if rho >= RHO_ONE:
        return math.inf
    return max(1, math.ceil(math.log(epsilon) / math.log(rho) - 1e-9))


def time_to_epsilon_ms(rho, period_ms, epsilon):
    periods = periods_to_epsilon(rho, epsilon)
    return math.inf if math.isinf(periods) else periods * period_ms


# ---------------------------------------------------------------------------------------------------
# Cost model

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


# ---------------------------------------------------------------------------------------------------
# Evaluation and the search space

class Evaluator:
    """Scores schedules given as rounds of member groups, caching mixing rates and round choices."""

    def __init__(self, model, epsilon):
        if not 0 < epsilon < 1:
            raise ScheduleError(f"epsilon must be between 0 and 1, got {epsilon}")
        self.model = model
        self.epsilon = epsilon
        self._rho = {}
        self.evaluations = 0

    def rho(self, rounds_of_groups):
        key = tuple(frozenset(frozenset(g) for g in groups if len(g) > 1) for groups in rounds_of_groups)
        if key not in self._rho:
            self._rho[key] = mixing_rate(self.model.islands, rounds_of_groups)
        return self._rho[key]

    def evaluate(self, rounds_of_groups):
        self.evaluations += 1
        rounds, times = [], []
        for groups in rounds_of_groups:
            cliques, duration, _ = self.model.best_round(groups)
            rounds.append(cliques)
            times.append(duration)
        return self.schedule_of(rounds, times, self.rho(rounds_of_groups))

    def evaluate_cliques(self, rounds):
        """Score rounds whose aggregators are already chosen."""
        times = [self.model.round_time(r) for r in rounds]
        return self.schedule_of(rounds, times, self.rho([[c.members for c in r] for r in rounds]))

    def schedule_of(self, rounds, times, rho):
        period = float(sum(times))
        return Schedule(tuple(tuple(r) for r in rounds), tuple(times), rho,
                        periods_to_epsilon(rho, self.epsilon), time_to_epsilon_ms(rho, period, self.epsilon))


def _medoid(model, members):
    return min(members, key=lambda m: (max(model.latency_ms(m, o) for o in members), model._position[m]))


def _balanced_groups(model, units, size, representative):
    """Split units into groups of `size`: the most remote unit left takes its size-1 nearest."""
    left = list(units)
    groups = []
    lat = model.latency_ms
    while left:
        remote = max(left, key=lambda u: sum(lat(representative(u), representative(o)) for o in left))
        left.remove(remote)
        left.sort(key=lambda o: lat(representative(remote), representative(o)))
        groups.append([remote] + left[:size - 1])
        left = left[size - 1:]
    return groups


def geographic_grid(model, dims):
    """A len(dims)-round grid schedule whose early rounds join nearby islands.

    Level t groups dims[t] units of level t-1 (islands at level 0) that lie close together; an island's
    coordinate t is the rank of its level-t unit by distance to the centre of its level-(t+1) group.
    Round t averages islands that differ only in coordinate t, so the period ends in the exact average.
    """
    units = [[island] for island in model.islands]
    coordinates = {island: [] for island in model.islands}
    for size in dims:
        representative = {id(u): _medoid(model, u) for u in units}
        grouped = _balanced_groups(model, units, size, lambda u, medoids=representative: medoids[id(u)])
        next_units = []
        for group in grouped:
            merged = [island for unit in group for island in unit]
            centre = _medoid(model, merged)
            ranked = sorted(group, key=lambda u: model.latency_ms(representative[id(u)], centre))
            for rank, unit in enumerate(ranked):
                for island in unit:
                    coordinates[island].append(rank)
            next_units.append(merged)
        units = next_units
    rounds = []
    for t in range(len(dims)):
        groups = {}
        for island in model.islands:
            key = tuple(c for i, c in enumerate(coordinates[island]) if i != t)
            groups.setdefault(key, []).append(island)
        rounds.append(list(groups.values()))
    return rounds


def ordered_factorizations(n, smallest=2):
    """Every ordered way to write n as a product of factors >= smallest (n itself included)."""
    if n == 1:
        return [()]
    result = []
    for factor in range(smallest, n + 1):
        if n % factor == 0:
            result.extend((factor,) + rest for rest in ordered_factorizations(n // factor, smallest))
    return result


def equal_partitions(items, size):
    """Every partition of items into blocks of `size` (items in a fixed order, blocks in canonical order)."""
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    for companions in itertools.combinations(rest, size - 1):
        remaining = [x for x in rest if x not in companions]
        for tail in equal_partitions(remaining, size):
            yield [(first,) + companions] + tail


def grid_transversals(rows):
    """Every partition into columns that take exactly one member of each row."""
    first, others = rows[0], rows[1:]
    for perms in itertools.product(*(itertools.permutations(row) for row in others)):
        yield [tuple([anchor] + [perm[i] for perm in perms]) for i, anchor in enumerate(first)]


def search_two_round_grids(model, evaluator, limit=50_000):
    """Exhaustive search over every two-round a x b grid schedule (rows, then columns).

    A grid ends its period in the exact average, so only the period matters. Factorizations whose
    schedules number more than `limit` are skipped. Returns (best schedule or None, schedules tried,
    whether every factorization was enumerated with exhaustive aggregator choice).
    """
    n = len(model.islands)
    best_rounds, best_period, tried, complete = None, math.inf, 0, True
    for a in range(2, n // 2 + 1):
        if n % a:
            continue
        b = n // a
        count = math.factorial(n) // (math.factorial(a) ** b * math.factorial(b))
        if count * math.factorial(a) ** (b - 1) > limit:
            complete = False
            continue
        for rows in equal_partitions(list(model.islands), a):
            row_cliques, row_time, exhaustive = model.best_round(rows)
            complete &= exhaustive
            for columns in grid_transversals(rows):
                tried += 1
                if row_time >= best_period:
                    continue
                column_cliques, column_time, exhaustive = model.best_round(columns)
                complete &= exhaustive
                if row_time + column_time < best_period:
                    best_period = row_time + column_time
                    best_rounds = (row_cliques, column_cliques)
    best = None if best_rounds is None else evaluator.evaluate_cliques(list(best_rounds))
    return best, tried, complete


# ---------------------------------------------------------------------------------------------------
# Baselines and the lower bound

def _near_square_side(n):
    """The largest divisor of n not above sqrt(n): 3 for 9, 4 for 32, 1 for a prime."""
    return max(d for d in range(1, math.isqrt(n) + 1) if n % d == 0)


def _regions(model):
    """Nearby islands grouped into regions of equal size where n allows (n/side regions of side)."""
    n = len(model.islands)
    side = _near_square_side(n)
    size = side if side > 1 else math.ceil(n / round(math.sqrt(n)))
    return _balanced_groups(model, model.islands, size, lambda island: island)


def baseline_rounds(model, seed=0):
    """Member groups of every baseline schedule, by name."""
    islands = list(model.islands)
    n = len(islands)
    rng = np.random.default_rng(seed)
    regions = _regions(model)
    size = math.ceil(math.sqrt(n))
    random_rounds = []
    for _ in range(3):
        order = [islands[i] for i in rng.permutation(n)]
        random_rounds.append([order[i:i + size] for i in range(0, n, size)])
    side = _near_square_side(n)
    cells = [islands[i] for i in rng.permutation(n)]
    rows = [cells[i:i + n // side] for i in range(0, n, n // side)]
    columns = [list(column) for column in zip(*rows)]
    return {
        "global": [[islands]],
        "hierarchical": [regions, [islands]],
        "random": random_rounds,
        "grid": [rows, columns] if side > 1 else [[islands]],
    }


def baselines(evaluator, seed=0):
    """Each baseline, evaluated: its best aggregators where it has a choice."""
    model = evaluator.model
    grouped = baseline_rounds(model, seed)
    ring = Clique(model.ring_order(model.islands), None, RING)
    return {name: evaluator.evaluate_cliques([(ring,)]) if name == "ring" else evaluator.evaluate(grouped[name])
            for name in BASELINE_NAMES}


def lower_bound_ms(model, epsilon):
    """No schedule in this model reaches epsilon-consensus sooner (derivation in docs/schedule.md).

    Any round with a clique of two or more puts a whole vector (or, for a ring, at least as many bytes)
    on some link: it lasts at least the vector's serialization at the fastest link speed. A round also
    lasts at least the one-way latency between any two members of any clique. For epsilon < 1/n every
    island must hear from every other within the periods run, along a chain of rounds whose latencies
    add up to at least the shortest-path latency; otherwise some pair of islands need only be joined.
    """
    islands = model.islands
    serialization_ms = 1e3 * model.vector_bits / float(model.bandwidth_bps.max())
    pairs = [model.latency_ms(a, b) for a in islands for b in islands if a != b]
    reach_ms = max(pairs) if epsilon < 1 / len(islands) else min(pairs)
    return reach_ms + serialization_ms


# ---------------------------------------------------------------------------------------------------
# Optimizer

@dataclass
class Plan:
    """The optimized schedule for one setting, with the baselines and the lower bound beside it."""
    topology: str
    islands: tuple
    model_bytes: int
    epsilon: float
    multicast: bool
    aggregation: bool
    seed: int
    best: Schedule
    baselines: dict
    lower_bound_ms: float
    method: str
    evaluations: int
    wall_s: float = 0.0


def _groups_of(schedule, islands):
    """Rounds as full partitions (singletons included) for the local search to edit."""
    rounds = []
    for cliques in schedule.rounds:
        seen = {m for c in cliques for m in c.members}
        rounds.append([list(c.members) for c in cliques] + [[m] for m in islands if m not in seen])
    return rounds


def _mutate(rounds, rng, max_rounds):
    """A neighbouring schedule: a round added or dropped, cliques merged or split, two islands exchanged
    in every round, or one island swapped or moved within a round."""
    rounds = [[list(g) for g in groups] for groups in rounds]
    move = rng.random()
    r = int(rng.integers(len(rounds)))
    groups = rounds[r]
    if move < 0.06 and len(rounds) > 1:
        del rounds[r]
    elif move < 0.12 and len(rounds) < max_rounds:
        copy = [list(g) for g in groups]
        flat = [m for g in copy for m in g]
        for _ in range(max(1, len(flat) // 4)):
            i, j = rng.choice(len(flat), 2, replace=False)
            flat[i], flat[j] = flat[j], flat[i]
        sizes, k = [len(g) for g in copy], 0
        shuffled = []
        for s in sizes:
            shuffled.append(flat[k:k + s])
            k += s
        rounds.insert(int(rng.integers(len(rounds) + 1)), shuffled)
    elif move < 0.2 and len(groups) > 1:
        i, j = sorted(rng.choice(len(groups), 2, replace=False))
        groups[i].extend(groups.pop(j))
    elif move < 0.28 and any(len(g) > 2 for g in groups):
        big = [i for i, g in enumerate(groups) if len(g) > 2]
        g = groups[big[int(rng.integers(len(big)))]]
        cut = int(rng.integers(1, len(g)))
        members = [g[i] for i in rng.permutation(len(g))]
        g[:] = members[:cut]
        groups.append(members[cut:])
    elif move < 0.6:
        # Exchange two islands in every round: the mixing structure (and rho) stays, the geography changes.
        flat = [m for g in groups for m in g]
        i, j = rng.choice(len(flat), 2, replace=False)
        x, y = flat[i], flat[j]
        for round_groups in rounds:
            for g in round_groups:
                g[:] = [y if m == x else x if m == y else m for m in g]
    elif move < 0.8 and len(groups) > 1:
        i, j = rng.choice(len(groups), 2, replace=False)
        a, b = int(rng.integers(len(groups[i]))), int(rng.integers(len(groups[j])))
        groups[i][a], groups[j][b] = groups[j][b], groups[i][a]
    elif len(groups) > 1:
        i, j = rng.choice(len(groups), 2, replace=False)
        if len(groups[i]) > 1:
            groups[j].append(groups[i].pop(int(rng.integers(len(groups[i])))))
    return [[g for g in groups if g] for groups in rounds]


def _local_search(evaluator, start, rng, iterations, max_rounds):
    """Simulated annealing on log(time to epsilon) over rounds of member groups."""
    islands = evaluator.model.islands
    current_groups = _groups_of(start, islands)
    current = best = start
    for step in range(iterations):
        temperature = 0.05 * (1 - step / iterations) + 1e-3
        candidate_groups = _mutate(current_groups, rng, max_rounds)
        candidate = evaluator.evaluate(candidate_groups)
        if math.isinf(candidate.time_to_epsilon_ms):
            continue
        delta = math.log(candidate.time_to_epsilon_ms) - math.log(current.time_to_epsilon_ms)
        if delta <= 0 or rng.random() < math.exp(-delta / temperature):
            current, current_groups = candidate, candidate_groups
            if current.time_to_epsilon_ms < best.time_to_epsilon_ms:
                best = current
    return best


def _key(schedule):
    return (schedule.time_to_epsilon_ms, len(schedule.rounds), schedule.period_ms)


def plan_schedule(topology, islands=None, model_bytes=100_000_000, epsilon=1e-3, multicast=True,
                  aggregation=True, seed=0, iterations=None):
    """Find the periodic schedule with the least time to epsilon-consensus, beside the baselines.

    Candidates: every baseline; a geographic grid for every ordered factorization of n; for small n,
    every two-round grid exhaustively. The best few are refined by seeded simulated annealing, which
    may change rounds, cliques and their count. The result is never worse than any candidate.
    """
    started = time.perf_counter()
    islands = topology.resolve_islands(islands)
    model = CostModel(topology, islands, model_bytes, multicast, aggregation)
    evaluator = Evaluator(model, epsilon)
    rng = np.random.default_rng(seed)
    n = len(islands)

    reported = baselines(evaluator, seed)
    candidates = list(reported.values())
    factorizations = ordered_factorizations(n)
    if len(factorizations) > 40:
        factorizations = sorted(factorizations, key=lambda d: (len(d), d))[:40]
    candidates += [evaluator.evaluate(geographic_grid(model, dims)) for dims in factorizations]
    grids, grids_tried, grids_complete = search_two_round_grids(model, evaluator)
    if grids is not None:
        candidates.append(grids)

    finite = sorted((c for c in candidates if not math.isinf(c.time_to_epsilon_ms)), key=_key)
    starts = []
    for c in finite:
        if all(c.rounds != s.rounds for s in starts):
            starts.append(c)
        if len(starts) == 3:
            break
    if iterations is None:
        iterations = 1200 if n <= 16 else max(400, 32000 // n)
    max_rounds = max(4, 2 * math.ceil(math.log2(n)))
    for start in starts:
        candidates.append(_local_search(evaluator, start, rng, iterations, max_rounds))

    best = min(candidates, key=_key)
    if grids_complete and grids_tried == 0:
        method = "exhaustive over every single-round schedule (no two-round grid fits this many islands)"
    elif grids_complete:
        method = (f"exhaustive over every single-round schedule and all {grids_tried} two-round grid "
                  f"schedules, every combination of aggregation city or direct exchange per clique tried")
    else:
        method = f"{len(factorizations)} geographic grids and {grids_tried} two-round grids"
    method += f"; simulated annealing, {iterations} steps from each of {len(starts)} starts"
    return Plan(topology.source, islands, model.model_bytes, epsilon, multicast, aggregation, seed, best,
                reported, lower_bound_ms(model, epsilon), method, evaluator.evaluations,
                time.perf_counter() - started)


# ---------------------------------------------------------------------------------------------------
# The schedule file

def _finite(value):
    """JSON has no infinity: infinite times and periods are written as null."""
    return None if value is None or math.isinf(value) else value


def _rounds_json(schedule):
    rounds = []
    for cliques, duration in zip(schedule.rounds, schedule.round_times_ms):
        rounds.append({"cliques": [{"members": list(c.members), "aggregator": c.aggregator,
                                    "exchange": c.exchange} for c in cliques],
                       "time_ms": round(duration, 6)})
    return rounds


def _summary_json(schedule):
    return {"period_ms": round(schedule.period_ms, 6), "rho": schedule.rho,
            "periods": _finite(schedule.periods),
            "time_to_epsilon_ms": _finite(schedule.time_to_epsilon_ms)}


def schedule_document(plan):
    """The schedule file's content (format in docs/schedule.md)."""
    document = {
        "topology": plan.topology,
        "islands": list(plan.islands),
        "model_bytes": plan.model_bytes,
        "epsilon": plan.epsilon,
        "multicast": plan.multicast,
        "aggregation": plan.aggregation,
        "seed": plan.seed,
        "rounds": _rounds_json(plan.best),
        **_summary_json(plan.best),
        "baselines": {name: {**_summary_json(s), "rounds": _rounds_json(s)} for name, s in plan.baselines.items()},
        "lower_bound_ms": round(plan.lower_bound_ms, 6),
        "method": plan.method,
    }
    return document


def write_schedule(plan, path):
    with open(path, "w") as handle:
        json.dump(schedule_document(plan), handle, indent=1)
        handle.write("\n")


def parse_schedule(document, source="schedule"):
    """Validate a schedule document; returns its rounds as lists of (members, aggregator)."""
    if not isinstance(document, dict):
        raise ScheduleError(f"{source}: the top level must be a JSON object")
    islands = document.get("islands")
    if not isinstance(islands, list) or not all(isinstance(i, str) for i in islands) or len(islands) < 2:
        raise ScheduleError(f"{source}: 'islands' must list at least two island names")
    if len(set(islands)) != len(islands):
        raise ScheduleError(f"{source}: 'islands' names an island twice")
    rounds = document.get("rounds")
    if not isinstance(rounds, list) or not rounds:
        raise ScheduleError(f"{source}: 'rounds' must be a non-empty list")
    known = set(islands)
    parsed = []
    for r, entry in enumerate(rounds):
        where = f"{source}: rounds[{r}]"
        cliques = entry.get("cliques") if isinstance(entry, dict) else None
        if not isinstance(cliques, list):
            raise ScheduleError(f"{where}: missing 'cliques' list")
        placed, round_cliques = set(), []
        for c, clique in enumerate(cliques):
            at = f"{where}.cliques[{c}]"
            members = clique.get("members") if isinstance(clique, dict) else None
            if not isinstance(members, list) or len(members) < 2:
                raise ScheduleError(f"{at}: 'members' must list at least two islands")
            for member in members:
                if member not in known:
                    raise ScheduleError(f"{at}: {member!r} is not one of the islands")
                if member in placed:
                    raise ScheduleError(f"{at}: island {member!r} is in two cliques of the round")
                placed.add(member)
            aggregator = clique.get("aggregator")
            exchange = clique.get("exchange", AGGREGATE)
            if exchange not in EXCHANGES:
                raise ScheduleError(f"{at}: exchange must be one of {', '.join(EXCHANGES)}, got {exchange!r}")
            if exchange == AGGREGATE and not isinstance(aggregator, str):
                raise ScheduleError(f"{at}: an aggregating clique needs an aggregator city")
            if exchange != AGGREGATE and aggregator is not None:
                raise ScheduleError(f"{at}: a {exchange} clique has no aggregator")
            round_cliques.append((tuple(members), aggregator))
        parsed.append(round_cliques)
    return parsed


def load_schedule(path):
    """Read and validate a schedule file: a list of rounds, each a list of (members, aggregator).

    The aggregator is a city name, or None for a clique that exchanges directly (its "exchange" field
    in the file says all-to-all or ring). Islands absent from a round sit that round out.
    """
    try:
        with open(path) as handle:
            document = json.load(handle)
    except OSError as error:
        raise ScheduleError(f"cannot read schedule {path!r}: {error.strerror}") from None
    except json.JSONDecodeError as error:
        raise ScheduleError(f"{path}: not valid JSON (line {error.lineno}: {error.msg})") from None
    return parse_schedule(document, str(path))


# ---------------------------------------------------------------------------------------------------
# Readable output

def _time(ms):
    return "never" if math.isinf(ms) else f"{ms:,.1f}"


def describe_round(cliques):
    parts = []
    for c in cliques:
        where = c.aggregator if c.exchange == AGGREGATE else c.exchange
        parts.append("{" + ",".join(c.members) + "}@" + where)
    return "  ".join(parts) if parts else "(idle)"


def format_plan(plan):
    """The human-readable table the CLI prints."""
    best = plan.best
    lines = [
        f"topology {plan.topology}: {len(plan.islands)} islands, model {plan.model_bytes / 1e6:,.0f} MB "
        f"({wire_bytes(plan.model_bytes) / 1e6:,.1f} MB on the wire), epsilon {plan.epsilon:g}, "
        f"multicast {'on' if plan.multicast else 'off'}, aggregation {'on' if plan.aggregation else 'off'}",
        "",
        f"{'schedule':<14}{'rounds':>7}{'period ms':>12}{'rho':>10}{'periods':>9}{'time to eps ms':>16}"
        f"{'x bound':>9}",
    ]
    rows = [("optimized", best)] + list(plan.baselines.items())
    for name, s in rows:
        periods = "-" if math.isinf(s.periods) else str(s.periods)
        ratio = s.time_to_epsilon_ms / plan.lower_bound_ms
        lines.append(f"{name:<14}{len(s.rounds):>7}{s.period_ms:>12,.1f}{s.rho:>10.4f}{periods:>9}"
                     f"{_time(s.time_to_epsilon_ms):>16}{'-' if math.isinf(ratio) else f'{ratio:.2f}':>9}")
    lines.append(f"{'lower bound':<14}{'':>7}{'':>12}{'':>10}{'':>9}{_time(plan.lower_bound_ms):>16}{1:>9.2f}")
    lines.append("")
    lines.append("optimized schedule, one period:")
    for i, (cliques, duration) in enumerate(zip(best.rounds, best.round_times_ms), 1):
        lines.append(f"  round {i} ({duration:,.1f} ms): {describe_round(cliques)}")
    lines.append(f"search: {plan.method}; {plan.evaluations} schedules scored in {plan.wall_s:.1f} s")
    return "\n".join(lines)
