"""The text workload's study (`make train-study`): H swept, each strategy's outer learning rate chosen from one
grid on a tuning seed, the target loss chosen over seeds, then every strategy on the evaluation seeds.

In order:
1. Plans, per seed: the planner's seeded search for the charged model size (`schedule`, rotating cliques),
   its baselines (`global`, `ring`, `host-tree`, `hierarchical`), `gossip` and `random` (partitions drawn
   from the seed). Seeds also vary the initialization, the batches and which island trains on which
   module family.
2. Tuning, on the tuning seed alone: every synchronizing strategy at every H and every outer learning rate
   of the grid (DiLoCo's Nesterov, momentum 0.9). Per strategy and H the rate with the lowest final mean
   island validation loss is kept (ties: the first in the grid). Strategies that train alike (`global`,
   `ring` and `host-tree` compute the same exact average; only their charged time differs) get the same rate.
3. Evaluation seeds: `none` (never synchronizing) and `sync` (the plain average of every island after every
   step: the quality ceiling, charged as the fastest exact global average of the planner's) once per seed;
   every other strategy at every H with its rate.
4. The target: the highest loss on the 0.01 grid at least 0.01 below the best validation loss that any single
   island reaches alone (under `none`, at any evaluation of any evaluation seed). No island alone reaches it
   by construction; the study records on how many seeds `sync` does.
5. Per H: mean ± std over the evaluation seeds and verdicts of `schedule` against every other strategy,
   paired over seeds on the time-averaged validation loss, Holm-corrected over every H and strategy together
   (`training.compare`, `stats`). `global`, `ring` and `host-tree` sync every H steps like `schedule`: the
   same number of communication rounds, each an exact global average (the equal-communication control).

Everything is a function of the settings and the machine's standard library files (hashed in the output):
reruns write the same bytes, whatever the number of worker processes (`--workers`: independent training runs
go in parallel, each process on one torch thread; the tuning runs finish before the evaluation runs that use
their choice start). Wall clock goes to stderr only (the estimate and progress).
"""

import argparse
import contextlib
import json
import math
import multiprocessing
import os
import pathlib
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Executor, Future, ProcessPoolExecutor, wait
from dataclasses import asdict, dataclass
from typing import Any, TypeVar

from ..output import atomic_output
from ..plan.cost import HOST_TREE
from ..plan.search import Evaluator, plan_schedule
from ..plan.topology import load_topology
from .outer import OuterOptimizer
from .training import (
    EVALUATE_EVERY,
    VERSUS_HEADER,
    VERSUS_RULE,
    Cell,
    Curve,
    Strategy,
    TrainConfig,
    _mean_curves,
    _pm,
    _simulate_cached,
    compare,
    correct_verdicts,
    gossip_rounds,
    plot_cell,
    random_rounds,
    run_strategy,
    summarize,
    text_corpus,
    time_to_target_ms,
    training_inputs,
    verdict_rule,
    versus_columns,
    versus_entry,
)

_Result = TypeVar("_Result")
Rounds = dict[str, tuple[tuple[tuple[tuple[str, ...], ...], ...], tuple[float, ...]]]
"""Per strategy: its rounds of member groups and their times."""
Outer = tuple[float, float]
"""An outer step: (learning rate, momentum)."""
Run = tuple[TrainConfig, Strategy]
Inputs = tuple[Any, ...]
"""A training run's inputs (`training_inputs`): what its result depends on, hashable."""

STRATEGIES = ("none", "sync", "global", "ring", HOST_TREE, "hierarchical", "gossip", "random", "schedule")
DEFAULT_STRATEGIES = ("none", "sync", "global", "ring", HOST_TREE, "schedule")
"""What `make train-study` runs: on two cores in about two and a half hours (ten seeds) the grid has room for two
trained rotations at most (the exact average, which global, ring and host-tree share, and the planner's
schedule). The exact averages sync as often as the schedule: its equal-communication control."""
EXACT_AVERAGES = ("global", "ring", HOST_TREE)
"""The planner's strategies that compute the exact average of every island, each charged its own way."""
EPSILON = 1e-3
MARGIN = 0.01
"""How far below the best lone island's loss the target lies, at least."""


