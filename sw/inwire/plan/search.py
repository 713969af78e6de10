"""Scoring schedules and searching for the one that reaches epsilon-consensus soonest."""

import itertools
import math
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import TypeVar

import numpy as np

from .. import progress
from .aggregator import AggregatorProfile
from .baselines import GroupRounds, baselines, geographic_grid, lower_bound_ms
from .cost import AGGREGATE, GLOO_RING, HOST_TREE, ROUTINGS, Clique, CostModel, Schedule, ScheduleError
from .mixing import (
    mixing_rate,
    periods_to_epsilon,
    progress_periods,
    reach_periods,
    spectral_radius,
    time_to_epsilon_ms,
)
from .topology import Topology

_Item = TypeVar("_Item")
Mixing = tuple[float, float, float]
"""(rho, spectral radius, reach periods) of a period."""

MAX_ISLANDS = 256
"""Most islands a schedule is planned for: the search's time grows faster than their number (100 islands
took 2.5 minutes here, 200 took 8)."""

# ---------------------------------------------------------------------------------------------------
# Evaluation and the search space


class Evaluator:
    """Scores schedules given as rounds of member groups, caching mixing rates and round choices.

    Without local steps a schedule's figure is its time to epsilon: whole periods by the norm rho (a
    guarantee), times the period's communication. With `local_steps` H > 0 every round follows H local
    steps of `step_ms`, and the figure is the time to epsilon at the asymptotic rate: fractional periods
    by the spectral radius (at least the periods every island needs to hear from every other), times
    the period with its compute. That is consensus progress per second, ln(1/epsilon) over that time.
    """

    def __init__(self, model: CostModel, epsilon: float, local_steps: int = 0, step_ms: float = 0.0) -> None:
        if not 0 < epsilon < 1:
            raise ScheduleError(f"epsilon must be between 0 and 1, got {epsilon}")
        if isinstance(local_steps, bool) or not isinstance(local_steps, int) or local_steps < 0:
            raise ScheduleError(f"local steps must be a whole number 0 or more, got {local_steps}")
        if not (step_ms >= 0 and math.isfinite(step_ms)):
            raise ScheduleError(f"step time must be 0 ms or more, got {step_ms}")
        self.model = model
        self.epsilon = epsilon
        self.local_steps = local_steps
        self.step_ms = float(step_ms)
        self._mixing: dict[tuple[frozenset[frozenset[str]], ...], Mixing] = {}
        self.evaluations = 0

    @property
    def compute_ms_per_round(self) -> float:
        return self.local_steps * self.step_ms

    def mixing(self, rounds_of_groups: Sequence[Sequence[Collection[str]]]) -> Mixing:
        """(rho, spectral radius, reach periods) of a period."""
        key = tuple(frozenset(frozenset(g) for g in groups if len(g) > 1) for groups in rounds_of_groups)
        if key not in self._mixing:
            islands = self.model.islands
            # Without local steps only rho scores; lambda is filled in for the schedules reported.
            self._mixing[key] = ((mixing_rate(islands, rounds_of_groups), spectral_radius(islands, rounds_of_groups),
                                  reach_periods(islands, rounds_of_groups)) if self.local_steps else
                                 (mixing_rate(islands, rounds_of_groups), math.nan, math.nan))
        return self._mixing[key]

    def with_spectral_radius(self, schedule: Schedule) -> Schedule:
        if not math.isnan(schedule.spectral_radius):
            return schedule
        groups = [[c.members for c in cliques] for cliques in schedule.rounds]
        return replace(schedule, spectral_radius=spectral_radius(self.model.islands, groups))

    def rho(self, rounds_of_groups: Sequence[Sequence[Collection[str]]]) -> float:
        return self.mixing(rounds_of_groups)[0]

    def evaluate(self, rounds_of_groups: Sequence[Sequence[Collection[str]]]) -> Schedule:
        self.evaluations += 1
        rounds: list[tuple[Clique, ...]] = []
        times: list[float] = []
        for groups in rounds_of_groups:
            cliques, duration, _ = self.model.best_round(groups)
            rounds.append(cliques)
            times.append(duration)
        return self.schedule_of(rounds, times, self.mixing(rounds_of_groups))

    def evaluate_cliques(self, rounds: Sequence[Sequence[Clique]]) -> Schedule:
        """Score rounds whose aggregators are already chosen."""
        times = [self.model.round_time(r) for r in rounds]
        return self.schedule_of(rounds, times, self.mixing([[c.members for c in r] for r in rounds]))

    def schedule_of(self, rounds: Iterable[Iterable[Clique]], times: Sequence[float], mixing: Mixing) -> Schedule:
        rho, spectral, reach = mixing
        as_tuples = tuple(tuple(r) for r in rounds)
        if not self.local_steps:
            period = float(sum(times))
            return Schedule(as_tuples, tuple(times), rho, periods_to_epsilon(rho, self.epsilon),
                            time_to_epsilon_ms(rho, period, self.epsilon), spectral)
        period = float(sum(times)) + len(times) * self.compute_ms_per_round
        periods = progress_periods(spectral, self.epsilon, reach)
        return Schedule(as_tuples, tuple(times), rho, periods, math.inf if math.isinf(periods) else periods * period,
                        spectral, self.compute_ms_per_round)


