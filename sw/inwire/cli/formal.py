"""Run the formal checks of the aggregator with SymbiYosys (YoWASP) and print the table: property, data
width, method (k-induction, bounded model check or cover), engine, depth, the first step at which the
row's cover is reached, the row's mutants with their results, result on the real core, time and, for a
failure, the counterexample trace. Jobs go to build/formal under the working directory; exit status 1
unless every check passes on the real core and every mutant fails."""

from .options import check_integer, decimal, whole

MAX_TIMEOUT_S = 7 * 86_400
"""Longest --timeout: a week per solver run; the deepest rows take hours."""
MAX_JOBS = 256
"""Most solver runs at the same time: far more than a machine has cores for, and than --deep has runs."""


def add_arguments(parser):
    parser.add_argument("--jobs", type=whole("--jobs"), default=2, help="checks run at the same time")
    parser.add_argument("--only", nargs="*", help="run only the checks with these names (or job names)")
    parser.add_argument("--width", type=whole("--width"), choices=(8, 64), help="run only this data width")
    parser.add_argument("--deep", action="store_true", help="also the runs too slow for CI (the rows mark them)")
    parser.add_argument("--timeout", type=decimal("--timeout", 1, MAX_TIMEOUT_S, "s", "a week per solver run"),
                        default=900, help="seconds per solver run (then TIMEOUT)")


def chosen_checks(checks, only, width):
    """The checks `--only` and `--width` select; ValueError for a name no check has, or an empty choice, so
    that a typo is not an empty table and exit status 0."""
    names = sorted({check.name for check in checks})
    unknown = [name for name in only or () if name not in names and all(name != check.job for check in checks)]
    if unknown:
        raise ValueError(f"--only: no check named {', '.join(map(repr, unknown))}; the checks are {', '.join(names)} "
                         f"(or a row's job name, e.g. {checks[0].job})")
    chosen = [check for check in checks
              if (not only or check.name in only or check.job in only) and width in (None, check.width)]
    if not chosen:
        raise ValueError(f"--only {' '.join(only or ())} has no check at --width {width}")
    return chosen


def run(args):
    from inwire_hdl.formal import CHECKS, run_all, summary

    # Checked before run_all, which empties build/formal first.
    check_integer("--jobs", args.jobs, 1, MAX_JOBS, "solver runs at the same time")
    rows = run_all(chosen_checks(CHECKS, args.only, args.width), jobs=args.jobs, timeout=args.timeout,
                   deep=args.deep)
    print(summary(rows))
    return 0 if all(row.ok for row in rows) else 1
