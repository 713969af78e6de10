"""The study behind `inwire train`: islands learning, synchronized by strategies under one clock.

Islands are simulated in one process. Two workloads: `digits` (the quick cell), where each island holds its
own copy of a 64-h-10 MLP, trained by SGD on its own share of scikit-learn's digits (IID, or split over the
classes by a Dirichlet draw), scored by test accuracy; and `text` (`text.py`), a byte-level transformer per
island trained by AdamW on its own families of the standard library's sources, scored by validation loss.
Either way the copies are stacked so one batched step trains them all. A sync averages each clique's parameters with
`codec_average.clique_average`, which is bit for bit what the aggregator returns over UDP (tests compare
the two), and optionally feeds the average to an outer optimizer (`outer.py`).

Time is simulated and deterministic: every local step costs `step_ms` (a stated parameter, or derived from
the charged model's FLOPs and a device rate), and each sync the time of its round in the planner's cost
model for the charged model size. Wall clock is never read, so identical work costs identical time under
every strategy.

Strategies, all through the same simulator, same data, same initialization and batches per seed; the seed
also draws the random strategy's partitions and seeds the planner's search:
- `none`: never synchronize;
- `global`: one clique of every island every H steps (the planner's `global` baseline);
- `global-equal`: the global clique every H' steps, H' chosen so that its total communication time over
  the run matches the schedule's (the equal-budget control);
- `hierarchical`: the planner's two-level baseline (regions, then everyone);
- `ring`: the global average, charged as a ring all-reduce;
- `gossip`: one-peer exponential gossip: in round k each island pairs with the one 2^k positions away
  (hypercube pairing on a rotating order, so that with n not a power of two everyone gets partners);
- `random`: Moshpit-style random groups of about sqrt(n), a fresh partition every round;
- `schedule`: the planner's optimized rotating cliques for the charged model size (least time to
  epsilon-consensus counting communication only);
- `schedule-h`: the planner's pick under its local-step objective, with the study's H and step time:
  consensus progress per second of compute and communication.

Communication comes from the planner's cost model for the topology, the aggregator profile (`ideal`, or a
board's ports and core: `inwire.plan.aggregator.PROFILES`) and the charged size; the `objective` each
strategy is reported with is the planner's local-step objective for its own H and the study's step time.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
import math
import pathlib
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import plotstyle, progress
from ..codec_average import clique_average
from ..output import atomic_output
from ..plan.cost import CostModel
from ..plan.schedule_file import schedule_document
from ..plan.search import Evaluator, plan_schedule
from ..plan.topology import load_topology
from . import stats
from .outer import OuterOptimizer

if TYPE_CHECKING:
    import torch
    from matplotlib.figure import Figure

    from ..plan.cost import Schedule
    from .text import TextIslands

Curve = list[dict[str, Any]]
"""Training points in step order: step, syncs, the workload's scores and, once charged, the times."""
Cell = dict[str, Any]
"""One setting of a study over its seeds (`run_study`)."""
Study = dict[str, Any]
"""What `run_study` returns: config, cells, target."""
Stats = dict[str, Any]
"""mean, std, n (values that are not None) and of (all values), as `_stats` makes them."""

STRATEGIES = ("none", "global", "global-equal", "hierarchical", "ring", "gossip", "random", "schedule", "schedule-h")
BASELINE_OF = {"global": "global", "hierarchical": "hierarchical", "ring": "ring"}
WORKLOADS = ("digits", "text")
TARGET_ACCURACY = 0.85
TARGET_LOSS = 2.85
"""Validation loss (nats per byte) the text workload's time to target is measured to."""
EVALUATE_EVERY = {"digits": 2, "text": 20}
"""Steps between evaluations: time to target is resolved to this many steps under every strategy. A text
evaluation costs about seven training steps (the validation batch is larger than a training batch)."""
SCORE = {"digits": "accuracy", "text": "loss"}
"""The score time to target is measured on; the islands' exact mean model is scored as averaged_<score>."""
RANDOM_ROUNDS = 30
"""Moshpit-style random partitions drawn per plan; they repeat after that many rounds."""


