"""Find the periodic sequence of cliques (with an aggregation city each) that reaches epsilon-consensus
soonest, beside the baselines and a lower bound; or, with --sweep, optimize over multicast on/off,
aggregation on/off and model sizes and write a table and plots."""

import json
import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen first)

from inwire.schedule import (  # noqa: E402
    AGGREGATE,
    RING,
    ScheduleError,
    describe_round,
    format_plan,
    plan_schedule,
    write_schedule,
)
from inwire.topology import load_topology  # noqa: E402

DEFAULT_SWEEP_SIZES_MB = "1,10,100,1000,10000"
SETTINGS = ((True, True), (False, True), (True, False), (False, False))
"""(multicast, aggregation) pairs the sweep compares."""


def add_arguments(parser):
    parser.add_argument("--topology", default="doublezero9", help="doublezero9 or a JSON topology file")
    parser.add_argument("--islands", help="comma-separated island cities (default: every city)")
    parser.add_argument("--model-mb", type=float, default=100.0, help="model size in MB (10^6 bytes)")
    parser.add_argument("--epsilon", type=float, default=1e-3, help="consensus target, 0 < epsilon < 1")
    parser.add_argument("--no-multicast", action="store_true", help="no city replicates results")
    parser.add_argument("--no-aggregation", action="store_true", help="no city aggregates in line")
    parser.add_argument("--seed", type=int, default=0, help="seed of the randomized search and baselines")
    parser.add_argument("--out", help="schedule JSON to write (required unless --sweep)")
    parser.add_argument("--map", help="also draw the schedule's cliques on a map (PNG)")
    parser.add_argument("--sweep", action="store_true",
                        help="multicast on/off x aggregation on/off x model sizes: table and plots")
    parser.add_argument("--sizes-mb", default=DEFAULT_SWEEP_SIZES_MB, help="model sizes for --sweep, MB")
    parser.add_argument("--out-dir", default="sweep", help="folder for the --sweep table and plots")


def run(args):
    topology = load_topology(args.topology)
    islands = None if not args.islands else [name.strip() for name in args.islands.split(",")]
    islands = topology.resolve_islands(islands)
    if args.sweep:
        sizes = _parse_sizes(args.sizes_mb)
        _, table = run_sweep(topology, islands, sizes, args.epsilon, args.seed, Path(args.out_dir))
        print(table)
        print(f"\nwrote {args.out_dir}/sweep.md, sweep.json, sweep.png and the schedule maps")
        return 0
    if not args.out:
        raise ScheduleError("--out FILE is required (where to write the schedule JSON)")
    if not (args.model_mb > 0 and math.isfinite(args.model_mb)):
        raise ScheduleError(f"--model-mb must be a positive number, got {args.model_mb}")
    if args.seed < 0:
        raise ScheduleError(f"--seed must be 0 or more, got {args.seed}")
    plan = plan_schedule(topology, islands, round(args.model_mb * 1e6), args.epsilon,
                         not args.no_multicast, not args.no_aggregation, args.seed)
    print(format_plan(plan))
    write_schedule(plan, args.out)
    if args.map:
        draw_schedule_map(topology, plan.best, args.map, _setting_title(plan))
    return 0