@dataclass(frozen=True)
class StudySettings:
    topology: str = "doublezero9"
    islands: tuple[str, ...] = ()
    steps: int = 400
    local_steps: tuple[int, ...] = (10, 50, 100)
    outer_steps: tuple[Outer, ...] = ((1.0, 0.0), (0.7, 0.9))
    """The grid, (learning rate, momentum) each: plain averaging, and DiLoCo's Nesterov at torchft's rate."""
    tuning_seed: int = 0
    seeds: tuple[int, ...] = tuple(range(1, 11))
    strategies: tuple[str, ...] = DEFAULT_STRATEGIES
    model_bytes: int = 100_000_000
    """The size communication is charged for."""
    aggregator: str = "ideal"
    step_ms: float = 100.0
    text_width: int = 128
    text_layers: int = 5
    text_heads: int = 4
    text_context: int = 64
    text_batch: int = 4
    text_learning_rate: float = 2e-3

    def __post_init__(self) -> None:
        if self.tuning_seed in self.seeds:
            raise ValueError(f"the tuning seed {self.tuning_seed} must not be an evaluation seed")
        if len(self.seeds) < 2 or len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"at least two distinct evaluation seeds are needed, got {list(self.seeds)}")
        if not self.local_steps or any(h < 1 or h > self.steps for h in self.local_steps):
            raise ValueError(f"every H must be between 1 and the {self.steps} steps, got {list(self.local_steps)}")
        if not self.outer_steps:
            raise ValueError("the outer grid needs at least one (learning rate, momentum)")
        for lr, momentum in self.outer_steps:
            OuterOptimizer(lr, momentum)
        unknown = set(self.strategies) - set(STRATEGIES)
        if unknown or not {"none", "sync", "schedule"} <= set(self.strategies):
            raise ValueError(f"strategies must be among {', '.join(STRATEGIES)} and include none, sync and "
                             f"schedule, got {', '.join(self.strategies)}")
        # Checks every model and optimizer setting once, in TrainConfig's words.
        self.config(self.tuning_seed, 1, 1.0, 0.0)

    @property
    def tuned(self) -> list[str]:
        """The strategies whose outer step is chosen: all that synchronize."""
        return [name for name in self.strategies if name != "none"]

    def config(self, seed: int, local_steps: int, outer_lr: float, outer_momentum: float) -> TrainConfig:
        return TrainConfig(topology=self.topology, islands=tuple(self.islands), steps=self.steps,
                           local_steps=local_steps, seed=seed, strategies=("none",), model_bytes=self.model_bytes,
                           step_ms=self.step_ms, aggregator=self.aggregator, outer_lr=outer_lr,
                           outer_momentum=outer_momentum, workload="text", text_width=self.text_width,
                           text_layers=self.text_layers, text_heads=self.text_heads,
                           text_context=self.text_context, text_batch=self.text_batch,
                           text_learning_rate=self.text_learning_rate, text_shuffle_families=True)


