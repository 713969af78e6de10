"""Find the periodic sequence of cliques that reaches epsilon-consensus soonest on the aggregators it runs
on (a named profile or an `inwire build` report), beside the baselines and a lower bound; or, with
--sweep, optimize over aggregator profiles, in-path reduction, model sizes and step times and write a
table and phase plots of where rotating cliques win."""

import argparse
import itertools
import json
import math
from pathlib import Path

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen first)

from inwire import progress  # noqa: E402
from inwire.jobs import TreeError  # noqa: E402
from inwire.output import atomic_output, check_outputs_apart, check_writable  # noqa: E402
from inwire.plan.aggregator import PROFILES, load_aggregator  # noqa: E402
from inwire.plan.cost import AGGREGATE, HOST_TREE, ROUTINGS, ScheduleError  # noqa: E402
from inwire.plan.schedule_file import (  # noqa: E402
    MIXING_LEGEND,
    format_plan,
    parse_schedule,
    schedule_document,
    topology_reference,
    write_schedule,
)
from inwire.plan.schedule_map import draw_schedule_map  # noqa: E402
from inwire.plan.search import AUTO_ROUTING, global_clique_plan, plan_schedule  # noqa: E402
from inwire.plan.sensitivity import (  # noqa: E402
    BANDWIDTH_FACTORS,
    LATENCY_FACTORS,
    sensitivity_sweep,
    sensitivity_table,
)
from inwire.plan.tables import tables_document  # noqa: E402
from inwire.plan.topology import load_topology  # noqa: E402
from inwire.protocol import ROUTE_HOPS  # noqa: E402

from .options import (  # noqa: E402
    MAX_MODEL_MB,
    check_integer,
    check_positive,
    check_range,
    check_seed,
    decimal,
    earlier_spelling,
    parse_decimal,
    topology_file,
    whole,
)

DEFAULT_SWEEP_SIZES_MB = "10,100,1000"
DEFAULT_SWEEP_STEPS_MS = "0,100,1000"
DEFAULT_SWEEP_PROFILES = ",".join(PROFILES)
PLAN_DEFAULTS = {"model_mb": "100", "step_ms": "0", "aggregator": "ideal"}
SENSITIVITY_SIZES_MB = "1,100,1000"
SWEEP_DEFAULTS = {"model_mb": DEFAULT_SWEEP_SIZES_MB, "step_ms": DEFAULT_SWEEP_STEPS_MS,
                  "aggregator": DEFAULT_SWEEP_PROFILES}
"""--model-mb, --step-ms and --aggregator take one value for a plan and a comma-separated list with --sweep,
as `inwire train`'s swept options do."""
MAX_LOCAL_STEPS = 1_000_000
"""Most local steps between rounds: far beyond any period between syncs (DiLoCo takes 500)."""
HOST_NIC_GBPS = (0.001, 100_000.0)
"""--host-nic-gbps from 1 Mb/s to 100 Tb/s, beyond any NIC either way: within it the planner's transfer times
stay finite (at 1e-320 Gb/s they are infinite, and the schedule holds Infinity, which is not JSON)."""
COMPARED = ("global", "grid2d", "ring")
"""Baselines the phase diagram sets the optimum against."""


