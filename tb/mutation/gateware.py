"""`make mutate`, gateware half: the mutants of hdl/inwire_hdl/mutants.py against the directed cocotb tests that
name them, the CI's fuzz stream and formal, each scored apart.

directed: each mutant's Verilog in place of the aggregator's (`sim.build(..., mutant=name)`), built on Icarus at
8 bytes in the cocotb suite's configuration (tests/traffic.py GATEWARE_CONFIG: job tables beside versions 1 and
2) as tests/test_gateware_sim.py builds the real one, and only the tests of
tb/aggregator/test_aggregator.py that `DIRECTED` names for it: the ones written for that fault. A mutant that
`DIRECTED` does not name (a new one) runs every test of the file. cocotb: every test of the file against every
mutant (about an hour on two cores; not in the default targets).

fuzz: the mutant built in tests/test_fuzz.py's fuzz configuration (the suite's, so the same build) and the CI's
Icarus stream at 8 bytes (its seed and frame count; `--fuzz-frames` changes the count) through
tb/fuzz/fuzz_cocotb.py: registered jobs installed, the golden model as scoreboard, every frame accounted for,
then a clean round.

Under each simulation target the real aggregator runs first: a mutant is killed by a test that fails on it and
passes on the real aggregator (a test that fails on both says nothing about the mutant). Two simulations at a
time (`--jobs`).

formal: each mutant under the rows of `inwire formal` that name it (`Check.mutants`, and `deep_mutants` at
64 bytes; the 8-byte `--deep` mutant runs take minutes each and stay with `inwire formal --deep`): killed
when one of them FAILs. A mutant no row names is counted apart ("no row").

Prints killed / survived per target and lists the survivors; build/mutation/gateware/report.md has a line
per mutant and a column per target (the tests and rows that caught it). Run from the repository's root:
`PYTHONPATH=tb/aggregator:tb/fuzz:tb/coverage python tb/mutation/gateware.py [--target directed|cocotb|fuzz|formal]
[--sample N --seed S] [mutant ...]`.
"""

import argparse
import importlib.util
import random
import sys
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path

from inwire_hdl import formal, mutants, sim

BUILD = Path("build/mutation/gateware")
SIMULATOR = "icarus"
FORMAL_TIMEOUT = 900
"""Seconds per solver run, as `inwire formal`'s default."""
TARGETS = ("directed", "cocotb", "fuzz", "formal")
DEFAULT_TARGETS = ("directed", "fuzz", "formal")

DIRECTED = {
    "unstable": (),  # a sink samples tdata only when it moves: formal's output_protocol sees it, no test can
    "ragged": ("one_clique",),
    "spurious": ("one_clique",),
    "early_count": (),  # counters read once the frames are out: formal's counters_conserve sees it, no test can
    "stall_input": ("one_clique",),
    "stall_output": ("one_clique",),
    "corrupt_first": ("one_clique",),
    "corrupt_tail": ("one_clique",),
    "drop_second": ("interleaved_cliques_and_jobs",),
    "corrupt_sum": ("one_clique",),
    "corrupt_trailer": ("overflow_saturates_and_flags",),
    "never_answer": ("retransmit_after_completion",),
    "stale_memory": ("back_to_back_same_slot",),
    "no_lease": ("lease_frees_an_idle_slot",),
    "lease_early": ("lease_frees_an_idle_slot", "lease_kept_by_accepted_contributions"),
    "sender_overlap": ("tree_root_partial_before_between_and_after_leaves", "members_32_to_63"),
    "no_route": ("forged_hops_dropped_as_route",),
    "hops_kept": ("tree_child_partial_up_and_again_after_loss",),
    "stale_claims": ("stale_copy_never_evicts_a_newer_chunk",),
    "lease_unwrapped": ("lease_across_the_timer_wrap",),
    "stamp_at_claim": ("lease_kept_by_accepted_contributions",),
    "carry_lost": ("saturated_partial_completes_a_level",),
    "carry_counted": ("tree_saturation_below_carried_up",),
    "hop2_expect_lost": ("every_hop_field_set",),
    "members_low32": ("members_32_to_63",),
    "partials_resend_uncounted": ("tree_child_partial_up_and_again_after_loss",),
    "source_route": ("forged_hops_dropped_as_route",),
    "token_unchecked": ("registered_job_refuses_what_its_tables_do_not_allow",
                        "registered_and_stranger_traffic_mixed_under_backpressure"),
    "source_unchecked": ("registered_job_refuses_what_its_tables_do_not_allow",
                         "registered_and_stranger_traffic_mixed_under_backpressure"),
    # Routes only: the suite's gateware holds none (tests/test_gateware_tree.py and formal's tree row see them).
    "partial_to_group": (),
    "relay_twice": (),
}
"""The cocotb tests written for each mutant's fault: the directed suite's score is theirs alone."""


