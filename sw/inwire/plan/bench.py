"""Benchmark of the schedule optimizer: wall time and quality for 9, 16, 32 and 64 islands, for every
aggregator profile.

Nine islands are the doublezero9 cities; larger cases are generated topologies (seed 0). Quality is the
optimizer's time to epsilon over the best baseline's it starts from (below 1 is better) and over the lower
bound; the host-side tree all-reduce, a baseline it does not run, is reported beside them.
"""

import json
import math
import platform
import time
from typing import Any

from inwire.plan.aggregator import PROFILES
from inwire.plan.cost import HOST_TREE
from inwire.plan.search import plan_schedule
from inwire.plan.topology import Topology, generate_topology, load_topology

SIZES = (9, 16, 32, 64)
MODEL_BYTES = 100_000_000
EPSILON = 1e-3
SEED = 0


def _case(topology: Topology, profile: str) -> dict[str, Any]:
    started = time.perf_counter()
    plan = plan_schedule(topology, None, MODEL_BYTES, EPSILON, seed=SEED, aggregator=profile)
    wall_s = time.perf_counter() - started
    best_name, best_baseline = min(plan.candidate_baselines.items(), key=lambda item: item[1].time_to_epsilon_ms)
    mine = plan.best.time_to_epsilon_ms
    return {
        "topology": topology.name,
        "shape": " / ".join("+".join(str(len(c.members)) for c in cliques) for cliques in plan.best.rounds),
        "wall_s": round(wall_s, 3),
        "rounds": len(plan.best.rounds),
        "time_to_epsilon_ms": round(mine, 3),
        "best_baseline": best_name,
        "best_baseline_ms": round(best_baseline.time_to_epsilon_ms, 3),
        "ratio_to_best_baseline": round(mine / best_baseline.time_to_epsilon_ms, 4),
        "host_tree_ms": round(plan.baselines[HOST_TREE].time_to_epsilon_ms, 3),
        "lower_bound_ms": round(plan.lower_bound_ms, 3),
        "ratio_to_lower_bound": round(mine / plan.lower_bound_ms, 4) if math.isfinite(mine) else None,
        "schedules_scored": plan.evaluations,
    }


def run() -> dict[str, Any]:
    """The `schedule` entry of bench/results.json: per profile, per island count."""
    topologies = {n: load_topology("doublezero9") if n == 9 else generate_topology(n, SEED) for n in SIZES}
    profiles = {}
    for name in PROFILES:
        profiles[name] = {str(n): _case(topology, name) for n, topology in topologies.items()}
    return {"model_bytes": MODEL_BYTES, "epsilon": EPSILON, "seed": SEED, "profiles": profiles,
            "max_wall_s_at_64": max(cases["64"]["wall_s"] for cases in profiles.values()),
            "machine": f"{platform.machine()}, {platform.python_implementation()} {platform.python_version()}"}


if __name__ == "__main__":
    print(json.dumps(run(), indent=1))
