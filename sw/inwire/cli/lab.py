"""A wide-area network emulated on this machine (root): every city a network namespace, every link shaped
(tbf) and delayed (a user-space link process), routes along the topology's shortest paths. The emulator is
checked link by link (UDP delay probe, iperf3 TCP and UDP) and refuses to time anything when a link is off
by more than 10 %. Then each synchronization strategy sums the same vector of every island, several times:
the planner's schedule and the global clique and reduction tree through `inwire serve` in the cities, and
gloo's all_reduce over TCP. Measured medians are printed beside the cost model's predictions (docs/lab.md).
"""

import contextlib
import json
import math
import os
import shutil

from .. import extras, progress
from ..output import check_outputs_apart
from .options import check_integer, check_range, check_seed, decimal, topology_file, whole

MB = (1e-6, 64.0)
"""--mb: from one byte (one int32 element) to 64 MB, which takes minutes per repetition at the lab's rates."""
DELAY_SCALE = (0.01, 20.0)
"""--delay-scale: below 0.01 a 100 ms link is delayed 1 ms, less than twice what the link process itself
adds; above 20 it is delayed 2 s, and a round of doublezero9 takes many seconds."""
RATE_SCALE = (1e-4, 0.05)
"""--rate-scale: below 1e-4 a 1 Gb/s link carries 100 kb/s, some 25 full frames in the link check's 3
seconds; above 0.05 the 10 Gb/s links become 500 Mb/s ones, more than the link process carries on two cores."""


def add_arguments(parser):
    parser.add_argument("--topology", default="doublezero9", help="built-in name or topology JSON file")
    parser.add_argument("--islands", default=None, help="comma-separated island cities (default: every city)")
    parser.add_argument("--mb", type=decimal("--mb"), default=0.5, metavar="MB",
                        help="vector size per island, MB (int32 through inwire, float32 through gloo)")
    parser.add_argument("--delay-scale", type=decimal("--delay-scale"), default=4.0,
                        help="multiply every link's delay by this (the link process adds about 0.2-0.5 ms per "
                             "direction: at 4 the shortest doublezero9 link, 1.45 ms, stays within the check's 10 %%)")
    parser.add_argument("--rate-scale", type=decimal("--rate-scale"), default=0.002,
                        help="multiply every link's rate by this")
    parser.add_argument("--loss", type=decimal("--loss"), default=0.0, metavar="P",
                        help="drop this fraction on every link")
    parser.add_argument("--reps", type=whole("--reps"), default=5, metavar="N", help="repetitions of each strategy")
    parser.add_argument("--strategies", default=None,
                        help="comma-separated, from schedule, rotation, global_clique, global_tree, host_tree, "
                             "host_tree_tuned, gloo, gloo_tuned, mpi_ring, mpi_tree (default: all; _tuned: over TCP "
                             "with reno and no slow start after idle, the others with the namespaces' own TCP "
                             "settings)")
    parser.add_argument("--window", type=whole("--window"), default=None, metavar="CHUNKS",
                        help="chunks each island keeps in flight (default: the whole vector, up to 1024)")
    parser.add_argument("--seed", type=whole("--seed"), default=0, help="seed of the planner and the test vectors")
    parser.add_argument("--check-only", action="store_true", help="check the emulated links and stop")
    parser.add_argument("--out-dir", default=None, metavar="DIR", help="write lab.json and lab.png here")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")


