"""Run one island per city of a schedule against an aggregator, round by round, and check every result
bit for bit against the sum the islands compute themselves (exit status 1 unless all are bit-exact).

Targets: udp://HOST:PORT (a software aggregator, a board or a relay), udp:FILE (one aggregator per city,
FILE a JSON object {"CITY": "IPv4:PORT", ...} on one port: the islands follow the schedule's reduction
trees), pcap:FILE (the golden model, frames written to a capture), sim:icarus|verilator[:WIDTH] (the
gateware in co-simulation; one per aggregator city when the schedule has trees) and iface:NAME (raw
frames through a NIC, root). A target with one aggregator sums every clique flat and ignores the trees.

Over UDP the run is a registered job (docs/protocol.md, Registered jobs): a random job id and token, the
islands' sockets as its members and the slots the run needs as its quota, registered with the aggregator
(`inwire serve`, the operator key of `control.load_key`) before the first datagram, renewed while it runs and
torn down after; the islands send version 3 frames and take results only from the aggregator they sent to,
with the job's token. With udp:FILE each city's aggregator is registered with its own entry
(`plan.tables.job_entries`): the islands that send to it and its route in every clique's tree, so a tree may
have any depth. --unregistered sends version 2 frames instead, registering nothing (an aggregator that takes
unregistered frames, behind a relay or NAT that changes the islands' addresses); trees then travel in the
frames' hop fields, at most three levels.
"""

import json
import secrets
import sys
from contextlib import ExitStack
from dataclasses import replace

from .. import extras, progress
from ..control import JobLease, new_job
from ..datagram import ip_int
from ..output import check_outputs_apart, check_writable
from ..plan.tables import job_entries
from ..stream import (
    DEFAULT_CHUNK,
    DEFAULT_RETRIES,
    DEFAULT_TIMEOUT_MS,
    DEFAULT_WINDOW,
    UNREGISTRABLE_JOB,
    DeepTreeError,
    StreamConfig,
    StreamError,
    Workload,
    aggregator_cities,
    format_report,
    has_trees,
    load_plan,
    make_transport,
    parse_target,
    registration_patience,
    run_stream,
)
from .options import decimal, topology_file, whole

MAX_RETRIES = 1000
"""Most retransmissions of one chunk: at the longest --timeout-ms, a minute, 1,000 already wait 17 hours."""


def add_arguments(parser):
    parser.add_argument("--target", required=True, metavar="TARGET",
                        help="udp://HOST:PORT, udp:FILE (JSON {\"CITY\": \"IPv4:PORT\", ...}: one aggregator per "
                             "city, all on one port, for a schedule's reduction trees), pcap:FILE, "
                             "sim:icarus|verilator[:WIDTH] (one per aggregator city with trees) or iface:NAME")
    parser.add_argument("--schedule", required=True, metavar="FILE", help="schedule JSON (inwire schedule)")
    parser.add_argument("--rounds", type=whole("--rounds"), default=4, metavar="N", help="rounds to run")
    parser.add_argument("--elements", type=whole("--elements"), default=1024, metavar="N",
                        help="gradient elements per island")
    parser.add_argument("--seed", type=whole("--seed"), default=0, metavar="S",
                        help="seed of the test gradients and of --loss")
    parser.add_argument("--loss", type=decimal("--loss"), default=0.0, metavar="P",
                        help="drop this fraction of outgoing datagrams on purpose")
    parser.add_argument("--window", type=whole("--window"), default=DEFAULT_WINDOW, metavar="W",
                        help="chunks in flight per island")
    parser.add_argument("--timeout-ms", type=decimal("--timeout-ms"), default=DEFAULT_TIMEOUT_MS, metavar="T",
                        help="retransmit a chunk after T ms without its result")
    parser.add_argument("--retries", type=whole("--retries", 1, MAX_RETRIES, "17 hours at a minute's timeout"),
                        default=DEFAULT_RETRIES, metavar="N",
                        help="retransmissions of one chunk before the round is given up")
    parser.add_argument("--chunk", type=whole("--chunk"), default=DEFAULT_CHUNK, metavar="N",
                        help="elements per frame (at most the aggregator's maximum)")
    parser.add_argument("--job", type=whole("--job"), default=None, metavar="ID",
                        help="job identifier (default: random; pass one for a capture that repeats byte for byte). "
                             "Over UDP the job is registered with the aggregator (udp:FILE: each city's, with its "
                             "part of the trees) with a random token, and the islands send version 3 frames")
    parser.add_argument("--unregistered", action="store_true",
                        help="over UDP: send version 2 frames and register no job (for aggregators that take "
                             "unregistered frames, through a relay or NAT that changes the islands' addresses, "
                             "which a job's member table would not name); trees then climb at most 3 levels")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")