@dataclass(frozen=True)
class TrainConfig:
    topology: str = "doublezero9"
    islands: tuple[str, ...] = ()
    """Cities that host an island; empty means every city of the topology."""
    steps: int = 300
    local_steps: int = 10
    """H: local steps between syncs."""
    batch: int = 32
    learning_rate: float = 0.2
    hidden: int = 32
    alpha: float | None = 0.3
    """Dirichlet concentration of the class split (small: each island sees few classes); None: IID."""
    seed: int = 0
    epsilon: float = 1e-3
    strategies: tuple[str, ...] = STRATEGIES
    model_bytes: int = 0
    """Size the communication is planned and charged for; 0 means the MLP's own size."""
    step_ms: float = 100.0
    """Compute time charged per local step."""
    aggregator: str = "ideal"
    """Aggregator profile the planner charges rounds with (a name of inwire.plan.aggregator.PROFILES)."""
    outer_lr: float = 1.0
    outer_momentum: float = 0.0
    bound: float = 16.0
    target: float = TARGET_ACCURACY
    workload: str = "digits"
    target_loss: float = TARGET_LOSS
    """The text workload's target: mean island validation loss."""
    text_width: int = 128
    text_layers: int = 5
    text_heads: int = 4
    text_context: int = 64
    """Bytes per training window (and per validation window)."""
    text_batch: int = 4
    """Windows per island and step."""
    text_learning_rate: float = 2e-3
    text_weight_decay: float = 0.1
    text_shuffle_families: bool = False
    """Whether the seed also permutes which island trains on which module family (text.island_families)."""

    def __post_init__(self) -> None:
        if self.workload not in WORKLOADS:
            raise ValueError(f"workload must be one of {', '.join(WORKLOADS)}, got {self.workload!r}")
        for name in ("steps", "local_steps", "batch", "hidden", "text_width", "text_layers", "text_heads",
                     "text_context", "text_batch"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.model_bytes < 0:
            raise ValueError(f"model_bytes must not be negative, got {self.model_bytes}")
        if self.learning_rate <= 0 or (self.alpha is not None and self.alpha <= 0):
            raise ValueError("learning_rate and alpha must be positive")
        if not self.step_ms >= 0:
            raise ValueError(f"step_ms must not be negative, got {self.step_ms}")
        if not 0 < self.target <= 1:
            raise ValueError(f"target accuracy must be in (0, 1], got {self.target}")
        if not 0 < self.target_loss < math.inf or not self.text_learning_rate > 0 or not self.text_weight_decay >= 0:
            raise ValueError("the target loss and the text learning rate must be positive, the weight decay not "
                             "negative")
        if self.text_width % self.text_heads:
            raise ValueError(f"the text width ({self.text_width}) must be a multiple of its heads ({self.text_heads})")
        OuterOptimizer(self.outer_lr, self.outer_momentum)
        unknown = set(self.strategies) - set(STRATEGIES)
        if unknown or not self.strategies:
            raise ValueError(f"strategies must be among {', '.join(STRATEGIES)}, got {', '.join(self.strategies)}")

    @property
    def outer(self) -> OuterOptimizer:
        return OuterOptimizer(self.outer_lr, self.outer_momentum)

    @property
    def score_target(self) -> float:
        return self.target_loss if self.workload == "text" else self.target


def parameter_count(hidden: int) -> int:
    return 64 * hidden + hidden + hidden * 10 + 10


def workload_parameters(config: TrainConfig) -> int:
    """Parameters of one island's model."""
    if config.workload == "text":
        from .text import parameter_count as text_parameters

        return text_parameters(config.text_width, config.text_layers, config.text_context)
    return parameter_count(config.hidden)


def step_ms_from_flops(model_bytes: float, samples: int, device_tflops: float) -> float:
    """Compute time of one step of a dense model of `model_bytes` (fp32) on `samples` samples: forward and
    backward take about 6 FLOPs per parameter and sample, at `device_tflops` sustained."""
    if model_bytes <= 0 or samples < 1 or device_tflops <= 0:
        raise ValueError("model size, samples and device rate must be positive")
    return 1e3 * 6 * (model_bytes / 4) * samples / (device_tflops * 1e12)


# ---------------------------------------------------------------------------------------------------
# Strategies: rounds of member groups and what each round costs

@dataclass(frozen=True)
class Strategy:
    name: str
    groups: tuple[tuple[tuple[Any, ...], ...], ...]
    """Rounds, each a tuple of member tuples (cliques of one are left out): island names, or their indices in
    `_simulate_cached`."""
    round_times_ms: tuple[float, ...]
    period: int
    """Local steps between syncs."""
    rho: float = 0.0
    detail: dict[str, Any] = field(default_factory=dict)

    def communication_ms(self, syncs: int) -> float:
        """Time of the first `syncs` rounds: whole periods of the schedule, then the rounds left."""
        if not self.groups or not syncs:
            return 0.0
        whole, left = divmod(syncs, len(self.round_times_ms))
        return whole * sum(self.round_times_ms) + sum(self.round_times_ms[:left])


def gossip_rounds(islands: Sequence[str]) -> list[list[tuple[str, str]]]:
    """One-peer exponential pairing: round (s, k) pairs positions p and p XOR 2^k of the order rotated by s."""
    n = len(islands)
    levels = max(1, math.ceil(math.log2(n)))
    rounds: list[list[tuple[str, str]]] = []
    for shift in range(n):
        order = [islands[(p + shift) % n] for p in range(n)]
        for level in range(levels):
            pairs = [(order[p], order[p ^ (1 << level)]) for p in range(n) if p < p ^ (1 << level) < n]
            rounds.append(pairs)
    return rounds


def random_rounds(islands: Sequence[str], seed: int, count: int = RANDOM_ROUNDS) -> list[list[list[str]]]:
    """Moshpit-style: a fresh random partition into groups of about sqrt(n) every round."""
    rng = np.random.default_rng(seed)
    n, size = len(islands), math.ceil(math.sqrt(len(islands)))
    rounds: list[list[list[str]]] = []
    for _ in range(count):
        order = [islands[i] for i in rng.permutation(n)]
        rounds.append([order[i:i + size] for i in range(0, n, size)])
    return rounds


# A study plans every seed of every charged setting once; cells that differ in the data split or the outer
# step come back to the same plans.
@functools.lru_cache(maxsize=1024)
def plan_strategies(topology: str, islands: tuple[str, ...], model_bytes: int, epsilon: float, steps: int, period: int,
                    step_ms: float, aggregator: str, seed: int
                    ) -> tuple[tuple[str, ...], dict[str, Strategy], dict[str, Any]]:
    """Every strategy's rounds and round times in the planner's cost model, plus the plans' summaries. The
    seed drives the planner's search and the random strategy's partitions, as it drives the training."""
    topology_object = load_topology(topology)
    chosen = tuple(islands) or tuple(topology_object.cities)
    plan = plan_schedule(topology_object, list(chosen), model_bytes=model_bytes, epsilon=epsilon, seed=seed,
                         aggregator=aggregator)
    local = plan_schedule(topology_object, list(chosen), model_bytes=model_bytes, epsilon=epsilon, seed=seed,
                          aggregator=aggregator, local_steps=period, step_ms=step_ms)
    model = CostModel(topology_object, chosen, model_bytes, aggregator=aggregator)
    evaluator = Evaluator(model, epsilon)
    schedules = {name: plan.baselines[baseline] for name, baseline in BASELINE_OF.items()}
    schedules["schedule"] = plan.best
    schedules["schedule-h"] = local.best
    schedules["gossip"] = evaluator.evaluate(gossip_rounds(list(chosen)))
    schedules["random"] = evaluator.evaluate(random_rounds(list(chosen), seed))

    def of(name: str, schedule: Schedule, every: int = period) -> Strategy:
        groups = tuple(tuple(tuple(c.members) for c in cliques if len(c.members) > 1) for cliques in schedule.rounds)
        return Strategy(name, groups, tuple(schedule.round_times_ms), every, schedule.rho)

    strategies = {"none": Strategy("none", (), (), period)}
    strategies.update({name: of(name, schedule) for name, schedule in schedules.items()})
    # The equal-budget control: the global clique, synced just often enough to spend the schedule's time.
    budget = strategies["schedule"].communication_ms(steps // period)
    global_ms = strategies["global"].round_times_ms[0]
    equal = min(range(1, steps + 1), key=lambda every: (abs((steps // every) * global_ms - budget), every))
    strategies["global-equal"] = Strategy("global-equal", strategies["global"].groups, (global_ms,), equal, 0.0,
                                          {"matches": "schedule", "budget_ms": budget,
                                           "spent_ms": (steps // equal) * global_ms})
    schedules["global-equal"] = schedules["global"]
    for name, strategy in strategies.items():
        strategy.detail["local_step_objective_ms"] = (
            None if name == "none" else
            _finite(Evaluator(model, epsilon, strategy.period, step_ms).evaluate_cliques(
                schedules[name].rounds).time_to_epsilon_ms))
    summary = {key: schedule_document(plan)[key] for key in ("model_bytes", "period_ms", "rho",
                                                              "time_to_epsilon_ms", "method", "aggregator")}
    summary["local_step_objective"] = {key: schedule_document(local)[key]
                                       for key in ("local_steps", "step_ms", "period_ms", "time_to_epsilon_ms")}
    return chosen, strategies, summary


def _finite(value: float | None) -> float | None:
    return None if value is None or math.isinf(value) else value


# ---------------------------------------------------------------------------------------------------
# Data and the simulated islands

@functools.lru_cache(maxsize=64)
def split_data(alpha: float | None, seed: int, islands_count: int
               ) -> tuple[list[tuple[np.ndarray, np.ndarray]], tuple[np.ndarray, np.ndarray]]:
    """Standardized digits: a shared test set, and a training share per island (IID when alpha is None)."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(digits.target))
    features = (digits.data[order] / 16.0).astype(np.float32)
    labels = digits.target[order].astype(np.int64)
    test = len(labels) // 5
    train_x, train_y = features[test:], labels[test:]
    if alpha is None:
        assignment = rng.integers(islands_count, size=len(train_y))
    else:
        shares = rng.dirichlet([alpha] * islands_count, size=10)
        assignment = np.empty(len(train_y), dtype=np.int64)
        for digit in range(10):
            where = np.flatnonzero(train_y == digit)
            assignment[where] = rng.choice(islands_count, size=len(where), p=shares[digit])
    shards = [(train_x[assignment == i], train_y[assignment == i]) for i in range(islands_count)]
    return shards, (features[:test], labels[:test])


class Islands:
    """n copies of the MLP stacked on a leading axis; parameters laid out as nn.Sequential(Linear, ReLU,
    Linear) flattens them, so one island's vector is what `CliqueAverager` would send."""

    def __init__(self, n: int, hidden: int, seed: int) -> None:
        import torch

        torch.manual_seed(seed)
        first, second = torch.nn.Linear(64, hidden), torch.nn.Linear(hidden, 10)
        self.params = [p.detach().unsqueeze(0).repeat(n, *[1] * p.dim()).contiguous().requires_grad_()
                       for p in (first.weight, first.bias, second.weight, second.bias)]
        self.n = n

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        import torch

        w1, b1, w2, b2 = self.params
        hidden = torch.relu(torch.baddbmm(b1.unsqueeze(1), x, w1.transpose(1, 2)))
        return torch.baddbmm(b2.unsqueeze(1), hidden, w2.transpose(1, 2))

    def vectors(self) -> np.ndarray:
        """(n, parameters) float32 array."""
        return np.concatenate([p.detach().reshape(self.n, -1).numpy() for p in self.params], axis=1)

    def load(self, index: int, vector: np.ndarray) -> None:
        import torch

        offset = 0
        with torch.no_grad():
            for p in self.params:
                size = p[index].numel()
                p[index].copy_(torch.from_numpy(vector[offset:offset + size]).reshape(p[index].shape))
                offset += size


def _evaluate(islands: Islands, test_x: torch.Tensor, test_y: torch.Tensor) -> tuple[float, float, float]:
    """Mean island test loss and accuracy, and the accuracy of the islands' exact mean model."""
    import torch

    with torch.no_grad():
        x = test_x.unsqueeze(0).expand(islands.n, -1, -1)
        logits = islands.logits(x)
        losses = torch.nn.functional.cross_entropy(logits.transpose(1, 2), test_y.expand(islands.n, -1),
                                                   reduction="none").mean(1)
        accuracy = (logits.argmax(2) == test_y).float().mean(1)
        mean_params = [p.mean(0, keepdim=True) for p in islands.params]
        hidden = torch.relu(torch.baddbmm(mean_params[1].unsqueeze(1), test_x.unsqueeze(0),
                                          mean_params[0].transpose(1, 2)))
        averaged = torch.baddbmm(mean_params[3].unsqueeze(1), hidden, mean_params[2].transpose(1, 2))
        averaged_accuracy = float((averaged[0].argmax(1) == test_y).float().mean())
    return float(losses.mean()), float(accuracy.mean()), averaged_accuracy


class DigitsRun:
    """The digits workload's islands with their SGD optimizer and batches: one `step` trains them all."""

    def __init__(self, n: int, config: TrainConfig | _SimulationKey) -> None:
        import torch

        shards, (test_x, test_y) = split_data(config.alpha, config.seed, n)
        self.test_x, self.test_y = torch.from_numpy(test_x), torch.from_numpy(test_y)
        self.model = Islands(n, config.hidden, config.seed)
        self.optimizer = torch.optim.SGD(self.model.params, lr=config.learning_rate)
        self.generators = [torch.Generator().manual_seed(config.seed * 1000 + i) for i in range(n)]
        self.shard_x = [torch.from_numpy(x) for x, _ in shards]
        self.shard_y = [torch.from_numpy(y) for _, y in shards]
        self.has_data = torch.tensor([len(y) > 0 for y in self.shard_y], dtype=torch.float32)
        self.batch = config.batch
        self.vectors, self.load = self.model.vectors, self.model.load

    def step(self) -> None:
        import torch

        picks = [torch.randint(max(1, len(y)), (self.batch,), generator=g)
                 for y, g in zip(self.shard_y, self.generators)]
        x = torch.stack([sx[p] if len(sx) else torch.zeros(self.batch, 64) for sx, p in zip(self.shard_x, picks)])
        y = torch.stack([sy[p] if len(sy) else torch.zeros(self.batch, dtype=torch.int64)
                         for sy, p in zip(self.shard_y, picks)])
        losses = torch.nn.functional.cross_entropy(self.model.logits(x).transpose(1, 2), y, reduction="none").mean(1)
        self.optimizer.zero_grad()
        # Summing per-island mean losses gives each island exactly its own gradient; islands without data idle.
        (losses * self.has_data).sum().backward()
        self.optimizer.step()

    def evaluate(self) -> dict[str, float]:
        loss, accuracy, averaged = _evaluate(self.model, self.test_x, self.test_y)
        return {"loss": loss, "accuracy": accuracy, "averaged_accuracy": averaged}


def simulate(config: TrainConfig | _SimulationKey, strategy: Strategy, islands_count: int) -> Curve:
    """Train under one strategy; returns the points every EVALUATE_EVERY steps: step, syncs and the
    workload's scores (digits: test loss and accuracies; text: validation losses)."""
    import torch

    torch.set_num_threads(1)
    run: TextIslands | DigitsRun
    if config.workload == "text":
        from .text import TextIslands

        run = TextIslands(islands_count, config)
    else:
        run = DigitsRun(islands_count, config)
    every = EVALUATE_EVERY[config.workload]
    outer = config.outer
    anchors = list(run.vectors())
    buffers: list[np.ndarray | None] = [None] * islands_count
    syncs = 0
    points: Curve = []
    for step in range(1, config.steps + 1):
        run.step()
        if strategy.groups and step % strategy.period == 0:
            vectors = run.vectors()
            for members in strategy.groups[syncs % len(strategy.groups)]:
                average = clique_average([vectors[i] for i in members], config.bound)
                for i in members:
                    updated, buffers[i] = outer.step(anchors[i], buffers[i], average)
                    anchors[i] = updated
                    run.load(i, updated)
            syncs += 1
        if step % every == 0 or step == config.steps:
            points.append({"step": step, "syncs": syncs, **run.evaluate()})
    return points


@functools.lru_cache(maxsize=4096)
def _simulate_cached(config: _SimulationKey, groups_by_index: tuple[tuple[tuple[int, ...], ...], ...],
                     period: int) -> Curve:
    """Training does not depend on what a round costs: strategies with the same rounds and period (global
    and ring, or the same schedule charged for another model size) share one run."""
    strategy = Strategy("cached", groups_by_index, (), period)
    return simulate(config, strategy, config.islands_count)


@dataclass(frozen=True)
class _SimulationKey:
    """What a training run depends on (hashable, so runs are cached across strategies and model sizes)."""
    alpha: float | None
    seed: int
    steps: int
    local_steps: int
    batch: int
    learning_rate: float
    hidden: int
    outer_lr: float
    outer_momentum: float
    bound: float
    workload: str
    text_width: int
    text_layers: int
    text_heads: int
    text_context: int
    text_batch: int
    text_learning_rate: float
    text_weight_decay: float
    text_shuffle_families: bool
    islands_count: int

    @property
    def outer(self) -> OuterOptimizer:
        return OuterOptimizer(self.outer_lr, self.outer_momentum)


def training_inputs(config: TrainConfig, islands: Sequence[str], strategy: Strategy
                    ) -> tuple[_SimulationKey, tuple[tuple[tuple[int, ...], ...], ...], int]:
    """The arguments of `_simulate_cached` for one strategy: all its training depends on (hashable; runs with
    equal inputs train alike, whatever their rounds cost)."""
    index = {name: i for i, name in enumerate(islands)}
    groups = tuple(tuple(tuple(index[m] for m in members) for members in round_) for round_ in strategy.groups)
    key = _SimulationKey(**{f.name: getattr(config, f.name) for f in fields(_SimulationKey)
                            if f.name != "islands_count"}, islands_count=len(islands))
    return key, groups, strategy.period


def run_strategy(config: TrainConfig, islands: Sequence[str], strategy: Strategy, points: Curve | None = None) -> Curve:
    """The curve of one strategy: training points (`points`, else trained now) with the time each is reached."""
    if points is None:
        points = _simulate_cached(*training_inputs(config, islands, strategy))
    return [{**point, "compute_ms": point["step"] * config.step_ms,
             "communication_ms": strategy.communication_ms(point["syncs"]),
             "time_ms": point["step"] * config.step_ms + strategy.communication_ms(point["syncs"])}
            for point in points]


def run_training(config: TrainConfig) -> dict[str, Any]:
    """One seed, every strategy asked for: curves, plus what each strategy is and costs."""
    islands, strategies, plan = plan_strategies(config.topology, tuple(config.islands), charged_bytes(config),
                                                config.epsilon, config.steps, config.local_steps, config.step_ms,
                                                config.aggregator, config.seed)
    curves = {name: run_strategy(config, islands, strategies[name]) for name in config.strategies}
    described: dict[str, dict[str, Any]] = {}
    for name in config.strategies:
        strategy = strategies[name]
        described[name] = {"period": strategy.period, "rounds": [list(map(list, r)) for r in strategy.groups],
                           "round_times_ms": list(strategy.round_times_ms), "rho": strategy.rho, **strategy.detail}
    report: dict[str, Any] = {"config": {**asdict(config), "islands": list(islands)},
                              "parameters": workload_parameters(config), "charged_bytes": charged_bytes(config),
                              "plan": plan, "strategies": described, "curves": curves}
    if config.workload == "text":
        report["corpus"] = text_corpus(len(islands))
    return report


def text_corpus(islands_count: int) -> dict[str, Any]:
    """The text workload's files with their hashes, and which families each island trains on."""
    from .text import island_families, load_corpus

    return {**load_corpus().describe(), "island_families": island_families(islands_count)}


def charged_bytes(config: TrainConfig) -> int:
    return config.model_bytes or 4 * workload_parameters(config)


def time_to_accuracy_ms(curve: Curve, target: float = TARGET_ACCURACY, key: str = "accuracy") -> float | None:
    """Simulated time at which `key` first reaches `target`, or None if it never does."""
    return next((point["time_ms"] for point in curve if point[key] >= target), None)


def time_to_target_ms(curve: Curve, target: float, key: str) -> float | None:
    """Simulated time at which `key` first reaches `target`: a loss from above, anything else from below."""
    if key.endswith("loss"):
        return next((point["time_ms"] for point in curve if point[key] <= target), None)
    return time_to_accuracy_ms(curve, target, key)


# ---------------------------------------------------------------------------------------------------
# The study: seeds, data splits, model sizes, outer optimizers

def _stats(values: Sequence[float | None]) -> Stats:
    """Mean, sample standard deviation and count of the values that are not None."""
    finite = [v for v in values if v is not None]
    if not finite:
        return {"mean": None, "std": None, "n": 0, "of": len(values)}
    return {"mean": float(np.mean(finite)), "std": float(np.std(finite, ddof=1)) if len(finite) > 1 else 0.0,
            "n": len(finite), "of": len(values)}


def summarize(runs: Sequence[dict[str, Any]], target: float, score: str = "accuracy") -> dict[str, dict[str, Any]]:
    """Per strategy: final scores, total and communication time, time to target, over the seeds. `score` is
    "accuracy" (digits: the test loss is reported too) or "loss" (text: with the perplexity exp(loss))."""
    summary: dict[str, dict[str, Any]] = {}
    for name in runs[0]["curves"]:
        curves = [run["curves"][name] for run in runs]
        if score == "loss":
            scores = {key: _stats([c[-1][key] for c in curves]) for key in ("loss", "averaged_loss")}
            scores.update({key.replace("loss", "perplexity"): _stats([math.exp(c[-1][key]) for c in curves])
                           for key in ("loss", "averaged_loss")})
        else:
            scores = {key: _stats([c[-1][key] for c in curves]) for key in ("accuracy", "averaged_accuracy", "loss")}
        summary[name] = {
            **scores,
            "time_ms": _stats([c[-1]["time_ms"] for c in curves]),
            "communication_ms": _stats([c[-1]["communication_ms"] for c in curves]),
            "time_to_target_ms": _stats([time_to_target_ms(c, target, score) for c in curves]),
            "time_to_target_ms_per_seed": [time_to_target_ms(c, target, score) for c in curves],
            "averaged_time_to_target_ms": _stats([time_to_target_ms(c, target, f"averaged_{score}")
                                                  for c in curves]),
            "period_per_seed": [run["strategies"][name]["period"] for run in runs],
            "local_step_objective_ms_per_seed": [run["strategies"][name]["local_step_objective_ms"] for run in runs],
        }
    return summary


def compare(runs: Sequence[dict[str, Any]], name: str, other: str, target: float,
            score: str = "accuracy") -> dict[str, Any]:
    """`name` against `other`, paired over seeds (`stats.compare_runs`): the per-seed difference of the
    time-averaged score, its bootstrap interval and signed-rank p. The verdict stays `tie` until the table it
    belongs to is corrected as a whole (`correct_verdicts`).

    Also counted, for reading and never as a verdict: on how many seeds `name` reaches the target sooner, and
    later (a run that never reaches it is the later one; equal times, or neither reaching, count for neither).
    """
    sooner = later = 0
    differences: list[float] = []
    for run in runs:
        a = time_to_target_ms(run["curves"][name], target, score)
        b = time_to_target_ms(run["curves"][other], target, score)
        a_key, b_key = (math.inf if a is None else a), (math.inf if b is None else b)
        sooner += a_key < b_key
        later += a_key > b_key
        if a is not None and b is not None:
            differences.append(a - b)
    statistics = stats.compare_runs([run["curves"][name] for run in runs], [run["curves"][other] for run in runs],
                                    score, higher_is_better=not score.endswith("loss"))
    return {"against": other, "seeds": len(runs), **statistics,
            "time_to_target": {"sooner": sooner, "later": later, "both_reached": len(differences),
                               "mean_difference_ms": float(np.mean(differences)) if differences else None}}


def correct_verdicts(cells: Sequence[Cell]) -> int:
    """Holm-correct every comparison of the cells' verdict table together and give each its verdict; returns
    how many comparisons the table makes."""
    table = [comparison for cell in cells for comparison in cell.get("schedule_vs", {}).values()]
    stats.correct(table)
    return len(table)


def run_study(config: TrainConfig, seeds: Sequence[int], alphas: Sequence[float | None] | None = None,
              model_bytes: Sequence[int] | None = None, outers: Sequence[tuple[float, float]] | None = None,
              step_ms: Sequence[float] | None = None, aggregators: Sequence[str] | None = None) -> Study:
    """Every (aggregator, data split, model size, step time, outer optimizer) cell over `seeds`: summaries
    and verdicts. The text workload's split is its module families: pass alphas=[None].
    Training runs are shared between cells that differ only in what time is charged."""
    alphas = [config.alpha] if alphas is None else alphas
    sizes = [config.model_bytes] if model_bytes is None else model_bytes
    outers = [(config.outer_lr, config.outer_momentum)] if outers is None else outers
    step_times = [config.step_ms] if step_ms is None else step_ms
    aggregators = [config.aggregator] if aggregators is None else aggregators
    cells: list[Cell] = []
    islands: list[str] | None = None
    score, target = SCORE[config.workload], config.score_target
    settings = list(itertools.product(aggregators, alphas, sizes, step_times, outers))
    with progress.counting(len(settings) * len(seeds), "training run") as advance:
        for aggregator, alpha, size, step, (outer_lr, outer_momentum) in settings:
            cell_config = TrainConfig(**{**asdict(config), "alpha": alpha, "model_bytes": size, "step_ms": step,
                                         "outer_lr": outer_lr, "outer_momentum": outer_momentum,
                                         "aggregator": aggregator})
            runs: list[dict[str, Any]] = []
            for seed in seeds:
                runs.append(run_training(TrainConfig(**{**asdict(cell_config), "seed": seed})))
                advance()
            islands = runs[0]["config"]["islands"]
            cell: Cell = {"workload": config.workload, "aggregator": aggregator, "alpha": alpha,
                    "model_bytes": charged_bytes(cell_config),
                    "step_ms": step, "outer_lr": outer_lr, "outer_momentum": outer_momentum, "seeds": list(seeds),
                    "strategies": {name: across_seeds([run["strategies"][name] for run in runs])
                                   for name in runs[0]["strategies"]},
                    "plan": across_seeds([run["plan"] for run in runs]),
                    "summary": summarize(runs, target, score),
                    "mean_curves": _mean_curves(runs, score)}
            if "schedule" in config.strategies:
                cell["schedule_vs"] = {other: compare(runs, "schedule", other, target, score)
                                       for other in config.strategies if other != "schedule"}
            cells.append(cell)
    correct_verdicts(cells)
    assert islands is not None, "a study has at least one cell"
    study: Study = {"config": {**asdict(config), "islands": list(islands)}, "workload": config.workload,
             "parameters": workload_parameters(config), "seeds": list(seeds), "target": target, "cells": cells}
    if config.workload == "text":
        study["corpus"] = text_corpus(len(islands))
    return study


def across_seeds(descriptions: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One description from one per seed: what every seed agrees on as it is, the rest under "per_seed", a
    list in seed order (the random strategy's partitions, and the planner's schedules where its search
    finds another per seed)."""
    first, others = descriptions[0], descriptions[1:]
    same = {key: value for key, value in first.items() if all(other[key] == value for other in others)}
    varying = {key: [d[key] for d in descriptions] for key in first if key not in same}
    return {**same, "per_seed": varying} if varying else same


def per_seed(description: dict[str, Any], key: str, seeds: int) -> list[Any]:
    """The value of `key` on each of `seeds` seeds, from a description made by `across_seeds`."""
    if key in description:
        return [description[key]] * seeds
    varying: list[Any] = description["per_seed"][key]
    return varying


def _mean_curves(runs: Sequence[dict[str, Any]], score: str = "accuracy") -> dict[str, dict[str, list[float]]]:
    """Per strategy: time and the mean island score at each evaluation step, mean and std over seeds."""
    curves = {}
    for name in runs[0]["curves"]:
        stacked = [run["curves"][name] for run in runs]
        curves[name] = {
            "time_ms": [p["time_ms"] for p in stacked[0]],
            f"{score}_mean": np.mean([[p[score] for p in c] for c in stacked], axis=0).tolist(),
            f"{score}_std": np.std([[p[score] for p in c] for c in stacked], axis=0, ddof=1).tolist()
            if len(stacked) > 1 else [0.0] * len(stacked[0]),
        }
    return curves


# ---------------------------------------------------------------------------------------------------
# Reports

def alpha_name(alpha: float | None) -> str:
    return "IID" if alpha is None else f"Dirichlet α={alpha:g}"


def _is_text(cell: Cell) -> bool:
    return cell.get("workload") == "text"


def data_name(cell: Cell) -> str:
    return "stdlib module families" if _is_text(cell) else alpha_name(cell["alpha"])


def target_name(target: float, text: bool = False) -> str:
    return f"loss {target:g}" if text else f"{target:.0%}"


def outer_name(cell: Cell) -> str:
    if cell["outer_lr"] == 1.0 and cell["outer_momentum"] == 0.0:
        return "plain averaging"
    return f"outer Nesterov lr {cell['outer_lr']:g}, momentum {cell['outer_momentum']:g}"


def _pm(stats: Stats, scale: float = 1.0, digits: int = 2, percent: bool = False) -> str:
    if stats["mean"] is None:
        return f"never (0/{stats['of']})"
    unit = "%" if percent else ""
    text = f"{stats['mean'] * scale:.{digits}f} ± {stats['std'] * scale:.{digits}f}{unit}"
    return text + (f" ({stats['n']}/{stats['of']})" if stats["n"] < stats["of"] else "")


def cell_title(cell: Cell) -> str:
    if "title" in cell:
        return str(cell["title"])
    return (f"{data_name(cell)}, charged {cell['model_bytes'] / 1e6:g} MB, {cell['aggregator']} aggregator, "
            f"{cell['step_ms']:g} ms per step, {outer_name(cell)}, {len(cell['seeds'])} seeds")


def format_cell(cell: Cell, target: float) -> str:
    """A markdown table of one cell: a row per strategy, mean ± std over seeds."""
    if _is_text(cell):
        return _format_text_cell(cell, target)
    lines = [f"**{cell_title(cell)}**", "",
             f"| strategy | H | comm. (s) | total (s) | time to {target:.0%} (s) | averaged model: time to "
             f"{target:.0%} (s) | mean island acc. | averaged model acc. | objective (s) | {VERSUS_HEADER} |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | " + VERSUS_RULE + " |"]
    for name, s in cell["summary"].items():
        lines.append(f"| {name} | {_span(s['period_per_seed'])} | {_pm(s['communication_ms'], 1e-3)} | "
                     f"{_pm(s['time_ms'], 1e-3)} | {_pm(s['time_to_target_ms'], 1e-3)} | "
                     f"{_pm(s['averaged_time_to_target_ms'], 1e-3)} | {_pm(s['accuracy'], 100, 1, True)} | "
                     f"{_pm(s['averaged_accuracy'], 100, 1, True)} | "
                     f"{_span(s['local_step_objective_ms_per_seed'], _seconds)} | "
                     f"{versus_columns(cell, name)} |")
    return "\n".join(lines)


def _format_text_cell(cell: Cell, target: float) -> str:
    lines = [f"**{cell_title(cell)}**", "",
             f"| strategy | H | comm. (s) | total (s) | time to loss {target:g} (s) | averaged model: time to "
             f"loss {target:g} (s) | mean island val. loss | averaged model val. loss | mean island perplexity | "
             f"objective (s) | {VERSUS_HEADER} |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | " + VERSUS_RULE + " |"]
    for name, s in cell["summary"].items():
        lines.append(f"| {name} | {_span(s['period_per_seed'])} | {_pm(s['communication_ms'], 1e-3)} | "
                     f"{_pm(s['time_ms'], 1e-3)} | {_pm(s['time_to_target_ms'], 1e-3)} | "
                     f"{_pm(s['averaged_time_to_target_ms'], 1e-3)} | {_pm(s['loss'], digits=3)} | "
                     f"{_pm(s['averaged_loss'], digits=3)} | {_pm(s['perplexity'])} | "
                     f"{_span(s['local_step_objective_ms_per_seed'], _seconds)} | "
                     f"{versus_columns(cell, name)} |")
    return "\n".join(lines)


VERSUS_HEADER = ("schedule − row: time-averaged score [95 % CI] | Holm p | verdict | time to target: seeds "
                 "schedule sooner, later")
"""The columns of the schedule against a cell's row (`versus_columns`)."""
VERSUS_RULE = "---: | ---: | --- | ---:"


def difference_units(cell: Cell) -> tuple[int, float, str]:
    """Digits and scale the paired difference is shown with, and its unit: accuracy in percentage points,
    a validation loss in nats per byte."""
    return (3, 1.0, "nats per byte") if _is_text(cell) else (2, 100.0, "percentage points")


def versus_columns(cell: Cell, name: str) -> str:
    """The schedule against `name`: the paired difference with its interval, the corrected p, the verdict,
    and the seeds on which the schedule reaches the target sooner and later (a count, not a verdict)."""
    versus = cell.get("schedule_vs", {}).get(name)
    if versus is None:
        return " |  |  | "
    digits, scale, _ = difference_units(cell)
    counts = versus["time_to_target"]
    return (f"{stats.format_difference(versus, digits, scale)} | {stats.format_p(versus['p_holm'])} | "
            f"{versus['verdict']} | {counts['sooner']}↑ {counts['later']}↓ of {versus['seeds']}")


def versus_entry(cell: Cell, name: str) -> str:
    """The schedule against `name` in one table cell: verdict, paired difference with interval, corrected p."""
    versus = cell["schedule_vs"][name]
    digits, scale, _ = difference_units(cell)
    return (f"{versus['verdict']} {stats.format_difference(versus, digits, scale)} "
            f"p={stats.format_p(versus['p_holm'])}")


def verdict_rule(seeds: int, comparisons: int, text: bool) -> str:
    """The verdicts' rule and measure for a caption: a table of `comparisons` over `seeds` seeds."""
    score = "mean island validation loss (lower is better)" if text else "mean island test accuracy"
    unit = "nats per byte" if text else "percentage points"
    return (f"The schedule against each strategy, paired over the {seeds} seeds: per seed, each run's {score} "
            f"averaged over the simulated time both runs cover; the difference schedule − other in {unit} (mean "
            "over seeds) with its 95 % BCa bootstrap interval; Holm p: the two-sided Wilcoxon signed-rank p, "
            f"Holm-corrected over every comparison of the table. {stats.describe(seeds, comparisons)}. Seeds reaching "
            "the target sooner or later are counted for reading, not for the verdict.")


def _seconds(ms: float | None) -> str:
    return "–" if ms is None else f"{ms / 1000:.2f}"


def _span(values: Sequence[Any], show: Callable[[Any], str] = str) -> str:
    """Per-seed values in one table cell: the value where every seed shows the same, else the range over the
    seeds, with how many have one where some have none."""
    shown = [show(v) for v in values]
    if len(set(shown)) == 1:
        return shown[0]
    known = [v for v in values if v is not None]
    text = f"{show(min(known))}–{show(max(known))}"
    return text if len(known) == len(values) else f"{text} ({len(known)}/{len(values)})"


VERDICT_COLUMNS = ("none", "global", "global-equal", "hierarchical", "ring", "gossip", "random", "schedule-h")


def format_verdicts(study: Study) -> str:
    """One line per cell: the schedule against each baseline, and whether the planner's schedule differs
    from the global clique at all in that cell."""
    columns = [c for c in VERDICT_COLUMNS if any(c in cell.get("schedule_vs", {}) for cell in study["cells"])]
    lines = ["| aggregator | data | MB | step (ms) | outer | schedule's rounds | schedule-h's rounds | "
             + " | ".join(columns) + " |",
             "| --- | --- | ---: | ---: | --- | --- | --- | " + " | ".join("---" for _ in columns) + " |"]
    for cell in study["cells"]:
        versus = cell.get("schedule_vs", {})
        kinds = [_kinds(cell, name) for name in ("schedule", "schedule-h")]
        outer = "avg" if cell["outer_lr"] == 1.0 and cell["outer_momentum"] == 0.0 else "Nesterov"
        verdicts = [versus_entry(cell, c) if c in versus else "" for c in columns]
        alpha = ("stdlib families" if _is_text(cell) else "IID" if cell["alpha"] is None
                 else f"α={cell['alpha']:g}")
        lines.append(f"| {cell['aggregator']} | {alpha} | {cell['model_bytes'] / 1e6:g} | {cell['step_ms']:g} | "
                     f"{outer} | {kinds[0]} | {kinds[1]} | "
                     + " | ".join(verdicts) + " |")
    return "\n".join(lines)


def _kinds(cell: Cell, name: str) -> str:
    """What the strategy's rounds are: every kind the seeds give, in order of their names."""
    if name not in cell["strategies"]:
        return "–"
    rounds = per_seed(cell["strategies"][name], "rounds", len(cell["seeds"]))
    return "; ".join(sorted({_kind(r) for r in rounds}))


def _kind(rounds: Sequence[Sequence[Sequence[str]]]) -> str:
    if len(rounds) == 1 and len(rounds[0]) == 1 and len(rounds[0][0]) > 2:
        return "global clique"
    return f"{len(rounds)} round{'s' if len(rounds) > 1 else ''} of {'+'.join(str(len(c)) for c in rounds[0])}"


def format_study(study: Study) -> str:
    text = study.get("workload") == "text"
    comparisons = sum(len(cell.get("schedule_vs", {})) for cell in study["cells"])
    parts = [f"Seeds {study['seeds'][0]}–{study['seeds'][-1]}. "
             + (verdict_rule(len(study["seeds"]), comparisons, text) + " " if comparisons else "")
             + f"Time to target: {target_name(study['target'], text)}. 'objective' is the planner's local-step "
             "objective for the row's strategy: time to ε-consensus "
             "with H local steps before every round. Seeds vary the random strategy's partitions and the planner's "
             "search too: where they give different rounds, H or objectives, a table shows every kind of rounds, or "
             "the range over seeds."]
    if text:
        corpus = study["corpus"]
        parts.append(f"Text workload: a byte-level transformer of {study['parameters']:,} parameters per island, "
                     f"AdamW, on {len(corpus['files'])} files of the standard library at {corpus['root']} (list "
                     f"SHA-256 {corpus['list_sha256']}); the score is the mean island validation loss (nats per "
                     "byte) on the last tenth of every file. Islands' families: "
                     + "; ".join(f"{island} {', '.join(families) or 'none'}" for island, families
                                 in zip(study["config"]["islands"], corpus["island_families"])) + ".")
    if any("schedule_vs" in cell for cell in study["cells"]):
        parts.append("Verdicts of the schedule against each baseline (difference schedule − baseline [95 % CI], "
                     "Holm-corrected p):\n\n"
                     + format_verdicts(study))
    parts += [format_cell(cell, study["target"]) for cell in study["cells"]]
    return "\n\n".join(parts) + "\n"


def format_summary(study: Study) -> str:
    """The study in a line per cell for the terminal: each strategy's mean time to target over seeds, soonest
    first (`format_study`, written to study.md, has every figure)."""
    text = study.get("workload") == "text"
    lines = []
    for cell in study["cells"]:
        times = {name: s["time_to_target_ms"] for name, s in cell["summary"].items()}
        order = sorted(times, key=lambda name: (times[name]["mean"] is None, times[name]["mean"] or 0))
        reached = ", ".join(f"{name} never" if times[name]["mean"] is None else
                            f"{name} {times[name]['mean'] * 1e-3:.1f}"
                            + (f" ({times[name]['n']}/{times[name]['of']} seeds)"
                               if times[name]["n"] < times[name]["of"] else "") for name in order)
        lines.append(f"{cell_title(cell)}: time to {target_name(study['target'], text)} in s, mean over seeds: "
                     f"{reached}")
    return "\n".join(lines) + "\n"


STRATEGY_COLOURS = {
    # Okabe-Ito hues (plotstyle); yellow does not show on white, so of eleven strategies some share one: global
    # and global-equal, its equal-budget control; the text study's sync and host-tree with the digits study's
    # random and gossip (the two studies' default strategies never meet in one figure). The planner's two
    # schedules get vermillion and black.
    "none": plotstyle.DARK_GREY,
    "sync": plotstyle.OKABE_ITO["reddish purple"],
    "host-tree": plotstyle.OKABE_ITO["orange"],
    "global": plotstyle.OKABE_ITO["blue"],
    "global-equal": plotstyle.OKABE_ITO["blue"],
    "hierarchical": plotstyle.OKABE_ITO["bluish green"],
    "ring": plotstyle.OKABE_ITO["sky blue"],
    "gossip": plotstyle.OKABE_ITO["orange"],
    "random": plotstyle.OKABE_ITO["reddish purple"],
    "schedule": plotstyle.OKABE_ITO["vermillion"],
    "schedule-h": plotstyle.OKABE_ITO["black"],
}


def draw_cell(cell: Cell, target: float) -> Figure:
    """The figure of one cell. Left, a small panel per strategy: its mean island score (digits: test accuracy;
    text: validation loss) against simulated
    time (mean ± std over seeds) in its colour over the other strategies in grey, with the target line; right,
    time to target per strategy. A strategy that no seed brings to the target gets no bar but a "not reached"
    mark, one that only some seeds bring there a hatched bar saying how many.

    Artists carry gids that say what they are: "curve NAME", "bar NAME", "not reached NAME", "target"."""
    with plotstyle.figure_context() as Figure:
        curves = cell["mean_curves"]
        names = list(cell["summary"])
        drawn = [name for name in names if name in curves] + [name for name in curves if name not in names]
        columns = min(3, max(1, len(drawn)))
        rows = max(1, math.ceil(len(drawn) / columns))
        figure = Figure(figsize=(14, max(5.0, 2.15 * rows + 1.4)), layout="constrained")
        left, right_figure = figure.subfigures(1, 2, width_ratios=(1.55, 1), wspace=0.02)
        panels = left.subplots(rows, columns, sharex=True, sharey=True, squeeze=False)
        bar_axis = right_figure.subplots()
        colours = {name: STRATEGY_COLOURS.get(name, plotstyle.style(i)[0])
                   for i, name in enumerate(dict.fromkeys([*names, *curves]))}
        ends = {name: curve["time_ms"][-1] / 1000 for name, curve in curves.items()}
        reached = {name: cell["summary"][name]["time_to_target_ms"] for name in names}
        # The ring's run is far longer than the others; show the span where the rest are decided.
        ordered = sorted(ends.values())
        right = min(ordered[-1], 1.5 * ordered[len(ordered) // 2]) if ordered else 1.0
        text = _is_text(cell)
        # Accuracy is drawn in percent, a loss as it is.
        score, scale = ("loss", 1.0) if text else ("accuracy", 100.0)
        series = {name: (np.array(curve["time_ms"]) / 1000, scale * np.array(curve[f"{score}_mean"]),
                         scale * np.array(curve[f"{score}_std"])) for name, curve in curves.items()}
        for index, axis in enumerate(panels.flat):
            if index >= len(drawn):
                axis.set_visible(False)
                continue
            name = drawn[index]
            colour = colours[name]
            for other, (times, mean, _) in series.items():
                if other != name:
                    axis.plot(times, mean, color="0.84", linewidth=0.8, zorder=1)
            times, mean, std = series[name]
            axis.fill_between(times, mean - std, mean + std, color=colour, alpha=0.18, linewidth=0, zorder=2)
            # Alone in its panel a line needs no dash pattern: solid reads best through the sawtooth.
            axis.plot(times, mean, color=colour, linewidth=1.8, zorder=3, gid=f"curve {name}")
            axis.axhline(scale * target, color="black", linewidth=0.9, linestyle=(0, (5, 3)), zorder=4, gid="target")
            axis.text(0.02, scale * target + (0.005 * target if text else 1.5), f"target {target_name(target, text)}",
                      transform=axis.get_yaxis_transform(), fontsize=9, va="bottom", ha="left")
            r = reached.get(name)
            if r is not None and r["mean"] is None:
                axis.text(0.97, 0.06, "never reaches the target", transform=axis.transAxes, ha="right",
                          va="bottom", fontsize=9.5, fontstyle="italic", color="0.25")
            if ends[name] > right * 1.001:
                axis.text(0.97, 0.06, f"run goes on to {ends[name]:.0f} s →", transform=axis.transAxes,
                          ha="right", va="bottom", fontsize=9.5, color="0.25")
            axis.set_title(name, color=colour, fontweight="bold", pad=3)
            axis.grid(True, color="0.92", linewidth=0.7)
        panels[0][0].set_xlim(0, right)
        if text:
            # Losses differ by tenths where strategies part: the span of the curves and the target, not from 0.
            low = min([target, *(float(np.min(mean - std)) for _, mean, std in series.values())])
            high = max([target, *(float(np.max(mean + std)) for _, mean, std in series.values())])
            panels[0][0].set_ylim(low - 0.05 * (high - low), high + 0.05 * (high - low))
        else:
            panels[0][0].set_ylim(0, 100)
        left.supxlabel("simulated time (s)")
        left.supylabel("mean island validation loss (nats per byte)" if text else "mean island test accuracy (%)")
        left.suptitle(f"{score} over time: mean ± std over {len(cell['seeds'])} seeds, others in grey")

        positions = np.arange(len(names))
        longest = max([(r["mean"] + r["std"]) / 1000 for r in reached.values() if r["mean"] is not None] or [1.0])
        for y, name in zip(positions, names):
            r, colour = reached[name], colours[name]
            if r["mean"] is None:
                end = f", run ends at {ends[name]:.0f} s" if name in ends else ""
                bar_axis.text(0.015 * longest, y, f"✕ not reached ({r['n']}/{r['of']} seeds{end})", va="center",
                              ha="left", fontsize=10, fontstyle="italic", color="0.25", gid=f"not reached {name}")
                continue
            partial = r["n"] < r["of"]
            (bar,) = bar_axis.barh(y, r["mean"] / 1000, xerr=r["std"] / 1000, height=0.66, capsize=3,
                                   color="white" if partial else colour, edgecolor=colour,
                                   hatch="///" if partial else None, linewidth=1.4,
                                   error_kw={"elinewidth": 1.0, "ecolor": "0.2"})
            bar.set_gid(f"bar {name}")
            note = f"{r['mean'] / 1000:.1f} s" + (f"  ({r['n']}/{r['of']} seeds)" if partial else "")
            bar_axis.annotate(note, ((r["mean"] + r["std"]) / 1000, y), xytext=(5, 0), textcoords="offset points",
                              va="center", ha="left", fontsize=10)
        bar_axis.set_yticks(positions, names)
        bar_axis.set_ylim(len(names) - 0.4, -0.6)
        bar_axis.set_xlim(0, longest * 1.5)
        bar_axis.set_xlabel(f"time to {'validation ' if text else ''}{target_name(target, text)}"
                            f"{'' if text else ' accuracy'} (s)")
        bar_axis.grid(True, axis="x", color="0.92", linewidth=0.7)
        bar_axis.set_axisbelow(True)
        right_figure.suptitle(f"time to {target_name(target, text)}: mean ± std over the seeds that reach it;\n"
                              "hatched: not every seed reaches it")
        figure.suptitle(cell_title(cell), fontweight="bold")
    return figure


def plot_cell(cell: Cell, target: float, path: str | pathlib.Path) -> Figure:
    """Draw one cell (`draw_cell`) into the PNG at `path`, at plotstyle.DPI; returns the figure."""
    figure = draw_cell(cell, target)
    with plotstyle.figure_context():
        figure.savefig(path, dpi=plotstyle.DPI)
    return figure


def cell_file_name(cell: Cell) -> str:
    alpha = "text" if _is_text(cell) else "iid" if cell["alpha"] is None else f"alpha{cell['alpha']:g}"
    outer = "avg" if cell["outer_lr"] == 1.0 and cell["outer_momentum"] == 0.0 else "nesterov"
    return f"{cell['aggregator']}-{alpha}-{cell['model_bytes'] / 1e6:g}mb-{cell['step_ms']:g}ms-{outer}.png"


def study_json(study: Study) -> str:
    """The study as JSON, without the mean curves (the plots show them)."""
    cells = [{key: value for key, value in cell.items() if key != "mean_curves"} for cell in study["cells"]]
    return json.dumps({**study, "cells": cells}, separators=(",", ":"))


def write_study(study: Study, out_dir: pathlib.Path) -> list[pathlib.Path]:
    """Write study.json, study.md and one plot per cell into `out_dir`, all of them or (on an error, such as a
    plot that cannot be drawn) none; returns their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    texts = {"study.json": study_json(study) + "\n", "study.md": format_study(study)}
    written = [out_dir / name for name in [*texts, *map(cell_file_name, study["cells"])]]
    with contextlib.ExitStack() as outputs:
        temporaries = [outputs.enter_context(atomic_output(path)) for path in written]
        for temporary, text in zip(temporaries, texts.values()):
            pathlib.Path(temporary).write_text(text)
        for temporary, cell in zip(temporaries[len(texts):], study["cells"], strict=True):
            plot_cell(cell, study["target"], temporary)
    return written
