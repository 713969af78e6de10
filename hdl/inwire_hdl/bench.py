"""Gateware benchmark, measured in simulation: `run()` returns the `gateware` entry of bench/results.json."""

import json
import tempfile
from pathlib import Path

from inwire.model import AggregatorConfig

from .sim import SIMULATORS, SimulationError, build
from .sim import run as run_tests

WIDTHS = (8, 64)


def measure(simulator, data_width, config=None):
    config = config or AggregatorConfig()
    runner, run_dir = build(simulator, data_width, config)
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "bench.json"
        outcome = run_tests(runner, run_dir, config, testcase="bench", test_module="inwire_hdl.cocotb.bench",
                            extra_env={"INWIRE_BENCH_OUT": str(out)}, results_name="bench.xml")
        if not outcome or not all(outcome.values()) or not out.exists():
            raise SimulationError(f"benchmark simulation failed, see {run_dir / 'bench.log'}")
        return json.loads(out.read_text())


def run(config=None, simulators=SIMULATORS, widths=WIDTHS):
    """Throughput (accepted input beats per cycle, per traffic mix), latency and simulated cycles per
    wall-clock second, for each data width and simulator."""
    config = config or AggregatorConfig()
    results = {"config": {"slots": config.slots, "max_elements": config.max_elements,
                          "max_fanin": config.max_fanin}, "widths": {}}
    for width in widths:
        measured = {simulator: measure(simulator, width, config) for simulator in simulators}
        first = measured[simulators[0]]
        results["widths"][str(width)] = {
            "throughput": first["throughput"],
            "latency_cycles": first["latency_cycles"],
            "cycles_per_second": {simulator: m["cycles_per_second"] for simulator, m in measured.items()},
            "simulators_agree": all(m["throughput"] == first["throughput"]
                                    and m["latency_cycles"] == first["latency_cycles"]
                                    for m in measured.values()),
        }
    return results


if __name__ == "__main__":
    print(json.dumps(run(), indent=2))
