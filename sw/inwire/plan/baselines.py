"""Baseline schedules and the lower bound, all scored with the same cost model."""

import math
from collections.abc import Callable, Collection, Sequence
from typing import Protocol, TypeVar

import numpy as np

from .cost import GLOO_RING, HOST_TREE, RING, Clique, CostModel, Schedule

_Unit = TypeVar("_Unit")
GroupRounds = list[list[list[str]]]
"""A schedule as rounds of member groups, each group a list of island names."""


class Scorer(Protocol):
    """What `baselines` needs of `search.Evaluator` (which imports this module)."""
    model: CostModel

    def evaluate(self, rounds_of_groups: Sequence[Sequence[Collection[str]]]) -> Schedule: ...

    def evaluate_cliques(self, rounds: Sequence[Sequence[Clique]]) -> Schedule: ...

BASELINE_NAMES = ("global", "ring", GLOO_RING, HOST_TREE, "hierarchical", "random", "grid", "grid2d", "exponential")
"""The host-tree baseline is the host-side tree all-reduce of every island (no aggregator) at its best root;
the optimizer takes it as a candidate only where the cost model offers host trees (`host_tree`). The
gloo-ring baseline is the ring as gloo runs it (a ready-to-receive round trip every step): predicted, never
a candidate, since the plain ring on the same order is never slower."""


def _medoid(model: CostModel, members: Sequence[str]) -> str:
    return min(members, key=lambda m: (max(model.latency_ms(m, o) for o in members), model._position[m]))


def _balanced_groups(model: CostModel, units: Sequence[_Unit], size: int,
                     representative: Callable[[_Unit], str]) -> list[list[_Unit]]:
    """Split units into groups of `size`: the most remote unit left takes its size-1 nearest."""
    left = list(units)
    groups: list[list[_Unit]] = []
    lat = model.latency_ms
    while left:
        remote = max(left, key=lambda u: sum(lat(representative(u), representative(o)) for o in left))
        left.remove(remote)
        left.sort(key=lambda o: lat(representative(remote), representative(o)))
        groups.append([remote] + left[:size - 1])
        left = left[size - 1:]
    return groups


def geographic_grid(model: CostModel, dims: Sequence[int]) -> GroupRounds:
    """A len(dims)-round grid schedule whose early rounds join nearby islands.

    Level t groups dims[t] units of level t-1 (islands at level 0) that lie close together; an island's
    coordinate t is the rank of its level-t unit by distance to the centre of its level-(t+1) group.
    Round t averages islands that differ only in coordinate t, so the period ends in the exact average.
    """
    units = [[island] for island in model.islands]
    coordinates: dict[str, list[int]] = {island: [] for island in model.islands}
    for size in dims:
        representative = {id(u): _medoid(model, u) for u in units}

        def medoid_of(unit: list[str], medoids: dict[int, str] = representative) -> str:
            return medoids[id(unit)]

        grouped = _balanced_groups(model, units, size, medoid_of)
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
    rounds: GroupRounds = []
    for t in range(len(dims)):
        groups: dict[tuple[int, ...], list[str]] = {}
        for island in model.islands:
            key = tuple(c for i, c in enumerate(coordinates[island]) if i != t)
            groups.setdefault(key, []).append(island)
        rounds.append(list(groups.values()))
    return rounds



def _near_square_side(n: int) -> int:
    """The largest divisor of n not above sqrt(n): 3 for 9, 4 for 32, 1 for a prime."""
    return max(d for d in range(1, math.isqrt(n) + 1) if n % d == 0)


def _regions(model: CostModel) -> list[list[str]]:
    """Nearby islands grouped into regions of equal size where n allows (n/side regions of side)."""
    n = len(model.islands)
    side = _near_square_side(n)
    size = side if side > 1 else math.ceil(n / round(math.sqrt(n)))
    return _balanced_groups(model, model.islands, size, lambda island: island)


def baseline_rounds(model: CostModel, seed: int = 0) -> dict[str, GroupRounds]:
    """Member groups of every baseline schedule, by name."""
    islands = list(model.islands)
    n = len(islands)
    rng = np.random.default_rng(seed)
    regions = _regions(model)
    size = math.ceil(math.sqrt(n))
    random_rounds: GroupRounds = []
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
        "grid2d": geographic_grid(model, (side, n // side)) if side > 1 else [[islands]],
        "exponential": exponential_rounds(islands),
    }


def exponential_rounds(islands: Sequence[str]) -> GroupRounds:
    """One-peer exponential graph as pairs: in round k island i averages with island i XOR 2^k (when
    that index exists), for k up to log2 n. Exact after log2 n rounds when n is a power of two; gossip,
    with some mixing left over, otherwise."""
    n = len(islands)
    rounds: GroupRounds = []
    for k in range(max(1, math.ceil(math.log2(n)))):
        step = 1 << k
        rounds.append([[islands[i], islands[i ^ step]] for i in range(n) if i < i ^ step < n])
    return rounds


def baselines(evaluator: Scorer, seed: int = 0) -> dict[str, Schedule]:
    """Each baseline, evaluated: its best aggregators where it has a choice."""
    model = evaluator.model
    grouped = baseline_rounds(model, seed)
    ring = model.ring_order(model.islands)
    fixed = {"ring": Clique(ring, None, RING), GLOO_RING: Clique(ring, None, GLOO_RING),
             HOST_TREE: model.host_tree_clique(model.islands)}
    return {name: evaluator.evaluate_cliques([(fixed[name],)]) if name in fixed else evaluator.evaluate(grouped[name])
            for name in BASELINE_NAMES}


def lower_bound_ms(model: CostModel, epsilon: float, compute_ms_per_round: float = 0.0) -> float:
    """No schedule in this model reaches epsilon-consensus sooner (derivation in docs/schedule.md).

    Any round with a clique of two or more puts a whole vector (or, for a ring, at least as many bytes)
    on some link: it lasts at least the vector's serialization at the fastest link speed. A round also
    lasts at least the one-way latency between any two members of any clique. For epsilon < 1/n every
    island must hear from every other within the periods run, along a chain of rounds whose latencies
    add up to at least the shortest-path latency; otherwise some pair of islands need only be joined.
    Aggregator limits only slow rounds down. With local steps every schedule runs at least one round,
    so their compute adds once.
    """
    islands = model.islands
    serialization_ms = 1e3 * model.vector_bits / float(model.bandwidth_bps.max())
    pairs = [model.latency_ms(a, b) for a in islands for b in islands if a != b]
    reach_ms = max(pairs) if epsilon < 1 / len(islands) else min(pairs)
    return reach_ms + serialization_ms + compute_ms_per_round