def plan_seed(settings: StudySettings, seed: int) -> tuple[tuple[str, ...], Rounds, dict[str, dict[str, Any]]]:
    """The islands, and per strategy its rounds of member groups and round times (the planner's cost model
    for the charged size), with what the plan says about each."""
    topology = load_topology(settings.topology)
    islands = tuple(topology.resolve_islands(list(settings.islands) or None))
    plan = plan_schedule(topology, list(islands), model_bytes=settings.model_bytes, epsilon=EPSILON, seed=seed,
                         aggregator=settings.aggregator)
    assert plan.cost_model is not None, "plan_schedule keeps the cost model it scored with"
    evaluator = Evaluator(plan.cost_model, EPSILON)
    schedules = {name: plan.baselines[name] for name in ("global", "ring", HOST_TREE, "hierarchical")}
    schedules["gossip"] = evaluator.evaluate(gossip_rounds(list(islands)))
    schedules["random"] = evaluator.evaluate(random_rounds(list(islands), seed))
    schedules["schedule"] = plan.best
    rounds: Rounds = {name: (tuple(tuple(tuple(c.members) for c in cliques if len(c.members) > 1)
                                   for cliques in schedule.rounds), tuple(schedule.round_times_ms))
                      for name, schedule in schedules.items()}
    fastest = min(EXACT_AVERAGES, key=lambda name: (sum(rounds[name][1]), name))
    rounds["sync"] = (rounds["global"][0], (sum(rounds[fastest][1]),))
    rounds["none"] = ((), ())
    described = {name: {"rounds": [list(map(list, r)) for r in groups], "round_times_ms": list(times),
                        **({"rho": schedules[name].rho} if name in schedules else {}),
                        **({"charged_as": fastest} if name == "sync" else {})}
                 for name, (groups, times) in rounds.items() if name in settings.strategies}
    return islands, rounds, described


def strategy_run(settings: StudySettings, seed: int, islands: Sequence[str], rounds: Rounds, name: str,
                 local_steps: int, outer: Outer) -> Run:
    """(config, strategy) of one training run with outer step `outer`, (learning rate, momentum); `none`
    depends on neither H nor the outer step, `sync` not on H.
    Members are put in island order: a clique's average does not depend on it (integer sums; only a partial
    sum past int32, parameters near the bound of 16, could), and strategies with equal cliques in another
    order (the ring's, the host tree's) then share one training run."""
    order = {island: i for i, island in enumerate(islands)}
    groups = tuple(tuple(tuple(sorted(members, key=order.__getitem__)) for members in r) for r in rounds[name][0])
    times = rounds[name][1]
    if name == "none":
        return settings.config(seed, 1, 1.0, 0.0), Strategy(name, (), (), 1)
    period = 1 if name == "sync" else local_steps
    return settings.config(seed, period, *outer), Strategy(name, groups, times, period)


def _calibrate(settings: StudySettings, islands: Sequence[str]) -> tuple[float, float, float]:
    """Seconds of one training step of every island, one evaluation and one sync of all, measured now."""
    from ..codec_average import clique_average
    from .text import TextIslands

    run = TextIslands(len(islands), settings.config(settings.tuning_seed, 1, 1.0, 0.0))
    run.step()
    started = time.perf_counter()
    for _ in range(3):
        run.step()
    step_s = (time.perf_counter() - started) / 3
    run.evaluate()
    started = time.perf_counter()
    run.evaluate()
    evaluation_s = time.perf_counter() - started
    started = time.perf_counter()
    vectors = run.vectors()
    average = clique_average(list(vectors), 16.0)
    for i in range(len(islands)):
        run.load(i, average)
    return step_s, evaluation_s, time.perf_counter() - started


def _say(text: str) -> None:
    print(f"train-study: {text}", file=sys.stderr, flush=True)


def _worker_start() -> None:
    import torch

    torch.set_num_threads(1)


class _InProcess:
    """The executor of one worker: runs each call in this process when it is submitted."""

    def submit(self, function: Callable[..., _Result], *args: Any) -> Future[_Result]:
        future: Future[_Result] = Future()
        future.set_result(function(*args))
        return future


@contextlib.contextmanager
def _executor(workers: int) -> Iterator[Executor | _InProcess]:
    if workers == 1:
        yield _InProcess()
        return
    # spawn: a fresh interpreter per worker, not a fork of one whose torch thread pools are already running.
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"),
                             initializer=_worker_start) as pool:
        yield pool


def makespan(phases: Iterable[Iterable[float]], workers: int, busy: Sequence[float] = ()) -> float:
    """Wall seconds of `phases` (each a list of run seconds) on `workers` processes, longest run first onto
    the first free process, each phase starting once the one before has ended; `busy`: seconds left of the
    runs under way when the first phase starts."""
    clock = sorted([*busy, *[0.0] * (workers - len(busy))])
    for phase in phases:
        for seconds in sorted(phase, reverse=True):
            clock[clock.index(min(clock))] += seconds
        clock = [max(clock)] * workers
    return max(clock)


