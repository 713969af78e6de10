"""An experiment a reader can rerun (`inwire train`): islands that really train, averaged through inwire.

Each island is a process with its own copy of a small MLP and its own, deliberately skewed share of
scikit-learn's digits (a Dirichlet split over the classes: no download). Every `period` local SGD steps the
islands average through a software aggregator over UDP, following one of four strategies:

- `none`: never synchronize;
- `global`: one clique of every island, aggregated at the best city (the schedule's `global` baseline);
- `ring`: a ring all-reduce gives the same global average, so it is computed the same way and charged
  the ring's time from the topology model;
- `schedule`: the optimized rotating cliques for this model size.

Wall-clock time is simulated: the compute time each step really took (the slowest island, since rounds
are in lock step) plus, per averaging round, the round time the topology model gives that strategy.
"""

import json
import multiprocessing
import threading
import time
from dataclasses import asdict, dataclass

import numpy as np

from ..model import Aggregator
from ..schedule import parse_schedule, plan_schedule, schedule_document
from ..serve import SoftwareAggregator
from ..topology import load_topology

STRATEGIES = ("none", "global", "ring", "schedule")
ISLAND_TIMEOUT_S = 600


@dataclass(frozen=True)
class TrainConfig:
    topology: str = "doublezero9"
    islands: tuple = ()
    """Cities that host an island; empty means every city of the topology."""
    steps: int = 300
    period: int = 10
    batch: int = 32
    learning_rate: float = 0.2
    hidden: int = 32
    alpha: float = 0.3
    """Dirichlet concentration of the class split: small means each island sees few classes."""
    seed: int = 0
    epsilon: float = 1e-3
    strategies: tuple = STRATEGIES
    sim: tuple = ()
    """(simulator, data width) to average through the gateware in co-simulation instead of the golden model."""
    model_bytes: int = 0
    """Size the communication is planned and charged for; 0 means the MLP's own size. A larger size asks
    how the same training would fare if each averaging moved a model that large."""

    def __post_init__(self):
        for name in ("steps", "period", "batch", "hidden"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.model_bytes < 0:
            raise ValueError(f"model_bytes must not be negative, got {self.model_bytes}")
        if self.learning_rate <= 0 or self.alpha <= 0:
            raise ValueError("learning_rate and alpha must be positive")
        unknown = set(self.strategies) - set(STRATEGIES)
        if unknown or not self.strategies:
            raise ValueError(f"strategies must be among {', '.join(STRATEGIES)}, got {', '.join(self.strategies)}")


def parameter_count(config):
    return 64 * config.hidden + config.hidden + config.hidden * 10 + 10


def plan_strategies(config):
    """Rounds (lists of (members, aggregator)) and round times (ms) of each strategy, and the schedule file."""
    topology = load_topology(config.topology)
    islands = list(config.islands) or list(topology.cities)
    plan = plan_schedule(topology, islands, model_bytes=config.model_bytes or 4 * parameter_count(config),
                         epsilon=config.epsilon, seed=config.seed)
    document = schedule_document(plan)
    sources = {"schedule": document, "global": document["baselines"]["global"],
               "ring": document["baselines"]["ring"]}
    strategies = {"none": ([[]], [0.0])}
    for name, source in sources.items():
        rounds = parse_schedule({**document, "rounds": source["rounds"]}, f"{name} schedule")
        strategies[name] = (rounds, [entry["time_ms"] for entry in source["rounds"]])
    return islands, strategies, document


def split_data(config, islands):
    """Standardized digits: a shared test set and a skewed training share per island."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    rng = np.random.default_rng(config.seed)
    order = rng.permutation(len(digits.target))
    features = (digits.data[order] / 16.0).astype(np.float32)
    labels = digits.target[order].astype(np.int64)
    test = len(labels) // 5
    test_set = (features[:test], labels[:test])
    train_x, train_y = features[test:], labels[test:]
    shares = rng.dirichlet([config.alpha] * len(islands), size=10)
    assignment = np.empty(len(train_y), dtype=np.int64)
    for digit in range(10):
        where = np.flatnonzero(train_y == digit)
        assignment[where] = rng.choice(len(islands), size=len(where), p=shares[digit])
    shards = {island: (train_x[assignment == i], train_y[assignment == i]) for i, island in enumerate(islands)}
    return shards, test_set


def _island(name, config, strategy, rounds, target, results):
    """One island's process: local SGD, averaging through the aggregator, test metrics at each sync."""
    import torch

    from .averaging import CliqueAverager, UdpCliqueExchange

    torch.set_num_threads(1)
    islands = list(config.islands)
    shards, (test_x, test_y) = split_data(config, islands)
    train_x, train_y = (torch.from_numpy(array) for array in shards[name])
    test_x, test_y = torch.from_numpy(test_x), torch.from_numpy(test_y)
    torch.manual_seed(config.seed)
    model = torch.nn.Sequential(torch.nn.Linear(64, config.hidden), torch.nn.ReLU(), torch.nn.Linear(config.hidden, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=config.learning_rate)
    loss_function = torch.nn.CrossEntropyLoss()
    generator = torch.Generator().manual_seed(config.seed + islands.index(name))
    exchange = averager = None
    if strategy != "none":
        exchange = UdpCliqueExchange(target, job=1 + STRATEGIES.index(strategy))
        averager = CliqueAverager(config.period, island=name, rounds=rounds, exchange=exchange)
    records, compute_s = [], 0.0
    try:
        for step in range(1, config.steps + 1):
            started = time.perf_counter()
            if len(train_y):
                batch = torch.randint(len(train_y), (config.batch,), generator=generator)
                optimizer.zero_grad()
                loss_function(model(train_x[batch]), train_y[batch]).backward()
                optimizer.step()
            compute_s += time.perf_counter() - started
            if averager is not None:
                averager.average_parameters(model.parameters())
            if step % config.period == 0 or step == config.steps:
                with torch.no_grad():
                    logits = model(test_x)
                    records.append({"step": step, "compute_s": compute_s,
                                    "loss": float(loss_function(logits, test_y)),
                                    "accuracy": float((logits.argmax(1) == test_y).float().mean())})
        results.put((name, records, None))
    except Exception as error:  # reported by the parent as this island's failure
        results.put((name, records, f"{type(error).__name__}: {error}"))
    finally:
        if exchange is not None:
            exchange.close()


def run_strategy(config, strategy, rounds, round_times_ms):
    """Train every island under one strategy; returns the curve of mean test metrics over simulated time."""
    make_aggregator = Aggregator
    if config.sim:
        from inwire_hdl.cosim import CoSimulation

        def make_aggregator(aggregator_config):
            return CoSimulation(*config.sim, aggregator_config)
    server = SoftwareAggregator(("127.0.0.1", 0), unicast=True, log=lambda line: None,
                                make_aggregator=make_aggregator)
    serving = threading.Thread(target=server.serve, daemon=True)
    import torch  # noqa: F401  (imported once here, so that forked islands start at once)

    context = multiprocessing.get_context("fork")
    results = context.Queue()
    processes = [context.Process(target=_island, args=(name, config, strategy, rounds, server.address, results))
                 for name in config.islands]
    try:
        for process in processes:
            process.start()
        serving.start()
        collected = {}
        deadline = time.monotonic() + ISLAND_TIMEOUT_S
        while len(collected) < len(processes):
            name, records, error = results.get(timeout=max(1.0, deadline - time.monotonic()))
            if error:
                raise RuntimeError(f"island {name} failed under strategy {strategy}: {error}")
            collected[name] = records
    finally:
        for process in processes:
            process.join(timeout=10)
            if process.is_alive():
                process.kill()
        server.stop()
        if serving.is_alive():
            serving.join(timeout=5)
        server.close()
    return _curve(config, strategy, collected, round_times_ms)


def _curve(config, strategy, collected, round_times_ms):
    points = []
    for index, step in enumerate(record["step"] for record in next(iter(collected.values()))):
        at_step = [records[index] for records in collected.values()]
        syncs = 0 if strategy == "none" else step // config.period
        communication_ms = sum(round_times_ms[i % len(round_times_ms)] for i in range(syncs))
        points.append({"step": step, "time_ms": 1000 * max(r["compute_s"] for r in at_step) + communication_ms,
                       "loss": float(np.mean([r["loss"] for r in at_step])),
                       "accuracy": float(np.mean([r["accuracy"] for r in at_step]))})
    return points


def run_training(config):
    islands, strategies, document = plan_strategies(config)
    config = TrainConfig(**{**asdict(config), "islands": tuple(islands)})
    curves = {name: run_strategy(config, name, *strategies[name]) for name in config.strategies}
    return {"config": asdict(config), "parameters": parameter_count(config),
            "schedule": {key: document[key] for key in ("model_bytes", "period_ms", "rho", "time_to_epsilon_ms")},
            "schedule_rounds": document["rounds"],
            "curves": curves}


TARGET_ACCURACY = 0.85


def time_to_accuracy_ms(curve, target=TARGET_ACCURACY):
    """Simulated time at which the mean test accuracy first reaches `target`, or None if it never does."""
    return next((point["time_ms"] for point in curve if point["accuracy"] >= target), None)


def format_report(report):
    lines = [f"{'strategy':<10} {'steps':>6} {'sim. time (s)':>14} {'test loss':>10} {'test accuracy':>14} "
             f"{f'time to {TARGET_ACCURACY:.0%} (s)':>18}"]
    for name, curve in report["curves"].items():
        last = curve[-1]
        reached = time_to_accuracy_ms(curve)
        reached = "never" if reached is None else f"{reached / 1000:.2f}"
        lines.append(f"{name:<10} {last['step']:>6} {last['time_ms'] / 1000:>14.2f} {last['loss']:>10.4f} "
                     f"{100 * last['accuracy']:>13.1f}% {reached:>18}")
    return "\n".join(lines)


def plot_report(report, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (accuracy_axis, loss_axis) = plt.subplots(1, 2, figsize=(11, 4))
    for name, curve in report["curves"].items():
        times = [point["time_ms"] / 1000 for point in curve]
        accuracy_axis.plot(times, [100 * point["accuracy"] for point in curve], label=name)
        loss_axis.plot(times, [point["loss"] for point in curve], label=name)
    accuracy_axis.set(xlabel="simulated wall-clock time (s)", ylabel="mean test accuracy (%)")
    loss_axis.set(xlabel="simulated wall-clock time (s)", ylabel="mean test loss")
    accuracy_axis.legend()
    figure.suptitle(f"{len(report['config']['islands'])} islands, digits, averaging every "
                    f"{report['config']['period']} steps")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def write_report(report, out_dir):
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "train.json").write_text(json.dumps(report, indent=1) + "\n")
    plot_report(report, out_dir / "train.png")