def run(args):
    """`inwire lab`."""
    from ..host_bench import load_average
    from ..lab.emulator import TCP_TUNED, WanLab, refuse_unless_ok
    from ..lab.measure import (
        STRATEGIES,
        Measurement,
        plan_strategies,
        queue_bytes_for,
        ranking,
        ranking_disagreements,
    )
    from ..plan.topology import load_topology

    check_range("--mb", args.mb, *MB, "MB", "one byte to minutes per repetition")
    check_range("--delay-scale", args.delay_scale, *DELAY_SCALE, why="a 100 ms link delayed 1 ms to 2 s")
    check_range("--rate-scale", args.rate_scale, *RATE_SCALE,
                why="a 1 Gb/s link at 100 kb/s, a 10 Gb/s one at 500 Mb/s")
    check_integer("--reps", args.reps, 1, 100)
    if args.window is not None:
        check_integer("--window", args.window, 1, 1024)
    check_seed(args.seed)
    if not 0 <= args.loss < 0.5:
        raise ValueError(f"--loss must lie in [0, 0.5), got {args.loss}")
    names = tuple(args.strategies.split(",")) if args.strategies else STRATEGIES
    for name in names:
        if name not in STRATEGIES:
            raise ValueError(f"unknown strategy {name!r}: choose from {', '.join(STRATEGIES)}")
    if "gloo" in names or "gloo_tuned" in names:
        extras.require("torch", "the gloo strategies (leave them out of --strategies to run the others)")
    if any(name.startswith("mpi") for name in names):
        extras.require("lab", "the MPI strategies (leave them out of --strategies to run the others)")
        if shutil.which("mpirun") is None:
            raise ValueError("the MPI strategies need mpirun (Debian's openmpi-bin: make setup installs it); "
                             "leave them out of --strategies to run the others")
    if args.out_dir:
        check_outputs_apart([("--out-dir", os.path.join(args.out_dir, name)) for name in ("lab.json", "lab.png")],
                            {"--topology": topology_file(args.topology)})
    topology = load_topology(args.topology)
    islands = topology.resolve_islands(args.islands.split(",") if args.islands else None)
    vector_bytes = round(args.mb * 1e6)
    progress.say(f"planning for {topology.name} at delay x{args.delay_scale:g}, rate x{args.rate_scale:g}")
    strategies = plan_strategies(topology, islands, vector_bytes, args.delay_scale, args.rate_scale, args.seed,
                                 names)
    report = {"topology": topology.name, "islands": list(islands), "vector_bytes": vector_bytes,
              "delay_scale": args.delay_scale, "rate_scale": args.rate_scale, "loss": args.loss, "reps": args.reps,
              "seed": args.seed,
              "real_network_vector_bytes": round(vector_bytes / (args.delay_scale * args.rate_scale)),
              "load_average_1min_before": load_average()}
    with WanLab(topology, args.delay_scale, args.rate_scale, args.loss,
                queue_bytes_for(islands, vector_bytes, args.window)) as lab:
        progress.say(f"{len(lab.cities)} cities and {len(lab.links)} links emulated; checking every link")
        rows = lab.check()
        report["emulator_check"] = rows
        if args.check_only:
            return _finish(report, args, rows_only=True)
        refuse_unless_ok(rows)
        entries = []
        with Measurement(lab, islands, vector_bytes, strategies, args.reps, args.seed,
                         window=args.window) as measurement:
            report["chunk_elements"], report["window"] = measurement.chunk, measurement.window
            for strategy in strategies:
                progress.say(f"{strategy.name}: {strategy.description}, {args.reps} repetitions")
                before = lab.link_bytes()
                with lab.tcp(TCP_TUNED) if strategy.tuned else contextlib.nullcontext(lab.tcp_settings()) as tcp:
                    entries.append(_measure(measurement, strategy, tcp, before))
    report["link_process"] = lab.relay_counters  # the link process's own counters, read as it stopped
    report["strategies"] = entries
    report["ranking_measured"] = ranking(entries, "measured_ms")
    report["ranking_predicted"] = ranking(entries, "predicted_ms")
    report["ranking_disagreements"] = [list(pair) for pair in ranking_disagreements(entries)]
    report["rankings_agree"] = not report["ranking_disagreements"]
    report["load_average_1min_after"] = load_average()
    return _finish(report, args)


def _measure(measurement, strategy, tcp, before):
    """`strategy` timed and summarized, with the bytes on every link: one over TCP with the `tcp` settings it ran
    with and the bytes of its whole run (`before`: `WanLab.link_bytes` as it started), an inwire one against the
    once-per-link bound."""
    from ..lab.measure import link_report, summarize

    lab = measurement.lab
    if strategy.name.startswith("gloo"):
        times, late, error = measurement.gloo(strategy)
        return summarize(strategy, times, ranks=list(strategy.order), start_late_s=round(late, 4),
                         max_abs_error=error, tcp=tcp, link_bytes_whole_run=_carried(lab, before),
                         predicted_as="the cost model's ring exchange in rank order")
    if strategy.name.startswith("mpi"):
        times, late, error = measurement.mpi(strategy)
        return summarize(strategy, times, ranks=list(strategy.order), start_late_s=round(late, 4),
                         max_abs_error=error, tcp=tcp, link_bytes_whole_run=_carried(lab, before),
                         mpirun_reruns=measurement.mpirun_reruns.get(strategy.name, 0),
                         predicted_as="the cost model's ring exchange in rank order" if strategy.name == "mpi_ring"
                         else "the cost model's host-tree exchange (a latency-shortest-path tree, not MPI's binary)")
    if strategy.name.startswith("host_tree"):
        times, late, error = measurement.host_tree(strategy)
        return summarize(strategy, times, members=list(strategy.order), start_late_s=round(late, 4),
                         max_abs_error=error, tcp=tcp, link_bytes_whole_run=_carried(lab, before),
                         predicted_as="the cost model's host-tree exchange")
    times, retransmits, carried, bound = measurement.inwire(strategy)
    return summarize(strategy, times, retransmits=retransmits, bit_exact=True,
                     rounds=[[{"members": list(m), "aggregator": root, "tree": tree} for m, root, tree in cliques]
                             for cliques in strategy.rounds],
                     **link_report(lab.directions, carried, bound))