def add_arguments(parser):
    parser.add_argument("--topology", default="doublezero9", help="doublezero9 or a JSON topology file")
    parser.add_argument("--islands", help="comma-separated island cities (default: every city)")
    parser.add_argument("--model-mb", metavar="MB[,MB...]",
                        help=f"model size in MB (10^6 bytes) (default: {PLAN_DEFAULTS['model_mb']}; with --sweep a "
                             f"comma-separated list, default: {DEFAULT_SWEEP_SIZES_MB})")
    parser.add_argument("--epsilon", type=decimal("--epsilon"), default=1e-3, help="consensus target, 0 < epsilon < 1")
    parser.add_argument("--no-multicast", action="store_true", help="no city replicates results")
    parser.add_argument("--no-aggregation", action="store_true", help="no city aggregates in line")
    parser.add_argument("--aggregator", metavar="PROFILE|REPORT.json[,...]",
                        help=f"default in-line aggregator: {', '.join(PROFILES)}, or an `inwire build` report.json "
                             f"(a topology city may set its own) (default: {PLAN_DEFAULTS['aggregator']}; with "
                             f"--sweep a comma-separated list, default: every profile)")
    parser.add_argument("--reduce-in-path", action=argparse.BooleanOptionalAction, default=True,
                        help="every aggregating city on the way to a clique's root sums what it forwards, as the "
                             "gateware's trees do (default: on)")
    parser.add_argument("--tree-tables", action=argparse.BooleanOptionalAction, default=True,
                        help="the reduction trees are carried by each aggregator's tables (a registered job, "
                             "jobs.tree_routes, as inwire stream --target udp:FILE and the launcher register "
                             "them), so a tree sums at every aggregating city on the way, at any depth (default: "
                             f"on); --no-tree-tables caps them so that no member's path climbs more than "
                             f"{ROUTE_HOPS + 1} summing levels, what a version 2 frame's route names (for trees "
                             "sent unregistered: inwire stream --unregistered or --target sim:, and the lab)")
    parser.add_argument("--routing", choices=(*ROUTINGS, AUTO_ROUTING), default=AUTO_ROUTING,
                        help="latency: fixed latency-shortest paths (DoubleZero routes so); bandwidth: each "
                             "transfer takes the candidate path that completes soonest, farthest first; balanced: "
                             "flows then moved to other paths one at a time while that shortens their clique; "
                             "auto: the topology's own routing where it names one, else the sooner of latency and "
                             "balanced (default: auto; the output says which)")
    parser.add_argument("--host-nic-gbps", type=decimal("--host-nic-gbps"), metavar="GBPS",
                        help="every island's host NIC rate in and out, in Gb/s (default: unlimited)")
    parser.add_argument("--host-tree", action=argparse.BooleanOptionalAction, default=True,
                        help="let the optimizer exchange a clique on a host-side tree all-reduce (default: on; "
                             "with --no-host-tree the host-tree baseline is still printed, marked as no candidate)")
    parser.add_argument("--local-steps", type=whole("--local-steps"), default=0,
                        help="H local steps before every round; > 0 switches to the local-step objective")
    parser.add_argument("--step-ms", metavar="MS[,MS...]",
                        help=f"T, the time of one local step in ms (default: {PLAN_DEFAULTS['step_ms']}; with --sweep "
                             f"a comma-separated list, default: {DEFAULT_SWEEP_STEPS_MS}, where 0 is no local steps "
                             f"and any other --local-steps, at least 1)")
    parser.add_argument("--seed", type=whole("--seed"), default=0, help="seed of the randomized search and baselines")
    parser.add_argument("--global-clique", action="store_true",
                        help="write one clique of every island, summed at its fastest aggregating city, in place of "
                             "the optimized schedule: the clique the DDP hook sums in (inwire.train.ddp)")
    parser.add_argument("--out", help="schedule JSON to write (required unless --sweep)")
    parser.add_argument("--map", help="also draw the schedule's cliques on a map (PNG)")
    parser.add_argument("--tables", metavar="FILE.json",
                        help="also write, for every aggregator city the schedule sends to, the "
                             "route its tables hold per clique index (level bitmap, parent city, children cities "
                             "with their bitmaps; jobs.tree_routes), for the control plane (docs/schedule.md)")
    parser.add_argument("--sweep", action="store_true",
                        help="aggregator profile x reduce-in-path x model size x step time: table and phase plots")
    parser.add_argument("--out-dir", default="sweep", help="folder for the --sweep table and plots")
    parser.add_argument("--sensitivity", metavar="FILE.json",
                        help=f"plan again with every link's latency x{', x'.join(f'{f:g}' for f in LATENCY_FACTORS)} "
                             f"and bandwidth x{', x'.join(f'{f:g}' for f in BANDWIDTH_FACTORS)} at each --model-mb "
                             f"(a comma-separated list, default: {SENSITIVITY_SIZES_MB}); write which strategy wins "
                             f"at each point to FILE.json and print the table (in place of --out)")
    earlier_spelling(parser, "model_mb", "--sizes-mb")
    earlier_spelling(parser, "aggregator", "--profiles")
    earlier_spelling(parser, "step_ms", "--steps-ms")