def _parse_sizes(text):
    try:
        sizes = [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ScheduleError(f"--sizes-mb must be comma-separated numbers, got {text!r}") from None
    if not sizes or any(not (size > 0 and math.isfinite(size)) for size in sizes):
        raise ScheduleError(f"--sizes-mb must list positive sizes, got {text!r}")
    return sizes


def _setting_title(plan):
    return (f"{plan.topology}, {plan.model_bytes / 1e6:g} MB, multicast {'on' if plan.multicast else 'off'}, "
            f"aggregation {'on' if plan.aggregation else 'off'}")


def _shape(schedule):
    """Clique sizes per round, e.g. '3+3+3 / 3+3+3'."""
    return " / ".join("+".join(str(len(c.members)) for c in cliques) or "-" for cliques in schedule.rounds)


def _exchanges(schedule):
    kinds = sorted({c.exchange for cliques in schedule.rounds for c in cliques})
    return ",".join("agg" if kind == AGGREGATE else kind for kind in kinds)


def _ms(value):
    return "never" if math.isinf(value) else f"{value:,.0f}"


def run_sweep(topology, islands, sizes_mb, epsilon, seed, out_dir):
    """Optimize every (multicast, aggregation, model size); write the table, the plot and two maps."""
    out_dir.mkdir(parents=True, exist_ok=True)
    rows, plans = [], {}
    for multicast, aggregation in SETTINGS:
        for size_mb in sizes_mb:
            plan = plan_schedule(topology, islands, round(size_mb * 1e6), epsilon, multicast, aggregation, seed)
            plans[(multicast, aggregation, size_mb)] = plan
            best_name, best_baseline = min(plan.baselines.items(), key=lambda item: item[1].time_to_epsilon_ms)
            rows.append({
                "multicast": multicast, "aggregation": aggregation, "model_mb": size_mb,
                "shape": _shape(plan.best), "exchange": _exchanges(plan.best),
                "period_ms": plan.best.period_ms, "rho": plan.best.rho,
                "time_to_epsilon_ms": plan.best.time_to_epsilon_ms,
                "best_baseline": best_name, "best_baseline_ms": best_baseline.time_to_epsilon_ms,
                "lower_bound_ms": plan.lower_bound_ms,
            })
    header = ("| multicast | aggregation | model MB | optimized cliques per round | exchange | period ms | rho "
              "| time to eps ms | best baseline | baseline ms | x bound |")
    lines = [header, "|" + "---|" * (header.count("|") - 1)]
    for row in rows:
        ratio = row["time_to_epsilon_ms"] / row["lower_bound_ms"]
        lines.append(
            f"| {'on' if row['multicast'] else 'off'} | {'on' if row['aggregation'] else 'off'} "
            f"| {row['model_mb']:g} | {row['shape']} | {row['exchange']} | {row['period_ms']:,.0f} "
            f"| {row['rho']:.3f} | {_ms(row['time_to_epsilon_ms'])} | {row['best_baseline']} "
            f"| {_ms(row['best_baseline_ms'])} | {ratio:.2f} |")
    table = "\n".join(lines)
    (out_dir / "sweep.md").write_text(
        f"Optimized schedules on {topology.name}, {len(islands)} islands, epsilon {epsilon:g}, seed {seed}\n\n"
        + table + "\n")
    with open(out_dir / "sweep.json", "w") as handle:
        json.dump([{k: (None if isinstance(v, float) and math.isinf(v) else v) for k, v in row.items()}
                   for row in rows], handle, indent=1)
    _plot_sweep(rows, sizes_mb, out_dir / "sweep.png", topology.name)
    for size_mb in (min(sizes_mb), max(sizes_mb)):
        plan = plans[(True, True, size_mb)]
        draw_schedule_map(topology, plan.best, out_dir / f"map_{size_mb:g}MB.png", _setting_title(plan))
    return rows, table


def _plot_sweep(rows, sizes_mb, path, topology_name):
    figure, (time_axis, shape_axis) = plt.subplots(1, 2, figsize=(12, 4.5))
    for multicast, aggregation in SETTINGS:
        mine = [r for r in rows if r["multicast"] == multicast and r["aggregation"] == aggregation]
        label = f"multicast {'on' if multicast else 'off'}, aggregation {'on' if aggregation else 'off'}"
        times = [r["time_to_epsilon_ms"] / 1e3 for r in mine]
        time_axis.plot([r["model_mb"] for r in mine], times, marker="o", label=label)
        rounds = [len(r["shape"].split(" / ")) for r in mine]
        largest = [max(int(s) for part in r["shape"].split(" / ") for s in part.split("+") if s != "-")
                   for r in mine]
        shape_axis.plot([r["model_mb"] for r in mine], largest, marker="o", label=label)
        for x, y, count in zip([r["model_mb"] for r in mine], largest, rounds):
            shape_axis.annotate(f"{count}r", (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7)
    bounds = sorted({(r["model_mb"], r["lower_bound_ms"] / 1e3) for r in rows})
    time_axis.plot([b[0] for b in bounds], [b[1] for b in bounds], "k--", label="lower bound")
    time_axis.set(xscale="log", yscale="log", xlabel="model size (MB)", ylabel="time to epsilon (s)",
                  title=f"Optimized schedule on {topology_name}")
    shape_axis.set(xscale="log", xlabel="model size (MB)", ylabel="largest clique (islands)",
                   title="Shape of the optimum (label: rounds per period)")
    time_axis.legend(fontsize=8)
    shape_axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def _segments(lon1, lat1, lon2, lat2):
    """A line between two places, split at the date line when the short way round crosses it."""
    if abs(lon2 - lon1) <= 180:
        return [((lon1, lon2), (lat1, lat2))]
    shift = 360 if lon2 < lon1 else -360
    mid_lat = lat1 + (lat2 - lat1) * ((180 if shift > 0 else -180) - lon1) / (lon2 + shift - lon1)
    edge = 180 if shift > 0 else -180
    return [((lon1, edge), (lat1, mid_lat)), ((-edge, lon2), (mid_lat, lat2))]


def draw_schedule_map(topology, schedule, path, title):
    """One panel per round: the links in grey, the routes each clique uses in its colour, aggregators starred."""
    count = max(1, len(schedule.rounds))
    columns = min(count, 3)
    rows = math.ceil(count / columns)
    figure, axes = plt.subplots(rows, columns, figsize=(6 * columns, 3.4 * rows), squeeze=False)
    cities = topology.cities
    colours = plt.get_cmap("tab10")
    for index, axis in enumerate(axes.flat):
        if index >= len(schedule.rounds):
            axis.axis("off")
            continue
        cliques = schedule.rounds[index]
        for link in topology.links:
            a, b = cities[link.a], cities[link.b]
            for xs, ys in _segments(a.lon, a.lat, b.lon, b.lat):
                axis.plot(xs, ys, color="0.8", lw=0.8, ls="-" if link.kind == "dedicated" else ":", zorder=1)
        for number, clique in enumerate(cliques):
            colour = colours(number % 10)
            if clique.exchange == AGGREGATE:
                pairs = [(m, clique.aggregator) for m in clique.members if m != clique.aggregator]
                hub = cities[clique.aggregator]
                axis.scatter([hub.lon], [hub.lat], marker="*", s=160, color=colour, edgecolor="k", zorder=4)
            elif clique.exchange == RING:
                pairs = list(zip(clique.members, clique.members[1:] + clique.members[:1]))
            else:
                pairs = [(a, b) for i, a in enumerate(clique.members) for b in clique.members[i + 1:]]
            hops = {tuple(sorted(hop)) for a, b in pairs
                    for hop in zip(topology.path(a, b), topology.path(a, b)[1:])}
            for a, b in sorted(hops):
                for xs, ys in _segments(cities[a].lon, cities[a].lat, cities[b].lon, cities[b].lat):
                    axis.plot(xs, ys, color=colour, lw=3.2 - 0.5 * (number % 4), alpha=0.8, zorder=2)
        axis.scatter([c.lon for c in cities.values()], [c.lat for c in cities.values()], s=12, color="k", zorder=3)
        if len(cities) <= 16:
            for c in cities.values():
                axis.annotate(c.name, (c.lon, c.lat), textcoords="offset points", xytext=(3, 3), fontsize=7)
        axis.set(xlim=(-180, 180), ylim=(-60, 75), xticks=[], yticks=[])
        axis.set_title(f"round {index + 1} ({schedule.round_times_ms[index]:,.0f} ms): "
                       f"{describe_round(cliques) if len(cliques) <= 3 else f'{len(cliques)} cliques'}",
                       fontsize=7)
    figure.suptitle(f"{title}: time to epsilon {_ms(schedule.time_to_epsilon_ms)} ms", fontsize=10)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