class _Runner:
    """Trains each distinct run once, up to `workers` at a time, saying how far it is and how long is left."""

    def __init__(self, settings: StudySettings, islands: Sequence[str], executor: Executor | _InProcess, workers: int,
                 costs: tuple[float, ...]) -> None:
        self.settings, self.islands, self.executor, self.workers = settings, islands, executor, workers
        self.step_s, self.evaluation_s, self.sync_s = costs
        self.points: dict[Inputs, Curve] = {}
        self.measured_s = self.estimated_s = 0.0
        self.started = time.perf_counter()

    def run_seconds(self, strategy: Strategy) -> float:
        steps = self.settings.steps
        evaluations = steps // EVALUATE_EVERY["text"] + (steps % EVALUATE_EVERY["text"] != 0)
        syncs = steps // strategy.period if strategy.groups else 0
        return steps * self.step_s + evaluations * self.evaluation_s + syncs * self.sync_s

    def train(self, phase: dict[Inputs, Run], later: Sequence[float] = ()) -> None:
        """Trains the runs of `phase` ({training inputs: (config, strategy)}) not trained yet, longest first;
        `later`: the seconds of each run planned after this phase, for the time left."""
        pending = sorted(((inputs, run) for inputs, run in phase.items() if inputs not in self.points),
                         key=lambda item: -self.run_seconds(item[1][1]))
        running: dict[Future[Curve], tuple[Inputs, Run, float]] = {}
        while pending or running:
            while pending and len(running) < self.workers:
                inputs, run = pending.pop(0)
                started = time.perf_counter()
                running[self.executor.submit(_simulate_cached, *inputs)] = (inputs, run, started)
            finished, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in finished:
                inputs, (config, strategy), started = running.pop(future)
                self.points[inputs] = future.result()
                now = time.perf_counter()
                self.measured_s += now - started
                self.estimated_s += self.run_seconds(strategy)
                # The estimate scaled by how long the runs done so far took against theirs.
                scale = self.measured_s / self.estimated_s
                busy = [max(0.0, self.run_seconds(s) * scale - (now - t)) for _, (_, s), t in running.values()]
                left = makespan([[self.run_seconds(s) * scale for _, (_, s) in pending], [s * scale for s in later]],
                                self.workers, busy)
                total = len(self.points) + len(running) + len(pending) + len(later)
                outer = outer_label((config.outer_lr, config.outer_momentum))
                _say(f"training run {len(self.points)} of {total} done (seed {config.seed}, {strategy.name}, "
                     f"H {strategy.period}, {outer}); {(now - self.started) / 60:.1f} min so far, about "
                     f"{left / 60:.0f} min left")

    def curve(self, config: TrainConfig, strategy: Strategy) -> Curve:
        return run_strategy(config, self.islands, strategy,
                            self.points[training_inputs(config, self.islands, strategy)])


def default_workers() -> int:
    return os.cpu_count() or 1