def _settings(args):
    """--model-mb, --step-ms and --aggregator as given or by default: for a plan, one number, one number and
    one aggregator (a report's path may hold a comma); with --sweep, lists left to the sweep to read."""
    defaults = (SWEEP_DEFAULTS if args.sweep else
                {**PLAN_DEFAULTS, "model_mb": SENSITIVITY_SIZES_MB} if args.sensitivity else PLAN_DEFAULTS)
    for key, default in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, default)
    if args.sweep:
        return
    for key in ("step_ms",) if args.sensitivity else ("model_mb", "step_ms"):
        option, text = "--" + key.replace("_", "-"), getattr(args, key)
        if "," in text:
            raise ScheduleError(f"{option} must be a number (a comma-separated list only with --sweep), got {text!r}")
        try:
            setattr(args, key, parse_decimal(option, text))
        except ValueError as error:
            raise ScheduleError(str(error)) from None
    if "," in args.aggregator and not Path(args.aggregator).exists():
        raise ScheduleError(f"--aggregator takes one profile or report (a comma-separated list only with "
                            f"--sweep), got {args.aggregator!r}")


def _check_numbers(args):
    check_seed(args.seed)
    if args.host_nic_gbps is not None:
        check_range("--host-nic-gbps", args.host_nic_gbps, *HOST_NIC_GBPS, "Gb/s",
                    "1 Mb/s to 100 Tb/s, beyond any NIC either way")
    if args.local_steps < 0:
        raise ScheduleError(f"--local-steps must be 0 or more, got {args.local_steps}")
    check_integer("--local-steps", args.local_steps, 0, MAX_LOCAL_STEPS, "far beyond any period between syncs")
    if args.tables is not None and not args.tree_tables:
        raise ScheduleError(f"--tables {args.tables}: only trees carried by the aggregators' tables have tables to "
                            f"write; --no-tree-tables sends them in the frames")
    if args.sweep:
        if args.global_clique:
            raise ScheduleError("--global-clique writes one schedule; --sweep compares the optimum over settings, "
                                "give one or the other")
        if args.tables is not None:
            raise ScheduleError("--tables writes one schedule's tables; --sweep compares the optimum over settings, "
                                "give one or the other")
        return
    if not args.sensitivity:
        check_positive("--model-mb", args.model_mb, MAX_MODEL_MB, "MB", "a petabyte")
    if not (args.step_ms >= 0 and math.isfinite(args.step_ms)):
        raise ScheduleError(f"--step-ms must be 0 or more, got {args.step_ms}")


def run(args):
    _settings(args)
    _check_numbers(args)
    if args.sensitivity:
        return _run_sensitivity(args)
    if args.sweep:
        sizes = _parse_sizes(args.model_mb, "--model-mb", high=MAX_MODEL_MB)
        steps = _parse_sizes(args.step_ms, "--step-ms", zero=True)
        profiles = [load_aggregator(name.strip()) for name in args.aggregator.split(",") if name.strip()]
        if not profiles:
            raise ScheduleError("--aggregator must name at least one aggregator profile")
        written = ["sweep.md", "sweep.json", *(f"phase_{name}.png" for name in COMPARED)]
        check_outputs_apart([("--out-dir", Path(args.out_dir) / name) for name in written], _input_files(args))
    else:
        aggregator = load_aggregator(args.aggregator)
    topology = load_topology(args.topology)
    islands = None if not args.islands else [name.strip() for name in args.islands.split(",")]
    islands = topology.resolve_islands(islands)
    if args.sweep:
        _, table = run_sweep(topology, islands, sizes, args.epsilon, args.seed, Path(args.out_dir),
                             profiles=profiles, steps_ms=steps, local_steps=max(1, args.local_steps),
                             multicast=not args.no_multicast, aggregation=not args.no_aggregation,
                             routing=args.routing, host_nic_gbps=args.host_nic_gbps, host_tree=args.host_tree,
                             tree_tables=args.tree_tables)
        print(table)
        print(f"\nwrote {args.out_dir}/sweep.md, sweep.json, phase_*.png and the schedule maps")
        return 0
    if not args.out:
        raise ScheduleError("--out FILE is required (where to write the schedule JSON)")
    check_outputs_apart({"--out": args.out, "--map": args.map, "--tables": args.tables}, _input_files(args))
    for option, path in (("--out", args.out), ("--map", args.map), ("--tables", args.tables)):
        if path is not None:
            check_writable(path, option)
    if args.map:
        formats = plt.figure().canvas.get_supported_filetypes()
        plt.close("all")
        if Path(args.map).suffix.lstrip(".").lower() not in formats:
            raise ScheduleError(f"--map {args.map}: name a picture file ending in one of "
                                f"{', '.join('.' + name for name in sorted(formats))}")
    # A topology where no city replicates (or aggregates) plans exactly as with the switch off; say so.
    multicast = not args.no_multicast and any(city.multicast for city in topology.cities.values())
    aggregation = not args.no_aggregation and any(city.aggregation for city in topology.cities.values())
    if args.global_clique and not aggregation:
        raise ScheduleError("--global-clique: no city of the topology aggregates in line (or --no-aggregation is "
                            "given), so the clique of every island cannot be summed in the network")
    if args.tables is not None and not aggregation:
        raise ScheduleError(f"--tables {args.tables}: no city of the topology aggregates in line (or "
                            f"--no-aggregation is given), so no aggregator holds tables")
    plan = plan_schedule(topology, islands, round(args.model_mb * 1e6), args.epsilon,
                         multicast, aggregation, args.seed, aggregator=aggregator,
                         reduce_in_path=args.reduce_in_path, routing=args.routing,
                         local_steps=args.local_steps, step_ms=args.step_ms,
                         host_nic_gbps=args.host_nic_gbps, host_tree=args.host_tree, tree_tables=args.tree_tables)
    if args.global_clique:
        plan = global_clique_plan(plan)
    # The tables before anything is written: a schedule whose cliques would clash in them writes nothing.
    tables = _tables(plan, args.tables) if args.tables is not None else None
    print(format_plan(plan))
    # Every output or none: each is written to a temporary file first, then all are renamed.
    with (atomic_output(args.out) as schedule_path, atomic_output(args.map) as map_path,
          atomic_output(args.tables) as tables_path):
        write_schedule(plan, schedule_path, destination=args.out)
        if map_path:
            draw_schedule_map(topology, plan.best, map_path, _setting_title(plan), plan.cost_model)
        if tables_path:
            with open(tables_path, "w") as handle:
                json.dump(tables, handle, indent=1)
                handle.write("\n")
    return 0


