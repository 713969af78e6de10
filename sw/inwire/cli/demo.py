"""A lab on one machine (root): the aggregator and every island in network namespaces joined by a bridge,
each island's link delayed by the topology's latency to its clique's aggregation city times --scale."""

import json
import os
import tempfile
from dataclasses import replace

from .. import progress
from ..netns import LabError, demo_schedule, run_lab, unavailable_reason
from ..serve import parse_counters_line
from ..stream import StreamConfig, format_report, load_plan
from .options import check_positive, decimal, whole

MAX_SCALE = 100.0
"""Largest --scale: at 100 a 100 ms link delays each datagram 10 s, and a round of doublezero9 takes minutes."""


def add_arguments(parser):
    parser.add_argument("--schedule", default=None, metavar="FILE",
                        help="schedule JSON (default: optimize one for doublezero9)")
    parser.add_argument("--rounds", type=whole("--rounds"), default=4, metavar="N", help="rounds to run")
    parser.add_argument("--elements", type=whole("--elements"), default=2048, metavar="N",
                        help="gradient elements per island")
    parser.add_argument("--scale", type=decimal("--scale"), default=0.1,
                        help="multiply the topology's latencies by this")
    parser.add_argument("--loss", type=decimal("--loss"), default=0.0, metavar="P",
                        help="drop this fraction of outgoing datagrams on purpose")
    parser.add_argument("--seed", type=whole("--seed"), default=0, help="seed of the test gradients and of --loss")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")


def run(args):
    """`inwire demo`."""
    check_positive("--scale", args.scale, MAX_SCALE, why="x100 makes a link of 100 ms one of 10 s")
    # The options are checked before the namespaces and the schedule; the timeout follows from the schedule.
    config = StreamConfig(rounds=args.rounds, elements=args.elements, seed=args.seed, loss=args.loss,
                          job=int.from_bytes(os.urandom(4), "big"))
    # A schedule given is checked before the namespaces: its error is the one to fix first.
    plan = None if args.schedule is None else load_plan(args.schedule)
    reason = unavailable_reason()
    if reason:
        raise LabError(f"network namespaces unavailable: {reason}")
    if plan is None:
        with tempfile.TemporaryDirectory() as scratch:
            schedule = os.path.join(scratch, "schedule.json")
            progress.say("optimizing the schedule for doublezero9")
            demo_schedule(schedule)
            plan = load_plan(schedule)
    worst_ms = max(plan.topology.latency_ms(a, b) for a in plan.islands for b in plan.topology.cities)
    config = replace(config, timeout_ms=max(200.0, 4 * worst_ms * args.scale))
    progress.say(f"{len(plan.islands)} islands and the aggregator in network namespaces, latencies "
                 f"x{args.scale:g}, {config.rounds} rounds")
    with progress.counting(config.rounds, "round") as advance:
        report, final = run_lab(plan, config, args.scale, lambda _round: advance())
    report["target"] = f"netns lab, latencies x{args.scale:g}"
    report["aggregator_final"] = parse_counters_line(final)
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        print(format_report(report, report["target"]))
        print(final)
    return 0 if report["bit_exact"] else 1