def ordered_factorizations(n: int, smallest: int = 2) -> list[tuple[int, ...]]:
    """Every ordered way to write n as a product of factors >= smallest (n itself included)."""
    if n == 1:
        return [()]
    result: list[tuple[int, ...]] = []
    for factor in range(smallest, n + 1):
        if n % factor == 0:
            result.extend((factor,) + rest for rest in ordered_factorizations(n // factor, smallest))
    return result


def equal_partitions(items: Sequence[_Item], size: int) -> Iterator[list[tuple[_Item, ...]]]:
    """Every partition of items into blocks of `size` (items in a fixed order, blocks in canonical order)."""
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    for companions in itertools.combinations(rest, size - 1):
        remaining = [x for x in rest if x not in companions]
        for tail in equal_partitions(remaining, size):
            yield [(first,) + companions] + tail


def grid_transversals(rows: Sequence[Sequence[_Item]]) -> Iterator[list[tuple[_Item, ...]]]:
    """Every partition into columns that take exactly one member of each row."""
    first, others = rows[0], rows[1:]
    for perms in itertools.product(*(itertools.permutations(row) for row in others)):
        yield [tuple([anchor] + [perm[i] for perm in perms]) for i, anchor in enumerate(first)]


def search_two_round_grids(model: CostModel, evaluator: Evaluator,
                           limit: int = 50_000) -> tuple[Schedule | None, int, bool]:
    """Exhaustive search over every two-round a x b grid schedule (rows, then columns).

    A grid ends its period in the exact average, so only the period matters. Factorizations whose
    schedules number more than `limit` are skipped. Returns (best schedule or None, schedules tried,
    whether every factorization was enumerated with exhaustive aggregator choice).
    """
    n = len(model.islands)
    best_rounds: tuple[tuple[Clique, ...], tuple[Clique, ...]] | None = None
    best_period, tried, complete = math.inf, 0, True
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
# Optimizer


@dataclass
class PlanResult:
    """The optimized schedule for one setting, with the baselines and the lower bound beside it."""
    topology: str
    islands: tuple[str, ...]
    model_bytes: int
    epsilon: float
    multicast: bool
    aggregation: bool
    seed: int
    best: Schedule
    baselines: dict[str, Schedule]
    lower_bound_ms: float
    method: str
    evaluations: int
    wall_s: float = 0.0
    aggregator: AggregatorProfile | None = None
    """The default AggregatorProfile (None: ideal); cities of the topology may set their own."""
    reduce_in_path: bool = False
    routing: str = "latency"
    local_steps: int = 0
    step_ms: float = 0.0
    cost_model: CostModel | None = None
    """The CostModel that scored the schedules (for per-clique times and reduction trees)."""
    host_nic_gbps: float | None = None
    """Every island's host NIC rate, in and out (None: unlimited)."""
    host_tree: bool = False
    """Whether the optimizer could exchange a clique on a host-side tree."""
    chosen: str = "optimized"
    """What `best` is: the optimizer's schedule, or the one clique of every island `global_clique_plan` puts
    in its place."""
    routing_note: str = ""
    """How the routing was chosen where it was not given (`routing="auto"`)."""
    tree_tables: bool = False
    """Whether the trees are carried by the aggregators' tables (a registered job), at any depth
    (`CostModel`'s `tree_tables`)."""

    @property
    def candidate_baselines(self) -> dict[str, Schedule]:
        """The baselines the optimizer started from, which it is never worse than: all but the host-side
        tree unless it was offered host trees."""
        return {name: s for name, s in self.baselines.items() if name not in self.excluded_baselines}

    @property
    def excluded_baselines(self) -> dict[str, str]:
        """Baselines printed for comparison that the optimized schedule may not use, with why."""
        return {} if self.host_tree else {HOST_TREE: "host trees not offered (--no-host-tree)"}

    @property
    def host_side(self) -> bool:
        """Whether the schedule sums nowhere in the network: every clique exchanges between hosts."""
        return not any(c.exchange == AGGREGATE for cliques in self.best.rounds for c in cliques)


def _groups_of(schedule: Schedule, islands: Iterable[str]) -> GroupRounds:
    """Rounds as full partitions (singletons included) for the local search to edit."""
    rounds: GroupRounds = []
    for cliques in schedule.rounds:
        seen = {m for c in cliques for m in c.members}
        rounds.append([list(c.members) for c in cliques] + [[m] for m in islands if m not in seen])
    return rounds


def _mutate(rounds: GroupRounds, rng: np.random.Generator, max_rounds: int) -> GroupRounds:
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
        shuffled: list[list[str]] = []
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


def _local_search(evaluator: Evaluator, start: Schedule, rng: np.random.Generator, iterations: int, max_rounds: int,
                  advance: Callable[[], object]) -> Schedule:
    """Simulated annealing on log(time to epsilon) over rounds of member groups; `advance()` after each step."""
    islands = evaluator.model.islands
    current_groups = _groups_of(start, islands)
    current = best = start
    for step in range(iterations):
        temperature = 0.05 * (1 - step / iterations) + 1e-3
        candidate_groups = _mutate(current_groups, rng, max_rounds)
        candidate = evaluator.evaluate(candidate_groups)
        advance()
        if math.isinf(candidate.time_to_epsilon_ms):
            continue
        delta = math.log(candidate.time_to_epsilon_ms) - math.log(current.time_to_epsilon_ms)
        if delta <= 0 or rng.random() < math.exp(-delta / temperature):
            current, current_groups = candidate, candidate_groups
            if current.time_to_epsilon_ms < best.time_to_epsilon_ms:
                best = current
    return best


def _key(schedule: Schedule) -> tuple[float, int, float, int]:
    """Sooner first; on a tie fewer rounds, a shorter period, then fewer cliques exchanged between hosts (the
    in-network tree ties the host tree where the aggregators are ideal: the hardware is then the answer)."""
    direct = sum(c.exchange != AGGREGATE for cliques in schedule.rounds for c in cliques)
    return (schedule.time_to_epsilon_ms, len(schedule.rounds), schedule.period_ms, direct)


AUTO_ROUTING = "auto"
"""The routing the topology names, or else the better of latency and balanced routing, planned both ways."""


def plan_schedule(topology: Topology, islands: Iterable[str] | None = None, model_bytes: int = 100_000_000,
                  epsilon: float = 1e-3, multicast: bool = True, aggregation: bool = True, seed: int = 0,
                  iterations: int | None = None, aggregator: str | AggregatorProfile = "ideal",
                  reduce_in_path: bool = False, routing: str = "latency", local_steps: int = 0, step_ms: float = 0.0,
                  host_nic_gbps: float | None = None, host_tree: bool = False,
                  tree_tables: bool = False) -> PlanResult:
    """Find the periodic schedule with the least time to epsilon-consensus, beside the baselines
    (`_plan_routed`). With routing "auto": the topology's own routing where it names one (a network whose
    controller routes for its endpoints, as DoubleZero's does), else planned with latency and with balanced
    routing, keeping the sooner (latency on a tie); the plan's `routing_note` says which and why."""
    def plan(chosen_routing: str) -> PlanResult:
        return _plan_routed(topology, islands, model_bytes, epsilon, multicast, aggregation, seed, iterations,
                            aggregator, reduce_in_path, chosen_routing, local_steps, step_ms, host_nic_gbps, host_tree,
                            tree_tables)

    if routing != AUTO_ROUTING:
        return plan(routing)
    if topology.routing is not None:
        return replace(plan(topology.routing),
                       routing_note=f"auto: {topology.name}'s own routing; --routing to change")
    latency, balanced = plan("latency"), plan("balanced")
    better, other = ((balanced, latency) if balanced.best.time_to_epsilon_ms < latency.best.time_to_epsilon_ms
                     else (latency, balanced))
    return replace(better, wall_s=latency.wall_s + balanced.wall_s,
                   routing_note=f"auto: the sooner of latency and balanced routing; {other.routing} gives "
                                f"{other.best.time_to_epsilon_ms:,.1f} ms")


def _plan_routed(topology: Topology, islands: Iterable[str] | None = None, model_bytes: int = 100_000_000,
                  epsilon: float = 1e-3, multicast: bool = True, aggregation: bool = True, seed: int = 0,
                  iterations: int | None = None, aggregator: str | AggregatorProfile = "ideal",
                  reduce_in_path: bool = False, routing: str = "latency", local_steps: int = 0, step_ms: float = 0.0,
                  host_nic_gbps: float | None = None, host_tree: bool = False,
                  tree_tables: bool = False) -> PlanResult:
    """Find the periodic schedule with the least time to epsilon-consensus, beside the baselines.

    Candidates: every baseline (the host-tree one only with `host_tree`); a geographic grid for every
    ordered factorization of n; for small n, every two-round grid exhaustively. The best few are refined
    by seeded simulated annealing, which may change rounds, cliques and their count. The result is never
    worse than any candidate.
    """
    started = time.perf_counter()
    chosen = topology.resolve_islands(islands)
    if routing not in ROUTINGS:
        raise ScheduleError(f"routing must be one of {', '.join((*ROUTINGS, AUTO_ROUTING))}, got {routing!r}")
    if len(chosen) > MAX_ISLANDS:
        raise ScheduleError(f"{len(chosen)} islands, more than the {MAX_ISLANDS} a schedule is planned for (the "
                            f"search took 8 minutes for 200 here); choose fewer with --islands")
    model = CostModel(topology, chosen, model_bytes, multicast, aggregation, aggregator, reduce_in_path, routing,
                      host_nic_gbps, host_tree, tree_tables)
    evaluator = Evaluator(model, epsilon, local_steps, step_ms)
    rng = np.random.default_rng(seed)
    n = len(chosen)

    reported = baselines(evaluator, seed)
    # Every baseline the options allow is a candidate, so none of those printed beats the result; the host-tree
    # one only where cliques may use host trees, and gloo's ring never (the plain ring on its order is faster).
    candidates = [s for name, s in reported.items() if name != GLOO_RING and (host_tree or name != HOST_TREE)]
    factorizations = ordered_factorizations(n)
    if len(factorizations) > 40:
        factorizations = sorted(factorizations, key=lambda d: (len(d), d))[:40]
    candidates += [evaluator.evaluate(geographic_grid(model, dims)) for dims in factorizations]
    grids, grids_tried, grids_complete = search_two_round_grids(model, evaluator)
    if grids is not None:
        candidates.append(grids)

    finite = sorted((c for c in candidates if not math.isinf(c.time_to_epsilon_ms)), key=_key)
    starts: list[Schedule] = []
    for c in finite:
        if all(c.rounds != s.rounds for s in starts):
            starts.append(c)
        if len(starts) == 3:
            break
    if iterations is None:
        iterations = 1200 if n <= 16 else max(400, 32000 // n)
    max_rounds = max(4, 2 * math.ceil(math.log2(n)))
    # Most of the planning time, minutes for a hundred islands: said on stderr as it goes.
    with progress.counting(len(starts) * iterations, "annealing step") as advance:
        for start in starts:
            candidates.append(_local_search(evaluator, start, rng, iterations, max_rounds, advance))

    best = evaluator.with_spectral_radius(min(candidates, key=_key))
    reported = {name: evaluator.with_spectral_radius(s) for name, s in reported.items()}
    if grids_complete and grids_tried == 0:
        method = "exhaustive over every single-round schedule (no two-round grid fits this many islands)"
    elif grids_complete:
        method = (f"exhaustive over every single-round schedule and all {grids_tried} two-round grid "
                  f"schedules, every combination of aggregation city or direct exchange per clique tried")
    else:
        method = f"{len(factorizations)} geographic grids and {grids_tried} two-round grids"
    method += f"; simulated annealing, {iterations} steps from each of {len(starts)} starts"
    return PlanResult(topology.source, chosen, model.model_bytes, epsilon, multicast, aggregation, seed, best,
                      reported, lower_bound_ms(model, epsilon, evaluator.compute_ms_per_round), method,
                      evaluator.evaluations, time.perf_counter() - started, model.default_aggregator,
                      model.reduce_in_path, routing, local_steps, float(step_ms), model, model.host_nic_gbps,
                      model.host_tree, tree_tables=model.tree_tables)




def global_clique_plan(plan: PlanResult) -> PlanResult:
    """The plan with one clique of every island in place of its optimized schedule, summed in line at the
    aggregating city that finishes it soonest (along its tree with reduce-in-path): the clique the DDP hook
    sums in (`inwire.train.ddp.global_clique`), which the optimizer picks only where it is fastest."""
    model = plan.cost_model
    assert model is not None, "plan_schedule keeps the cost model it scored with"
    options = [clique for clique in model.options(plan.islands) if clique.exchange == AGGREGATE]
    if not options:
        raise ScheduleError("--global-clique: no city of the topology aggregates in line (or --no-aggregation is "
                            "given), so the clique of every island cannot be summed in the network")
    clique = min(options, key=model.clique_time_alone)
    best = Evaluator(model, plan.epsilon, plan.local_steps, plan.step_ms).evaluate_cliques([(clique,)])
    return replace(plan, best=best, chosen="global clique",
                   method=f"the global clique at its fastest aggregating city, {clique.aggregator} (--global-clique); "
                          f"the optimizer's search: {plan.method}")