def _tables(plan, destination):
    """--tables: the aggregators' tables of the schedule the file holds (its cliques and trees, as
    `train.averaging.tree_job_entries` reads them), with the topology's aggregating cities as the aggregators;
    its "topology" as the schedule file names it, from `destination`'s folder."""
    parsed = parse_schedule(schedule_document(plan))
    rounds = [[(members, aggregator) for members, aggregator, _ in cliques] for cliques in parsed]
    trees = [[tree for _, _, tree in cliques] for cliques in parsed]
    try:
        document = tables_document(rounds, trees, plan.islands, plan.cost_model.aggregation_cities)
    except TreeError as error:
        raise ScheduleError(f"--tables: {error}") from None
    return {"topology": topology_reference(plan.topology, destination), **document}


def _run_sensitivity(args):
    """--sensitivity: the plan at every latency and bandwidth factor and model size, as JSON and a table."""
    for option, given in (("--sweep", args.sweep), ("--global-clique", args.global_clique), ("--out", args.out),
                          ("--map", args.map), ("--tables", args.tables)):
        if given:
            raise ScheduleError(f"--sensitivity writes its own file and table; {option} belongs to a plan, give one "
                                f"or the other")
    sizes = _parse_sizes(args.model_mb, "--model-mb", high=MAX_MODEL_MB)
    aggregator = load_aggregator(args.aggregator)
    check_outputs_apart({"--sensitivity": args.sensitivity}, _input_files(args))
    check_writable(args.sensitivity, "--sensitivity")
    topology = load_topology(args.topology)
    islands = topology.resolve_islands(None if not args.islands else [name.strip() for name in args.islands.split(",")])
    points = len(sizes) * len(LATENCY_FACTORS) * len(BANDWIDTH_FACTORS)
    with progress.counting(points, "sensitivity point") as advance:
        rows = sensitivity_sweep(topology, sizes, advance=advance, islands=islands, epsilon=args.epsilon,
                                 multicast=not args.no_multicast, aggregation=not args.no_aggregation, seed=args.seed,
                                 aggregator=aggregator, reduce_in_path=args.reduce_in_path, routing=args.routing,
                                 local_steps=args.local_steps, step_ms=args.step_ms, host_nic_gbps=args.host_nic_gbps,
                                 host_tree=args.host_tree, tree_tables=args.tree_tables)
    with atomic_output(args.sensitivity) as path, open(path, "w") as handle:
        json.dump(rows, handle, indent=1)
        handle.write("\n")
    print(sensitivity_table(rows), end="")
    print(f"wrote {args.sensitivity}")
    return 0


