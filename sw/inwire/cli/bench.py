"""Run every benchmark of the project (or those given with --only) and write them into one JSON file, one
key per part, merged with the keys the file already has. Benchmarks report figures; they assert nothing.
Each section records the command that measured it and the wall time it took."""

import importlib
import json
import os
import pathlib
import platform
import shlex
import time

from .. import extras, progress
from ..output import OutputError, atomic_output, check_writable, writes_in_place
from ..plan.jsonfile import read_json

SECTIONS = {
    "schedule": "inwire.plan.bench",
    "host": "inwire.host_bench",
    "gateware": "inwire_hdl.bench",
    "board": "inwire_hdl.timing",
    "training": "inwire.train.bench",
}
"""Section name -> module whose `run()` measures it; imported only when the section runs."""
NEEDS = {"gateware": "sim", "training": "torch"}
"""Section -> the extra it needs, checked before any section runs."""


def add_arguments(parser):
    parser.add_argument("--out", default="bench/results.json", help="JSON file to write (merged with its keys)")
    parser.add_argument("--only", default=",".join(SECTIONS), help=f"comma-separated among {', '.join(SECTIONS)}")


def run(args):
    chosen = [name for name in args.only.split(",") if name]
    unknown = set(chosen) - set(SECTIONS)
    if unknown:
        raise ValueError(f"unknown sections: {', '.join(sorted(unknown))}")
    for name in chosen:
        if name in NEEDS:
            extras.require(NEEDS[name], f"the {name} section (leave it out of --only to run the others)")
    out = pathlib.Path(args.out)
    # Earlier results are merged from a regular file; a device or a pipe (/dev/stdout) gets this run's alone.
    results = read_json(out, "benchmark results", OutputError) if out.exists() and not writes_in_place(out) else {}
    if not isinstance(results, dict):
        raise OutputError(f"--out {out}: holds no JSON object of results to merge with")
    results["machine"] = {"python": platform.python_version(), "processor": platform.machine(),
                          "cores": len(os.sched_getaffinity(0))}
    out.parent.mkdir(parents=True, exist_ok=True)
    check_writable(out, "--out")
    command = shlex.join(["inwire", "bench", "--only", ",".join(chosen), "--out", args.out])
    for name in chosen:
        started = time.perf_counter()
        progress.say(f"{name} ...")
        section = importlib.import_module(SECTIONS[name]).run()
        section["command"] = command
        section["bench_wall_s"] = round(time.perf_counter() - started, 1)
        results[name] = section
    # Written once every chosen section is measured: an interrupted run leaves the file as it was.
    with atomic_output(out) as temporary:
        pathlib.Path(temporary).write_text(json.dumps(results, indent=1) + "\n")
    print(json.dumps({name: results[name] for name in chosen}, indent=1))
    return 0