def run(args):
    """`inwire stream`: exit 0 when every round finished bit-exact, 1 otherwise."""
    target = parse_target(args.target)
    if target.kind == "sim":
        extras.require("sim", "--target sim:")
    plan = load_plan(args.schedule)
    if target.kind == "pcap":
        check_outputs_apart({"--target pcap:": target.value},
                            {"--schedule": args.schedule, "its topology": topology_file(plan.topology.source)})
    # Over UDP a registered job: one aggregator's, or each city's with its part of the trees.
    registered = target.kind == "udp" and not args.unregistered
    if registered and args.job == 0:
        raise StreamError(UNREGISTRABLE_JOB)
    job = args.job if args.job is not None else 1 + secrets.randbelow(2**32 - 1)
    config = StreamConfig(rounds=args.rounds, elements=args.elements, seed=args.seed, loss=args.loss,
                          window=args.window, timeout_ms=args.timeout_ms, chunk=args.chunk, retries=args.retries,
                          job=job)
    cities = aggregator_cities(plan)
    if target.kind == "udp" and isinstance(target.value, dict):
        missing = [city for city in cities if city not in target.value]
        if missing:
            raise StreamError(f"target {target.text}: no address for aggregator city {', '.join(missing)} (every "
                              f"clique's root and tree city needs one)")
        addresses = {city: ip_int(target.value[city][0]) for city in cities}
    elif target.kind == "sim" and has_trees(plan):
        addresses = dict.fromkeys(cities, 0)  # the transport numbers them; here only the routes are checked
    else:
        addresses = None
        if has_trees(plan):
            print(f"inwire stream: target {target.text} is one aggregator: the schedule's reduction trees are "
                  f"ignored, every clique is summed there", file=sys.stderr)
    try:
        workload = Workload(plan, config, addresses, registered)
    except DeepTreeError as error:
        if target.kind != "udp":
            raise
        raise StreamError(f"{error}: --unregistered carries the route in the frame (registered, the aggregators' "
                          f"tables hold a tree of any depth)") from None
    workload.check_resources(target.kind)
    if target.kind == "pcap":
        check_writable(target.value, "--target pcap:")
    transport = make_transport(target, plan, workload.slots_needed, config)
    leases = []
    if registered:
        # The job's members are the islands' sockets, opened now, before it is registered.
        bound = transport.bind_islands()
        entry = new_job(bound.values(), workload.slots_needed)
        if args.job is not None:
            entry = replace(entry, job=args.job)
        config = replace(config, job=entry.job, token=entry.token)
        timeout_s, retries = registration_patience(config)
        if addresses is None:
            leases.append(JobLease(target.value, entry, timeout_s=timeout_s, retries=retries))
        else:
            endpoints = {city: (ip_int(host), port) for city, (host, port) in transport.aggregators.items()}
            islands = {island: (ip_int(host), port) for island, (host, port) in bound.items()}
            entries = job_entries(entry, plan, islands, endpoints)
            for city in endpoints:
                held = entries.get(city, replace(entry, members=frozenset(), routes={}))
                if not held.members:
                    # No island sends to this aggregator (it only sums the levels below): the island that asks for
                    # its counters is its member, which also gives its lease a member to leave at the end.
                    held = replace(held, members={islands[workload.stats_asker(city)]})
                leases.append(JobLease(transport.aggregators[city], held, timeout_s=timeout_s, retries=retries))
    with ExitStack() as stack:
        for lease in leases:
            stack.enter_context(lease)
        advance = stack.enter_context(progress.counting(config.rounds, "round"))
        report = run_stream(plan, config, transport, lambda _round: advance(), target.kind)
    if target.kind == "pcap":
        transport.write_capture()
    report["target"] = target.text
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        print(format_report(report, target.text))
    if not report["finished"]:
        failure = next(r["failure"] for r in report["rounds"] if not r["finished"]) if any(
            not r["finished"] for r in report["rounds"]) else "not every round ran"
        print(f"inwire stream: {failure}", file=sys.stderr)
    for cause in report["diagnosis"]:
        print(f"inwire stream: {cause}", file=sys.stderr)
    return 0 if report["bit_exact"] else 1
