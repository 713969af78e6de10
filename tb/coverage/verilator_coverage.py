"""Verilator line and toggle coverage of the aggregator over the cocotb suite and a fuzz run.

`make coverage` (`PYTHONPATH=tb/aggregator:tb/fuzz:tb/coverage python tb/coverage/verilator_coverage.py
[--width 8] [--frames 2000]`) builds the aggregator with `--coverage-line --coverage-toggle`, runs
tb/aggregator/test_aggregator.py and tb/fuzz/fuzz_cocotb.py against it (the suite's configuration, with job
tables), merges the coverage.dat files and prints the uncovered lines and toggles, then line and toggle coverage of the
generated (System)Verilog; exits 1 below the line goal.
The report is also written to build/coverage/report_w<width>.json.
"""

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

from inwire.model import AggregatorConfig
from inwire_hdl import sim
from inwire_hdl.job_table import GATEWARE_LIMITS
from inwire_hdl.verilog import TOP, generate_verilog

BUILD_ROOT = Path("build") / "coverage"
COVERAGE_ARGS = ["--coverage-line", "--coverage-toggle"]
LINE_GOAL = 95.0
"""Percent of the core's Verilog lines that the suite must execute; `make coverage` fails below it."""


def build(width, config):
    from cocotb_tools.runner import get_runner

    build_dir = BUILD_ROOT.resolve() / f"verilator_w{width}"
    build_dir.mkdir(parents=True, exist_ok=True)
    source = build_dir / f"{TOP}.sv"
    source.write_text(generate_verilog(config, width, systemverilog=True))
    runner = get_runner("verilator")
    with sim._environment("verilator"):
        runner.build(sources=[source], hdl_toplevel=TOP, build_dir=build_dir, log_file=build_dir / "build.log",
                     build_args=sim.BUILD_ARGS["verilator"] + COVERAGE_ARGS)
    return runner, build_dir


def points(path):
    """(kind, file, line) -> hit count from a coverage.dat; kind is 'line' or 'toggle'."""
    result = defaultdict(int)
    for raw in Path(path).read_text(errors="replace").splitlines():
        if not raw.startswith("C '"):
            continue
        body, count = raw[3:].rsplit("' ", 1)
        fields = dict(item.split("\x02", 1) for item in body.split("\x01") if "\x02" in item)
        kind = "toggle" if "toggle" in fields.get("page", "") else "line"
        key = (kind, fields.get("f", "?"), int(fields.get("l", 0)), fields.get("o", ""))
        result[key] += int(count)
    return result


def summarize(merged, source):
    text = Path(source).read_text().splitlines()
    report = {}
    for kind in ("line", "toggle"):
        items = {key: hits for key, hits in merged.items() if key[0] == kind}
        covered = sum(1 for hits in items.values() if hits)
        uncovered = sorted({(key[2], key[3]) for key, hits in items.items() if not hits})
        report[kind] = {"covered": covered, "total": len(items),
                        "percent": round(100 * covered / max(1, len(items)), 1),
                        "uncovered": [f"{line}: {text[line - 1].strip()[:80] if 0 < line <= len(text) else ''}"
                                      + (f" [{what}]" if kind == "toggle" else "") for line, what in uncovered]}
    return report


def measure(width=8, frames=2000, config=None):
    """Runs the cocotb suite and a fuzz run of `frames` frames under coverage; returns the report. The
    gateware is the cocotb suite's, with job tables (whose tests need them)."""
    config = config or AggregatorConfig(registered=True, limits=GATEWARE_LIMITS)
    merged = defaultdict(int)
    runner, build_dir = build(width, config)
    for module, env in (("test_aggregator", {}), ("fuzz_cocotb", {"INWIRE_FUZZ_FRAMES": str(frames)})):
        (build_dir / "coverage.dat").unlink(missing_ok=True)
        outcome = sim.run(runner, build_dir, config, test_module=module, extra_env=env,
                          results_name=f"{module}.xml")
        failed = [test for test, passed in outcome.items() if not passed]
        if failed:
            raise RuntimeError(f"cocotb tests failed under coverage: {failed} (logs in {build_dir})")
        for key, hits in points(build_dir / "coverage.dat").items():
            merged[key] += hits
    report = summarize(merged, build_dir / f"{TOP}.sv")
    report["width"] = width
    BUILD_ROOT.mkdir(parents=True, exist_ok=True)
    (BUILD_ROOT / f"report_w{width}.json").write_text(json.dumps(report, indent=1))
    return report


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--width", type=int, default=8, choices=(8, 64))
    parser.add_argument("--frames", type=int, default=2000, help="fuzz frames")
    args = parser.parse_args(argv)
    try:
        report = measure(args.width, args.frames)
    except RuntimeError as error:
        print(error, file=sys.stderr)
        return 1
    print(json.dumps({kind: report[kind]["uncovered"] for kind in ("line", "toggle")}, indent=1))
    for kind in ("line", "toggle"):
        entry = report[kind]
        print(f"{kind} coverage: {entry['covered']}/{entry['total']} = {entry['percent']} %")
    line = report["line"]["percent"]
    if line < LINE_GOAL:
        print(f"line coverage {line} % is below the goal of {LINE_GOAL} %", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
