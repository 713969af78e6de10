"""Run the formal checks of the aggregator with SymbiYosys (YoWASP) and print the table: property, data
width, method (k-induction, bounded model check or cover), engine, depth, the first step at which the
row's cover is reached, the row's mutants with their results, result on the real core, time and, for a
failure, the counterexample trace. Jobs go to build/formal under the working directory; exit status 1
unless every check passes on the real core and every mutant fails."""


def add_arguments(parser):
    parser.add_argument("--jobs", type=int, default=2, help="checks run at the same time")
    parser.add_argument("--only", nargs="*", help="run only the checks with these names (or job names)")
    parser.add_argument("--width", type=int, choices=(8, 64), help="run only this data width")
    parser.add_argument("--deep", action="store_true", help="also the runs too slow for CI (the rows mark them)")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per solver run (then TIMEOUT)")


def run(args):
    from inwire_hdl.formal import CHECKS, run_all, summary

    checks = [c for c in CHECKS
              if (not args.only or c.name in args.only or c.job in args.only) and args.width in (None, c.width)]
    rows = run_all(checks, jobs=args.jobs, timeout=args.timeout, deep=args.deep)
    print(summary(rows))
    return 0 if all(row.ok for row in rows) else 1