def run_text_study(settings: StudySettings, estimate_only: bool = False,
                   workers: int | None = None) -> dict[str, Any] | None:
    """The study as a JSON-ready dict (see the module's docstring for what it does in which order), training
    on `workers` processes (default: one per core; never more than there are runs); with `estimate_only`,
    None once the estimate is said."""
    started = time.perf_counter()
    plans = {seed: plan_seed(settings, seed) for seed in (settings.tuning_seed, *settings.seeds)}
    _say(f"planned {len(plans)} seeds in {time.perf_counter() - started:.0f} s")
    islands = plans[settings.tuning_seed][0]
    hs, grid = settings.local_steps, settings.outer_steps

    def phase(runs: Iterable[tuple[int, str, int, Outer]]) -> dict[Inputs, Run]:
        """{training inputs: (config, strategy)} of (seed, strategy name, H, outer step) runs, the first of
        equal inputs kept."""
        planned: dict[Inputs, Run] = {}
        for seed, name, h, outer in runs:
            config, strategy = strategy_run(settings, seed, islands, plans[seed][1], name, h, outer)
            planned.setdefault(training_inputs(config, islands, strategy), (config, strategy))
        return planned

    # First the tuning runs, and `none` on the evaluation seeds (it has no outer step to wait for); then the
    # evaluation runs, planned here with the grid's first outer step standing in for the chosen one (strategies
    # that train alike choose alike, so the count holds).
    first = phase([*((settings.tuning_seed, name, h, outer) for name in settings.tuned for h in hs for outer in grid),
                   *((seed, "none", h, grid[0]) for seed in settings.seeds for h in hs)])
    second = {inputs: run for inputs, run in phase((seed, name, h, grid[0]) for seed in settings.seeds
                                                   for name in settings.strategies for h in hs).items()
              if inputs not in first}
    workers = min(workers or default_workers(), len(first) + len(second))
    with _executor(workers) as executor:
        # Measured in every worker at once: the cores' speed when all of them train.
        measured = [executor.submit(_calibrate, settings, islands) for _ in range(workers)]
        costs = tuple(sum(values) / workers for values in zip(*(future.result() for future in measured)))
        runner = _Runner(settings, islands, executor, workers, costs)
        estimate = makespan([[runner.run_seconds(s) for _, s in first.values()],
                             [runner.run_seconds(s) for _, s in second.values()]], workers)
        _say(f"{len(first) + len(second)} training runs of {settings.steps} steps on {workers} worker "
             f"process{'es' if workers > 1 else ''}, estimated {estimate / 60:.0f} min (measured now, "
             f"{workers} at once: a step of every island {costs[0] * 1e3:.0f} ms, an evaluation "
             f"{costs[1] * 1e3:.0f} ms, a sync of all {costs[2] * 1e3:.0f} ms)")
        if estimate_only:
            return None
        runner.train(first, later=[runner.run_seconds(s) for _, s in second.values()])

        def final_loss(seed: int, name: str, h: int, outer: Outer) -> float:
            config, strategy = strategy_run(settings, seed, islands, plans[seed][1], name, h, outer)
            loss: float = runner.curve(config, strategy)[-1]["loss"]
            return loss

        tuning = {name: {str(h): {outer_label(outer): final_loss(settings.tuning_seed, name, h, outer)
                                  for outer in grid} for h in hs} for name in settings.tuned}
        chosen = {name: {h: min(grid, key=lambda outer: tuning[name][str(h)][outer_label(outer)]) for h in hs}
                  for name in settings.tuned}

        def outer_of(name: str, h: int) -> Outer:
            return chosen[name][h] if name in chosen else (1.0, 0.0)

        runner.train(phase((seed, name, h, outer_of(name, h)) for seed in settings.seeds
                           for name in settings.strategies for h in hs))

    runs: dict[int, list[dict[str, Any]]] = {}
    for seed in settings.seeds:
        _, rounds, described = plans[seed]
        for h in hs:
            curves: dict[str, Curve] = {}
            strategies: dict[str, dict[str, Any]] = {}
            for name in settings.strategies:
                config, strategy = strategy_run(settings, seed, islands, rounds, name, h, outer_of(name, h))
                curves[name] = runner.curve(config, strategy)
                strategies[name] = {**described[name], "period": strategy.period, "outer_lr": config.outer_lr,
                                    "outer_momentum": config.outer_momentum, "local_step_objective_ms": None}
            runs.setdefault(h, []).append({"seed": seed, "curves": curves, "strategies": strategies})

    target = choose_target([run["curves"]["none"] for run in runs[hs[0]]],
                           [run["curves"]["sync"] for run in runs[hs[0]]])
    cells = [_cell(settings, h, runs[h], target["loss"]) for h in hs]
    correct_verdicts(cells)
    from .text import island_families

    return {"settings": {**asdict(settings), "islands": list(islands)},
            "parameters": _parameters(settings), "corpus": text_corpus(len(islands)),
            "island_families": {str(seed): island_families(len(islands), seed)
                                for seed in (settings.tuning_seed, *settings.seeds)},
            "plans": {str(seed): plans[seed][2] for seed in (settings.tuning_seed, *settings.seeds)},
            "tuning": {"seed": settings.tuning_seed, "final_loss": tuning,
                       "chosen": {name: {str(h): outer_label(outer) for h, outer in by_h.items()}
                                  for name, by_h in chosen.items()}},
            "target": target, "cells": cells}


