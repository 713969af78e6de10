"""Benchmark of the schedule optimizer: wall time and quality for 9, 16, 32 and 64 islands.

Nine islands are the doublezero9 cities; larger cases are generated topologies (seed 0). Quality is the
optimizer's time to epsilon over the best baseline's (below 1 is better) and over the lower bound.
"""

import json
import math
import platform
import time

from inwire.plan.search import plan_schedule
from inwire.plan.topology import generate_topology, load_topology

SIZES = (9, 16, 32, 64)
MODEL_BYTES = 100_000_000
EPSILON = 1e-3
SEED = 0


def _case(topology):
    started = time.perf_counter()
    plan = plan_schedule(topology, None, MODEL_BYTES, EPSILON, seed=SEED)
    wall_s = time.perf_counter() - started
    best_name, best_baseline = min(plan.baselines.items(), key=lambda item: item[1].time_to_epsilon_ms)
    mine = plan.best.time_to_epsilon_ms
    return {
        "topology": topology.name,
        "wall_s": round(wall_s, 3),
        "rounds": len(plan.best.rounds),
        "time_to_epsilon_ms": round(mine, 3),
        "best_baseline": best_name,
        "best_baseline_ms": round(best_baseline.time_to_epsilon_ms, 3),
        "ratio_to_best_baseline": round(mine / best_baseline.time_to_epsilon_ms, 4),
        "lower_bound_ms": round(plan.lower_bound_ms, 3),
        "ratio_to_lower_bound": round(mine / plan.lower_bound_ms, 4) if math.isfinite(mine) else None,
        "schedules_scored": plan.evaluations,
    }


def run():
    """The `schedule` entry of bench/results.json."""
    cases = {}
    for n in SIZES:
        topology = load_topology("doublezero9") if n == 9 else generate_topology(n, SEED)
        cases[str(n)] = _case(topology)
    return {"model_bytes": MODEL_BYTES, "epsilon": EPSILON, "seed": SEED, "islands": cases,
            "machine": f"{platform.machine()}, {platform.python_implementation()} {platform.python_version()}"}


if __name__ == "__main__":
    print(json.dumps(run(), indent=1))
