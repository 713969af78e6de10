"""Run the formal checks of the aggregator with SymbiYosys (YoWASP) and print the table: property, data
width, method (k-induction, bounded model check or cover), engine, depth, result, time and, for a failure,
the counterexample trace. Jobs go to build/formal under the working directory; exit status 1 unless every
check passes."""


def add_arguments(parser):
    parser.add_argument("--jobs", type=int, default=2, help="checks run at the same time")
    parser.add_argument("--only", nargs="*", help="run only the checks with these names")
    parser.add_argument("--width", type=int, choices=(8, 64), help="run only this data width")
    parser.add_argument("--deep", action="store_true", help="also the checks too deep for CI")


def run(args):
    from inwire_hdl.formal import CHECKS, DEEP_CHECKS, run_all, summary

    checks = [c for c in CHECKS + (DEEP_CHECKS if args.deep else [])
              if (not args.only or c.name in args.only) and args.width in (None, c.width)]
    outcomes = run_all(checks, jobs=args.jobs)
    print(summary(outcomes))
    return 0 if all(outcome.status == "PASS" for outcome in outcomes) else 1