def outer_label(outer: Outer) -> str:
    """"avg" for plain averaging, else "nesterov LR" (the grid's momentum)."""
    lr, momentum = outer
    return "avg" if (lr, momentum) == (1.0, 0.0) else f"nesterov {lr:g}" + ("" if momentum == 0.9 else f"/{momentum:g}")


def _parameters(settings: StudySettings) -> int:
    from .text import parameter_count

    return parameter_count(settings.text_width, settings.text_layers, settings.text_context)


def choose_target(none_curves: Sequence[Curve], sync_curves: Sequence[Curve], margin: float = MARGIN) -> dict[str, Any]:
    """The target loss (module docstring, step 4) from `none`'s and `sync`'s curves of the evaluation seeds."""
    alone = [min(point["best_island_loss"] for point in curve) for curve in none_curves]
    loss = math.floor(round((min(alone) - margin) * 100, 6)) / 100
    sync_final = [curve[-1]["loss"] for curve in sync_curves]
    return {"loss": loss, "rule": f"the highest multiple of 0.01 at least {margin:g} below the best loss any single "
                                  "island reaches alone",
            "best_single_island_alone": alone, "none_final_mean": [curve[-1]["loss"] for curve in none_curves],
            "sync_final_mean": sync_final,
            "sync_reaches": sum(time_to_target_ms(curve, loss, "loss") is not None for curve in sync_curves),
            "seeds": len(sync_curves)}


def _cell(settings: StudySettings, h: int, runs: Sequence[dict[str, Any]], target: float) -> Cell:
    seeds = [run["seed"] for run in runs]
    cell: Cell = {"workload": "text", "local_steps": h, "aggregator": settings.aggregator, "alpha": None,
            "model_bytes": settings.model_bytes, "step_ms": settings.step_ms, "seeds": seeds,
            "title": (f"stdlib module families, H = {h}, charged {settings.model_bytes / 1e6:g} MB, "
                      f"{settings.aggregator} aggregator, {settings.step_ms:g} ms per step, outer step per strategy, "
                      f"{len(seeds)} seeds"),
            "strategies": {name: {key: value for key, value in runs[0]["strategies"][name].items()
                                  if key in ("period", "outer_lr", "outer_momentum")} for name in settings.strategies},
            "rounds_per_seed": {name: [run["strategies"][name]["rounds"] for run in runs]
                                for name in settings.strategies},
            "summary": summarize(runs, target, "loss"), "mean_curves": _mean_curves(runs, "loss")}
    cell["schedule_vs"] = {other: compare(runs, "schedule", other, target, "loss")
                           for other in settings.strategies if other != "schedule"}
    for name in cell["summary"]:
        cell["summary"][name].pop("local_step_objective_ms_per_seed")
    return cell


# ---------------------------------------------------------------------------------------------------
# Reports

