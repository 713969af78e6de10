"""Which strategy wins as the network changes: every link's latency and bandwidth scaled, the schedule planned
again at each point (`inwire schedule --sensitivity`, docs/schedule.md)."""

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from typing import Any

from .cost import AGGREGATE, GLOO_RING, HOST_TREE
from .search import PlanResult, plan_schedule
from .topology import Topology

LATENCY_FACTORS = (0.5, 1.0, 2.0)
BANDWIDTH_FACTORS = (0.1, 1.0, 10.0)
COMPARED = ("global", HOST_TREE, "ring", GLOO_RING)
"""Baselines whose times each point records beside the optimum's."""


def scaled_topology(topology: Topology, latency_factor: float, bandwidth_factor: float) -> Topology:
    """The topology with every link's latency and bandwidth multiplied; cities, kinds and routing kept."""
    links = [replace(link, latency_ms=link.latency_ms * latency_factor,
                     bandwidth_gbps=link.bandwidth_gbps * bandwidth_factor) for link in topology.links]
    return Topology(f"{topology.name} x{latency_factor:g} latency x{bandwidth_factor:g} bandwidth",
                    topology.cities.values(), links, topology.description, topology.source, topology.routing)


def winner(plan: PlanResult) -> str:
    """The optimum's strategy in a few words: where it sums (in-network tree or flat aggregator, or which
    host-side exchange) and whether its cliques rotate (more than one clique or round a period)."""
    cliques = [c for round_ in plan.best.rounds for c in round_]
    model = plan.cost_model
    if any(c.exchange == AGGREGATE for c in cliques):
        trees = model is not None and any(p.tree for round_ in plan.best.rounds for p in model.round_profiles(round_))
        kind = "in-network tree" if trees else "in-network"
    else:
        kind = "host " + "+".join(sorted({"tree" if c.exchange == HOST_TREE else c.exchange for c in cliques}))
    return ("rotating " if len(cliques) > 1 else "") + kind


def _finite(ms: float) -> float | None:
    return round(ms, 3) if math.isfinite(ms) else None


def sensitivity_sweep(topology: Topology, sizes_mb: Sequence[float],
                      latency_factors: Iterable[float] = LATENCY_FACTORS,
                      bandwidth_factors: Iterable[float] = BANDWIDTH_FACTORS,
                      advance: Callable[[], object] = lambda: None, **options: Any) -> list[dict[str, Any]]:
    """One row per (model size, latency factor, bandwidth factor): the winner, its time and the compared
    baselines' times; `options` go to `plan_schedule` (islands, aggregator, host_tree, routing ...)."""
    rows = []
    for size_mb in sizes_mb:
        for latency_factor in latency_factors:
            for bandwidth_factor in bandwidth_factors:
                scaled = scaled_topology(topology, latency_factor, bandwidth_factor)
                plan = plan_schedule(scaled, model_bytes=round(size_mb * 1e6), **options)
                rows.append({"topology": topology.name, "model_mb": size_mb, "latency_factor": latency_factor,
                             "bandwidth_factor": bandwidth_factor, "winner": winner(plan),
                             "host_side": plan.host_side, "routing": plan.routing,
                             "time_to_epsilon_ms": _finite(plan.best.time_to_epsilon_ms),
                             **{f"{name}_ms": _finite(plan.baselines[name].time_to_epsilon_ms) for name in COMPARED}})
                advance()
    return rows


def sensitivity_table(rows: Sequence[dict[str, Any]]) -> str:
    """Markdown: per model size, latency factor down, bandwidth factor across, each cell the winner and its time
    over the host tree's (below 1: the winner is faster than the host tree)."""
    bandwidths = sorted({r["bandwidth_factor"] for r in rows})
    lines = []
    for size_mb in sorted({r["model_mb"] for r in rows}):
        lines += [f"{rows[0]['topology']}, {size_mb:g} MB: winner (its time / host tree's)", "",
                  "| latency \\ bandwidth | " + " | ".join(f"x{b:g}" for b in bandwidths) + " |",
                  "|---|" + "---|" * len(bandwidths)]
        for latency in sorted({r["latency_factor"] for r in rows}):
            cells = []
            for bandwidth in bandwidths:
                row = next(r for r in rows if (r["model_mb"], r["latency_factor"], r["bandwidth_factor"])
                           == (size_mb, latency, bandwidth))
                host = row[f"{HOST_TREE}_ms"]
                ratio = f"{row['time_to_epsilon_ms'] / host:.2f}" if host and row["time_to_epsilon_ms"] else "-"
                cells.append(f"{row['winner']} ({ratio})")
            lines.append(f"| x{latency:g} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"