def tests_module(name):
    """tests/<name>.py, loaded from its file: the tests folder is no package, and the path is not this process's to
    change. Registered under its name, so that the next one's `from traffic import ...` finds it."""
    if name not in sys.modules:
        source = Path(__file__).resolve().parents[2] / "tests" / f"{name}.py"
        spec = importlib.util.spec_from_file_location(name, source)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules[name] = module
    return sys.modules[name]


def suite_config():
    """The configuration the cocotb suite builds the gateware in (tests/traffic.py)."""
    return tests_module("traffic").GATEWARE_CONFIG


def fuzz_stream():
    """(configuration, seed, frames) of the CI's Icarus fuzz at 8 bytes, from tests/test_fuzz.py."""
    suite_config()
    test_fuzz = tests_module("test_fuzz")
    return test_fuzz.FUZZ_CONFIG, 8 + test_fuzz.SEED_OFFSET[SIMULATOR], test_fuzz.CI_FRAMES[SIMULATOR, 8]


def simulate(name, target, tests, fuzz):
    """{test: passed} of `tests` (None: the whole file) or the fuzz on mutant `name` (None: the real aggregator);
    {} when the simulation ended without results (every test then counts as failed)."""
    try:
        if target == "fuzz":
            config, seed, frames = fuzz
            runner, build_dir = sim.build(SIMULATOR, 8, config, build_root=BUILD / "fuzz", mutant=name)
            return sim.run(runner, build_dir, config, test_module="fuzz_cocotb", results_name="fuzz.xml",
                           extra_env={"INWIRE_FUZZ_FRAMES": str(frames), "INWIRE_FUZZ_SEED": str(seed)})
        config = suite_config()
        runner, build_dir = sim.build(SIMULATOR, 8, config, build_root=BUILD / "sim", mutant=name)
        return sim.run(runner, build_dir, config, testcase=list(tests) if tests is not None else None)
    except sim.SimulationError as error:
        print(f"{target} {name or 'real'}: {error}")
        return {}


def tests_for(name, target):
    if target == "directed" and name in DIRECTED:
        return DIRECTED[name]
    return None


def run_simulations(names, target, jobs, fuzz):
    """(tests passing on the real aggregator, {mutant: failing tests among them}); a mutant whose directed
    tests are none is left out of the second."""
    names = [name for name in names if tests_for(name, target) != ()]
    wanted = None
    if target == "directed" and all(name in DIRECTED for name in names):
        wanted = sorted({test for name in names for test in DIRECTED[name]})
    real = simulate(None, target, wanted, fuzz)
    good = sorted(test for test, passed in real.items() if passed)
    if len(good) < len(real) or not real:
        print(f"{target}: failing on the real aggregator, left out of the score: "
              f"{', '.join(sorted(set(real) - set(good))) or 'no results'}")
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        outcomes = dict(zip(names, pool.map(simulate, names, [target] * len(names),
                                            [tests_for(name, target) for name in names], [fuzz] * len(names)),
                            strict=True))
    failing = {}
    for name, outcome in outcomes.items():
        selected = tests_for(name, target)
        failing[name] = [test for test in good if (selected is None or test in selected)
                         and not outcome.get(test, False)]
    return good, failing


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