def _carried(lab, before):
    """The bytes each link direction carried since `before` (`WanLab.link_bytes`): for the TCP strategies, their
    whole run (every repetition, the host tree's warm-up, connection set-up and acknowledgements), named."""
    after = lab.link_bytes()
    return {f"{a}->{b}": after[a, b] - before[a, b] for a, b in lab.directions}


def _finish(report, args, rows_only=False):
    if args.out_dir:
        os.makedirs(args.out_dir, exist_ok=True)
        with open(os.path.join(args.out_dir, "lab.json"), "w") as handle:
            json.dump(report, handle, indent=1)
            handle.write("\n")
        if not rows_only:
            from ..lab.plot import plot_lab

            plot_lab(report, os.path.join(args.out_dir, "lab.png"))
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        print(format_report(report))
    return 0 if all(row["ok"] for row in report["emulator_check"]) else 1


def format_report(report):
    lines = [f"{report['topology']}: {len(report['islands'])} islands x {report['vector_bytes'] / 1e6:g} MB, delay "
             f"x{report['delay_scale']:g}, rate x{report['rate_scale']:g} (the real network with "
             f"{report['real_network_vector_bytes'] / 1e6:g} MB vectors, {report['delay_scale']:g}x slower)"]
    lines.append(f"{'link':<12} {'delay ms':>9} {'measured':>9} {'TCP Mb/s':>9} {'expected':>9} {'UDP Mb/s':>9} "
                 f"{'expected':>9}  ok")
    for row in report["emulator_check"]:
        lines.append(f"{row['link']:<12} {row['delay_ms']:>9.2f} {_number(row['measured_delay_ms']):>9} "
                     f"{_number(row['tcp_mbps']):>9} {row['tcp_expected_mbps']:>9.2f} {_number(row['udp_mbps']):>9} "
                     f"{row['udp_expected_mbps']:>9.2f}  {'yes' if row['ok'] else 'NO: ' + '; '.join(row['problems'])}")
    if "strategies" in report:
        lines.append(f"{'strategy':<16} {'measured ms':>12} {'spread':>8} {'predicted':>10} {'ratio':>6}  TCP")
        for entry in report["strategies"]:
            ratio = entry["measured_over_predicted"]
            lines.append(f"{entry['name']:<16} {entry['measured_ms']:>12.1f} {entry['spread_ms']:>8.1f} "
                         f"{entry['predicted_ms']:>10.1f} {'' if ratio is None else f'{ratio:.3f}':>6}  "
                         f"{_tcp(entry.get('tcp'))}")
        for entry in report["strategies"]:
            if entry.get("link_bytes_over_bound") is not None:
                over = entry["links_over_bound"]
                lines.append(f"{entry['name']}: link bytes / once-per-link bound: {entry['link_bytes_over_bound']:.2f}"
                             + (f"; more than once on {', '.join(over)}" if over else ""))
        lines.append(f"measured ranking:  {', '.join(report['ranking_measured'])}")
        lines.append(f"predicted ranking: {', '.join(report['ranking_predicted'])} (predictions within "
                     f"5 % of each other are ties)")
        for fast, slow in report["ranking_disagreements"]:
            lines.append(f"the model has {fast} faster than {slow}; measured, it is slower")
    return "\n".join(lines)


def _tcp(settings):
    """A strategy's TCP settings in brief: its congestion control, and whether it restarts slow start after idle."""
    if not settings:
        return ""
    restart = "" if settings["net.ipv4.tcp_slow_start_after_idle"] != "0" else "no "
    return f"{settings['net.ipv4.tcp_congestion_control']}, {restart}slow start after idle"


def _number(value):
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.2f}"

