"""`make mutate`, gateware half: every mutant of hdl/inwire_hdl/mutants.py against cocotb and formal.

cocotb: each mutant's Verilog in place of the aggregator's (`sim.build(..., mutant=name)`), built on Icarus
at 8 bytes in the default configuration as tests/test_gateware_sim.py builds the real one, and every test of
tb/aggregator/test_aggregator.py run against it, whatever tests the file holds at the time. The real
aggregator runs first: a mutant is killed by a test that fails on it and passes on the real aggregator (a
test that fails on both says nothing about the mutant). Two simulations at a time.

formal: each mutant under the rows of `inwire formal` that name it (`Check.mutants`, and `deep_mutants` at
64 bytes; the 8-byte `--deep` mutant runs take minutes each and stay with `inwire formal --deep`): killed
when one of them FAILs. A mutant no row names is counted apart ("no row").

Prints killed / survived per target and lists the survivors; build/mutation/gateware/report.md has a line
per mutant (the tests and rows that caught it). Run from the repository's root:
`PYTHONPATH=tb/aggregator python tb/mutation/gateware.py [--target cocotb|formal] [--width 8|64] [mutant ...]`.
"""

import argparse
import sys
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path

from inwire_hdl import formal, mutants, sim

BUILD = Path("build/mutation/gateware")
SIMULATOR = "icarus"
FORMAL_TIMEOUT = 900
"""Seconds per solver run, as `inwire formal`'s default."""


def simulate(name, width):
    """{test: passed} of the cocotb suite on mutant `name` (None: the real aggregator)."""
    runner, build_dir = sim.build(SIMULATOR, width, build_root=BUILD / "sim", mutant=name)
    return sim.run(runner, build_dir)


def run_cocotb(names, width, jobs):
    """(tests passing on the real aggregator, {mutant: failing tests among them})."""
    real = simulate(None, width)
    good = sorted(test for test, passed in real.items() if passed)
    if len(good) < len(real):
        print(f"cocotb: failing on the real aggregator, left out of the score: "
              f"{', '.join(sorted(set(real) - set(good)))}")
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        outcomes = dict(zip(names, pool.map(simulate, names, [width] * len(names)), strict=True))
    return good, {name: [test for test in good if not outcome.get(test, False)] for name, outcome in outcomes.items()}


def formal_rows(names):
    """The rows that name each of `names`, each reduced to its mutant runs."""
    rows = []
    for check in formal.CHECKS:
        named = check.mutants + (check.deep_mutants if check.width == 64 else ())
        named = tuple(name for name in named if name in names)
        if named:
            rows.append(replace(check, mutants=named, deep_mutants=(), deep=("real", "cover")))
    return rows


def run_formal(names, jobs):
    """{mutant: [(row job, status)]} for the mutants some row names."""
    results = {}
    for row in formal.run_all(formal_rows(names), jobs=jobs, build_root=BUILD / "formal", timeout=FORMAL_TIMEOUT):
        for name, outcome in row.mutants.items():
            results.setdefault(name, []).append((row.check.job, outcome.status))
    return results


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mutants", nargs="*", help="only these mutants (default: all)")
    parser.add_argument("--target", choices=("cocotb", "formal"), action="append",
                        help="only this target (default: both)")
    parser.add_argument("--width", type=int, choices=(8, 64), default=8, help="cocotb's data width (default: 8)")
    parser.add_argument("--jobs", type=int, default=2, help="simulations or solver runs at a time (default: 2)")
    args = parser.parse_args(argv)
    if not Path("hdl/inwire_hdl").is_dir():
        sys.exit("run from the repository's root")
    names = args.mutants or list(mutants.MUTANTS)
    unknown = set(names) - set(mutants.MUTANTS)
    if unknown:
        sys.exit(f"unknown mutant(s) {', '.join(sorted(unknown))}; choose from {', '.join(mutants.MUTANTS)}")
    targets = args.target or ["cocotb", "formal"]
    BUILD.mkdir(parents=True, exist_ok=True)

    killed_by = {name: [] for name in names}
    lines = ["| mutant | fault | " + " | ".join(targets) + " |", "| --- | --- |" + " --- |" * len(targets)]
    cells = {name: [] for name in names}
    if "cocotb" in targets:
        good, failing = run_cocotb(names, args.width, args.jobs)
        caught = [name for name in names if failing[name]]
        print(f"cocotb ({SIMULATOR}, {args.width} bytes, {len(good)} tests): {len(caught)} killed, "
              f"{len(names) - len(caught)} survived of {len(names)}")
        print(f"    survived: {', '.join(name for name in names if not failing[name]) or 'none'}")
        for name in names:
            cells[name].append(", ".join(failing[name]) if failing[name] else "**survived**")
            if failing[name]:
                killed_by[name].append("cocotb")
    if "formal" in targets:
        results = run_formal(names, args.jobs)
        caught = [name for name in results if any(status == "FAIL" for _, status in results[name])]
        survived = [name for name in results if name not in caught]
        print(f"formal (the rows naming them): {len(caught)} killed, {len(survived)} survived of {len(results)} "
              f"named; {len(names) - len(results)} named by no row")
        print(f"    survived: {', '.join(survived) or 'none'}")
        print(f"    no row: {', '.join(name for name in names if name not in results) or 'none'}")
        for name in names:
            runs = results.get(name, [])
            cells[name].append(", ".join(f"{job}: {status}" for job, status in runs) or "no row")
            if name in caught:
                killed_by[name].append("formal")
    if len(targets) > 1:
        left = [name for name in names if not killed_by[name]]
        print(f"either: {len(names) - len(left)} killed, {len(left)} survived of {len(names)}")
        print(f"    survived: {', '.join(left) or 'none'}")
    lines += [f"| `{name}` | {mutants.MUTANTS[name]} | " + " | ".join(cells[name]) + " |" for name in names]
    (BUILD / "report.md").write_text("\n".join(lines) + "\n")
    print(f"    per mutant: {BUILD / 'report.md'}")


if __name__ == "__main__":
    main(sys.argv[1:])