def format_text_study(study: dict[str, Any]) -> str:
    s, target = study["settings"], study["target"]
    lines = [f"Text workload study: a byte-level transformer of {study['parameters']:,} parameters per island "
             f"(width {s['text_width']}, {s['text_layers']} blocks, {s['text_heads']} heads, context "
             f"{s['text_context']} bytes, {s['text_batch']} windows per step, AdamW lr {s['text_learning_rate']:g}), "
             f"{s['steps']} steps, {len(s['islands'])} islands of {s['topology']}, communication charged for "
             f"{s['model_bytes'] / 1e6:g} MB, {s['aggregator']} aggregator, {s['step_ms']:g} ms per step. Corpus: "
             f"{len(study['corpus']['files'])} files of the standard library at {study['corpus']['root']} (list "
             f"SHA-256 {study['corpus']['list_sha256']}). Outer step per strategy and H from the grid "
             f"{', '.join(outer_label(o) for o in s['outer_steps'])} (Nesterov momentum 0.9) on seed "
             f"{s['tuning_seed']}; evaluation seeds {', '.join(map(str, s['seeds']))}.", "",
             "**Outer step chosen** (final mean island validation loss on the tuning seed; chosen in bold; sync "
             "averages every step whatever the H):",
             "", "| strategy | " + " | ".join(f"H = {h}" for h in s["local_steps"]) + " |",
             "| --- | " + " | ".join("---" for _ in s["local_steps"]) + " |"]
    tuning = study["tuning"]
    for name, by_h in tuning["final_loss"].items():
        row = []
        for h in s["local_steps"]:
            pick = tuning["chosen"][name][str(h)]
            row.append(", ".join(f"**{lr}: {loss:.3f}**" if lr == pick else f"{lr}: {loss:.3f}"
                                 for lr, loss in by_h[str(h)].items()))
        lines.append(f"| {name} | " + " | ".join(row) + " |")
    lines += ["", f"**Target: validation loss {target['loss']:g}** ({target['rule']}). Per evaluation seed:", "",
              "| seed | none: best single island, any evaluation | none: final mean island | sync: final mean "
              "island |", "| ---: | ---: | ---: | ---: |"]
    for seed, alone, none, sync in zip(s["seeds"], target["best_single_island_alone"], target["none_final_mean"],
                                       target["sync_final_mean"]):
        lines.append(f"| {seed} | {alone:.3f} | {none:.3f} | {sync:.3f} |")
    cells = study["cells"]
    comparisons = sum(len(cell["schedule_vs"]) for cell in cells)
    lines += ["", f"sync reaches the target on {target['sync_reaches']} of {target['seeds']} seeds.", "",
              "**Verdicts: the planner's rotating cliques (`schedule`) against each strategy** (difference "
              "schedule − strategy [95 % CI], Holm-corrected p). "
              + verdict_rule(len(s["seeds"]), comparisons, text=True), ""]
    others = [name for name in cells[0]["schedule_vs"]]
    lines += ["| H | schedule's rounds | " + " | ".join(others) + " |",
              "| ---: | --- | " + " | ".join("---" for _ in others) + " |"]
    for cell in cells:
        kinds = sorted({_kind(rounds) for rounds in cell["rounds_per_seed"]["schedule"]})
        verdicts = [versus_entry(cell, name) for name in cell["schedule_vs"]]
        lines.append(f"| {cell['local_steps']} | {'; '.join(kinds)} | " + " | ".join(verdicts) + " |")
    for cell in cells:
        lines += ["", f"**{cell['title']}**", "",
                  f"| strategy | H | outer step | comm. (s) | total (s) | time to loss {target['loss']:g} (s) | "
                  "averaged model: time to target (s) | mean island val. loss | averaged model val. loss | "
                  f"{VERSUS_HEADER} |", "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | "
                  + VERSUS_RULE + " |"]
        for name, summary in cell["summary"].items():
            strategy = cell["strategies"][name]
            outer = "–" if name == "none" else outer_label((strategy["outer_lr"], strategy["outer_momentum"]))
            lines.append(f"| {name} | {strategy['period']} | {outer} | {_pm(summary['communication_ms'], 1e-3)} | "
                         f"{_pm(summary['time_ms'], 1e-3)} | {_pm(summary['time_to_target_ms'], 1e-3)} | "
                         f"{_pm(summary['averaged_time_to_target_ms'], 1e-3)} | {_pm(summary['loss'], digits=3)} | "
                         f"{_pm(summary['averaged_loss'], digits=3)} | {versus_columns(cell, name)} |")
    return "\n".join(lines) + "\n"


def _kind(rounds: Sequence[Sequence[Sequence[str]]]) -> str:
    if len(rounds) == 1 and len(rounds[0]) == 1:
        return "global clique"
    return f"{len(rounds)} round{'s' if len(rounds) != 1 else ''} of {'+'.join(str(len(c)) for c in rounds[0])}"