def score_simulations(names, target, jobs, fuzz, cells, killed_by):
    good, failing = run_simulations(names, target, jobs, fuzz)
    scored = [name for name in names if name in failing]
    caught = [name for name in scored if failing[name]]
    where = {"directed": "the tests DIRECTED names", "cocotb": f"all {len(good)} tests",
             "fuzz": f"{fuzz[2]} frames, seed {fuzz[1]}, then a clean round"}[target]
    print(f"{target} ({SIMULATOR}, 8 bytes, {where}): {len(caught)} killed, {len(scored) - len(caught)} survived "
          f"of {len(scored)}" + (f"; {len(names) - len(scored)} named no test" if len(scored) < len(names) else ""))
    print(f"    survived: {', '.join(name for name in scored if not failing[name]) or 'none'}")
    if len(scored) < len(names):
        print(f"    no test: {', '.join(name for name in names if name not in failing)}")
    for name in names:
        if name not in failing:
            cells[name].append("no test")
        elif failing[name]:
            cells[name].append(", ".join(failing[name]))
            killed_by[name].append(target)
        else:
            cells[name].append("**survived**")


def score_formal(names, jobs, cells, killed_by):
    results = run_formal(names, jobs)
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


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mutants", nargs="*", help="only these mutants (default: all)")
    parser.add_argument("--target", choices=TARGETS, action="append",
                        help=f"only this target, repeatable (default: {', '.join(DEFAULT_TARGETS)})")
    parser.add_argument("--sample", type=int, default=0, help="mutants run, drawn with --seed (0: all)")
    parser.add_argument("--seed", type=int, default=1, help="the sample's seed (default: 1)")
    parser.add_argument("--fuzz-frames", type=int, help="frames of the fuzz stream (default: the CI's Icarus count)")
    parser.add_argument("--jobs", type=int, default=2, help="simulations or solver runs at a time (default: 2)")
    args = parser.parse_args(argv)
    if not Path("hdl/inwire_hdl").is_dir():
        sys.exit("run from the repository's root")
    names = args.mutants or list(mutants.MUTANTS)
    unknown = set(names) - set(mutants.MUTANTS)
    if unknown:
        sys.exit(f"unknown mutant(s) {', '.join(sorted(unknown))}; choose from {', '.join(mutants.MUTANTS)}")
    if args.sample < 0 or (args.fuzz_frames is not None and args.fuzz_frames < 1):
        sys.exit(f"--sample must be 0 (all) or a positive count, --fuzz-frames positive; got {args.sample}, "
                 f"{args.fuzz_frames}")
    if args.sample and args.sample < len(names):
        names = [name for name in names if name in random.Random(args.seed).sample(names, args.sample)]
    stale = sorted(set(DIRECTED) - set(mutants.MUTANTS))
    if stale:
        print(f"directed: DIRECTED names mutants that mutants.py no longer has: {', '.join(stale)}")
    unnamed = [name for name in names if name not in DIRECTED]
    if unnamed:
        print(f"directed: no tests named for {', '.join(unnamed)}: they run every test of the file")
    targets = [target for target in TARGETS if target in (args.target or DEFAULT_TARGETS)]
    config, seed, frames = fuzz_stream()
    fuzz = (config, seed, args.fuzz_frames or frames)
    BUILD.mkdir(parents=True, exist_ok=True)

    killed_by = {name: [] for name in names}
    cells = {name: [] for name in names}
    for target in targets:
        if target == "formal":
            score_formal(names, args.jobs, cells, killed_by)
        else:
            score_simulations(names, target, args.jobs, fuzz, cells, killed_by)
    if len(targets) > 1:
        left = [name for name in names if not killed_by[name]]
        print(f"any: {len(names) - len(left)} killed, {len(left)} survived of {len(names)}")
        print(f"    survived: {', '.join(left) or 'none'}")
    lines = ["| mutant | fault | " + " | ".join(targets) + " |", "| --- | --- |" + " --- |" * len(targets)]
    lines += [f"| `{name}` | {mutants.MUTANTS[name]} | " + " | ".join(cells[name]) + " |" for name in names]
    (BUILD / "report.md").write_text("\n".join(lines) + "\n")
    print(f"    per mutant: {BUILD / 'report.md'}")


if __name__ == "__main__":
    main(sys.argv[1:])