def _input_files(args):
    """(option, path) of every file the command reads: a topology file, build reports as aggregators."""
    reports = args.aggregator.split(",") if args.sweep else [args.aggregator]
    return [("--topology", topology_file(args.topology)),
            *(("--aggregator", name.strip()) for name in reports if name.strip() not in PROFILES)]


def _parse_sizes(text, option, zero=False, high=math.inf):
    try:
        sizes = [parse_decimal(option, part.strip()) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ScheduleError(f"{option} must be comma-separated numbers, got {text!r}") from None
    if not sizes or any(not ((size >= 0 if zero else size > 0) and math.isfinite(size) and size <= high)
                        for size in sizes):
        bound = f" of at most {high:,.15g}" if math.isfinite(high) else ""
        raise ScheduleError(f"{option} must list {'non-negative' if zero else 'positive'} numbers{bound}, got {text!r}")
    return sizes



def _sweep_cell(topology, islands, epsilon, seed, iterations, profile, reduced, size_mb, step_ms, local_steps,
                multicast, aggregation, routing, plans, host_nic_gbps=None, host_tree=False, tree_tables=False):
    """One row of the sweep: the optimum and the baselines at one setting (its plan kept in `plans`)."""
    steps = local_steps if step_ms > 0 else 0
    plan = plan_schedule(topology, islands, round(size_mb * 1e6), epsilon, multicast, aggregation,
                         seed, iterations, profile, reduced, routing, steps, step_ms, host_nic_gbps, host_tree,
                         tree_tables)
    plans[(profile.name, reduced, size_mb, step_ms)] = plan
    best_name, best_baseline = min(plan.candidate_baselines.items(),
                                   key=lambda item: item[1].time_to_epsilon_ms)
    row = {
        "aggregator": profile.name, "reduce_in_path": reduced, "model_mb": size_mb,
        "step_ms": step_ms, "local_steps": steps,
        "shape": _shape(plan.best), "exchange": _exchanges(plan.best),
        "rotating": _rotating(plan.best),
        "period_ms": plan.best.period_ms, "rho": plan.best.rho,
        "spectral_radius": plan.best.spectral_radius,
        "time_to_epsilon_ms": plan.best.time_to_epsilon_ms,
        "best_baseline": best_name, "best_baseline_ms": best_baseline.time_to_epsilon_ms,
        "lower_bound_ms": plan.lower_bound_ms,
        "host_tree_ms": plan.baselines[HOST_TREE].time_to_epsilon_ms,
    }
    for name in COMPARED:
        row[f"{name}_ms"] = plan.baselines[name].time_to_epsilon_ms
    return row

def _setting_title(plan):
    return (f"{plan.topology}, {plan.model_bytes / 1e6:g} MB, aggregator {plan.aggregator.name}"
            f"{', reduce in path' if plan.reduce_in_path else ''}, multicast {'on' if plan.multicast else 'off'}, "
            f"aggregation {'on' if plan.aggregation else 'off'}")


def _shape(schedule):
    """Clique sizes per round, e.g. '3+3+3 / 3+3+3'."""
    return " / ".join("+".join(str(len(c.members)) for c in cliques) or "-" for cliques in schedule.rounds)


def _exchanges(schedule):
    kinds = sorted({c.exchange for cliques in schedule.rounds for c in cliques})
    return ",".join("agg" if kind == AGGREGATE else kind for kind in kinds)


def _ms(value):
    return "never" if math.isinf(value) else f"{value:,.0f}"


def _rotating(schedule):
    """Whether a schedule is something other than one clique of every island in one round."""
    return not (len(schedule.rounds) == 1 and len(schedule.rounds[0]) == 1)


def run_sweep(topology, islands, sizes_mb, epsilon, seed, out_dir, profiles=None, reduce=(False, True),
              steps_ms=(0.0,), local_steps=1, multicast=True, aggregation=True, routing="latency", iterations=None,
              host_nic_gbps=None, host_tree=False, tree_tables=False):
    """Optimize every (aggregator profile, reduce-in-path, model size, step time); write the table, the
    phase diagrams (one PNG per baseline compared) and maps of the optimum at the smallest and largest size.

    A step time of 0 means no local steps (time to epsilon by rho); otherwise `local_steps` steps of that
    time precede every round and the local-step objective applies.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    profiles = profiles or [load_aggregator(name) for name in PROFILES]
    rows, plans = [], {}
    cells = len(profiles) * len(reduce) * len(sizes_mb) * len(steps_ms)
    with progress.counting(cells, "sweep cell") as advance:
        for profile, reduced, size_mb, step_ms in itertools.product(profiles, reduce, sizes_mb, steps_ms):
            rows.append(_sweep_cell(topology, islands, epsilon, seed, iterations, profile, reduced, size_mb, step_ms,
                                    local_steps, multicast, aggregation, routing, plans, host_nic_gbps, host_tree,
                                    tree_tables))
            advance()
    header = ("| aggregator | reduce | model MB | step ms | optimized cliques per round | exchange | rho "
              "| spectral radius | time to eps ms | global ms | grid2d ms | ring ms | gain over global | x bound |")
    lines = [header, "|" + "---|" * (header.count("|") - 1)]
    for row in rows:
        ratio = row["time_to_epsilon_ms"] / row["lower_bound_ms"]
        gain = row["global_ms"] / row["time_to_epsilon_ms"]
        lines.append(
            f"| {row['aggregator']} | {'on' if row['reduce_in_path'] else 'off'} | {row['model_mb']:g} "
            f"| {row['step_ms']:g} | {row['shape']} | {row['exchange']} | {row['rho']:.3f} "
            f"| {row['spectral_radius']:.3f} | {_ms(row['time_to_epsilon_ms'])} | {_ms(row['global_ms'])} "
            f"| {_ms(row['grid2d_ms'])} | {_ms(row['ring_ms'])} | {gain:.2f} | {ratio:.2f} |")
    table = "\n".join(lines)
    (out_dir / "sweep.md").write_text(
        f"Optimized schedules on {topology.name}, {len(islands)} islands, epsilon {epsilon:g}, seed {seed}, "
        f"routing {routing}, {local_steps} local step(s) per round where the step time is above 0\n\n"
        + table + "\n\n" + MIXING_LEGEND + "\n")
    with open(out_dir / "sweep.json", "w") as handle:
        json.dump([{k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in row.items()}
                   for row in rows], handle, indent=1)
    for name in COMPARED:
        _plot_phase(rows, name, out_dir / f"phase_{name}.png", topology.name)
    first = profiles[0].name
    for size_mb in sorted({min(sizes_mb), max(sizes_mb)}):
        plan = plans[(first, reduce[0], size_mb, steps_ms[0])]
        draw_schedule_map(topology, plan.best, out_dir / f"map_{size_mb:g}MB.png", _setting_title(plan),
                          plan.cost_model)
    return rows, table


def _plot_phase(rows, baseline, path, topology_name):
    """One heat map per (profile, reduce): model size across, step time down, colour the baseline's time
    over the optimum's (above 1: the optimum wins by that factor); R marks a rotating optimum."""
    profiles = list(dict.fromkeys(r["aggregator"] for r in rows))
    reduces = list(dict.fromkeys(r["reduce_in_path"] for r in rows))
    sizes = sorted({r["model_mb"] for r in rows})
    steps = sorted({r["step_ms"] for r in rows})
    figure, axes = plt.subplots(len(profiles), len(reduces), figsize=(4.2 * len(reduces), 2.6 * len(profiles)),
                                squeeze=False)
    for i, profile in enumerate(profiles):
        for j, reduced in enumerate(reduces):
            axis = axes[i][j]
            grid = np.full((len(steps), len(sizes)), np.nan)
            for r in rows:
                if r["aggregator"] == profile and r["reduce_in_path"] == reduced:
                    gain = r[f"{baseline}_ms"] / r["time_to_epsilon_ms"]
                    y, x = steps.index(r["step_ms"]), sizes.index(r["model_mb"])
                    grid[y, x] = gain
                    axis.text(x, y, f"{gain:.2f}{' R' if r['rotating'] else ''}", ha="center", va="center",
                              fontsize=7)
            axis.imshow(np.log2(np.clip(grid, 1e-3, None)), cmap="RdYlGn", vmin=-1, vmax=1, aspect="auto")
            axis.set_xticks(range(len(sizes)), [f"{s:g}" for s in sizes], fontsize=7)
            axis.set_yticks(range(len(steps)), [f"{s:g}" for s in steps], fontsize=7)
            axis.set_title(f"{profile}, reduce {'on' if reduced else 'off'}", fontsize=8)
            axis.set_xlabel("model MB", fontsize=7)
            axis.set_ylabel("step ms", fontsize=7)
    figure.suptitle(f"{topology_name}: {baseline} time / optimized time (R: rotating optimum)", fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