def plot_file_name(cell: Cell) -> str:
    return f"text-h{cell['local_steps']}.png"


def study_json(study: dict[str, Any]) -> str:
    cells = [{key: value for key, value in cell.items() if key != "mean_curves"} for cell in study["cells"]]
    return json.dumps({**study, "cells": cells}, separators=(",", ":"))


def write_text_study(study: dict[str, Any], out_dir: pathlib.Path) -> list[pathlib.Path]:
    """study.json, study.md and a plot per H into `out_dir`, all or none; returns their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    texts = {"study.json": study_json(study) + "\n", "study.md": format_text_study(study)}
    written = [out_dir / name for name in [*texts, *map(plot_file_name, study["cells"])]]
    with contextlib.ExitStack() as outputs:
        temporaries = [outputs.enter_context(atomic_output(path)) for path in written]
        for temporary, text in zip(temporaries, texts.values()):
            pathlib.Path(temporary).write_text(text)
        for temporary, cell in zip(temporaries[len(texts):], study["cells"], strict=True):
            plot_cell(cell, study["target"]["loss"], temporary)
    return written


def _outer(text: str) -> Outer:
    return (1.0, 0.0) if text == "avg" else (float(text.removeprefix("nesterov").strip()), 0.9)


def _numbers(text: str, parse: Callable[[str], _Result]) -> tuple[_Result, ...]:
    return tuple(parse(item) for item in text.split(",") if item.strip())


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m inwire.train.text_study", description=__doc__.split("\n")[0])
    defaults = StudySettings()
    parser.add_argument("--islands", default="", help="comma-separated cities (default: all of the topology)")
    parser.add_argument("--steps", type=int, default=defaults.steps)
    parser.add_argument("--local-steps", default=",".join(map(str, defaults.local_steps)), help="the H swept")
    parser.add_argument("--outer", default=",".join(outer_label(o) for o in defaults.outer_steps),
                        help="the outer grid: avg (plain averaging) and Nesterov learning rates (momentum 0.9)")
    parser.add_argument("--tuning-seed", type=int, default=defaults.tuning_seed)
    parser.add_argument("--seeds", default=",".join(map(str, defaults.seeds)), help="the evaluation seeds")
    parser.add_argument("--strategies", default=",".join(defaults.strategies))
    parser.add_argument("--model-mb", type=float, default=defaults.model_bytes / 1e6, help="charged size")
    parser.add_argument("--step-ms", type=float, default=defaults.step_ms, help="compute charged per local step")
    for name in ("text_width", "text_layers", "text_heads", "text_context", "text_batch"):
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, default=getattr(defaults, name))
    parser.add_argument("--out-dir", default="docs/training/text")
    parser.add_argument("--estimate", action="store_true", help="plan, measure a step, say how long it would take")
    parser.add_argument("--workers", type=int, default=default_workers(),
                        help="training processes at once, each on one torch thread (default: one per core); the "
                             "output does not depend on it")
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    try:
        settings = StudySettings(
            islands=_numbers(args.islands, str.strip), steps=args.steps,
            local_steps=_numbers(args.local_steps, int), outer_steps=_numbers(args.outer, _outer),
            tuning_seed=args.tuning_seed, seeds=_numbers(args.seeds, int),
            strategies=_numbers(args.strategies, str.strip), model_bytes=round(args.model_mb * 1e6),
            step_ms=args.step_ms, **{name: getattr(args, name) for name in
                                     ("text_width", "text_layers", "text_heads", "text_context", "text_batch")})
    except ValueError as error:
        parser.error(str(error))
    if args.workers < 1:
        parser.error(f"--workers must be at least 1, got {args.workers}")
    study = run_text_study(settings, estimate_only=args.estimate, workers=args.workers)
    if study is None:
        return 0
    written = write_text_study(study, pathlib.Path(args.out_dir))
    _say(f"wrote {', '.join(map(str, written))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
