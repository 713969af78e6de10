"""The schedule file: writing it, reading it back as one object, and the readable table."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from .aggregator import PROFILES
from .cost import AGGREGATE, EXCHANGES, HOST_TREE, Clique, CostModel, Schedule, ScheduleError, wire_bytes
from .jsonfile import read_json

if TYPE_CHECKING:
    from .search import PlanResult
    from .topology import Topology

Tree = dict[str, str]
"""A clique's reduction tree: each city below the root to the aggregator it sends to."""
ParsedClique = tuple[tuple[str, ...], str | None, Tree | None]
"""(members, aggregator or None for a direct exchange, reduction tree or None)."""

# ---------------------------------------------------------------------------------------------------
# The schedule file


def _finite(value: float | None) -> float | None:
    """JSON has no infinity or NaN: infinite times and periods (and figures not computed) are null."""
    return None if value is None or not math.isfinite(value) else value


def _rounds_json(schedule: Schedule, model: CostModel | None = None) -> list[dict[str, Any]]:
    """Rounds with their times; with the cost model at hand, each clique's own time and reduction tree."""
    rounds = []
    for cliques, duration in zip(schedule.rounds, schedule.round_times_ms):
        entries: list[dict[str, Any]] = [{"members": list(c.members), "aggregator": c.aggregator,
                                          "exchange": c.exchange} for c in cliques]
        if model is not None:
            profiles = model.round_profiles(cliques)
            for entry, profile, clique_ms in zip(entries, profiles, model.clique_times(cliques)):
                entry["time_ms"] = round(clique_ms, 6)
                tree = profile.tree
                if tree is not None:
                    entry["tree"] = tree
        rounds.append({"cliques": entries, "time_ms": round(duration, 6)})
    return rounds


def _summary_json(schedule: Schedule) -> dict[str, Any]:
    return {"period_ms": round(schedule.period_ms, 6), "rho": schedule.rho,
            "spectral_radius": _finite(schedule.spectral_radius),
            "periods": _finite(schedule.periods),
            "time_to_epsilon_ms": _finite(schedule.time_to_epsilon_ms)}


def aggregator_json(plan: PlanResult) -> dict[str, Any]:
    """The default profile's name and figures, and any city's own profile from the topology."""
    model = plan.cost_model
    document = (plan.aggregator or PROFILES["ideal"]).to_json()
    if model is not None:
        own = {city: profile.to_json() for city, profile in model.aggregator_of.items()
               if profile is not model.default_aggregator}
        if own:
            document["cities"] = own
    return document


def schedule_document(plan: PlanResult) -> dict[str, Any]:
    """The schedule file's content (format in docs/schedule.md)."""
    model = plan.cost_model
    document = {
        "topology": plan.topology,
        "islands": list(plan.islands),
        "model_bytes": plan.model_bytes,
        "epsilon": plan.epsilon,
        "multicast": plan.multicast,
        "aggregation": plan.aggregation,
        "seed": plan.seed,
        "aggregator": aggregator_json(plan),
        "reduce_in_path": plan.reduce_in_path,
        "tree_tables": plan.tree_tables,
        "routing": plan.routing,
        "local_steps": plan.local_steps,
        "step_ms": plan.step_ms,
        "host_nic_gbps": plan.host_nic_gbps,
        "host_tree": plan.host_tree,
        "rounds": _rounds_json(plan.best, model),
        **_summary_json(plan.best),
        "baselines": {name: {**_summary_json(s), "rounds": _rounds_json(s, model)}
                      for name, s in plan.baselines.items()},
        "lower_bound_ms": round(plan.lower_bound_ms, 6),
        "method": plan.method,
        "routing_note": plan.routing_note,
        "host_side": plan.host_side,
        "recommendation": recommendation(plan),
        "not_summed_in_network": not_summed_in_network(plan),
        "excluded_baselines": plan.excluded_baselines,
    }
    return document


def recommendation(plan: PlanResult) -> str:
    """What the schedule asks for, in one sentence: summing in the network, or hosts only."""
    if plan.host_side:
        kinds = sorted({c.exchange for cliques in plan.best.rounds for c in cliques})
        return (f"host-side: no aggregator sums anything, every clique exchanges between the island hosts "
                f"({', '.join(kinds)}); this is not an FPGA schedule. The file says what to run, each clique's "
                f"members (a host tree's root first, a ring in ring order); the hosts run it with their own "
                f"collectives (a host tree as `python -m inwire.lab.hosttree` does, over TCP), while inwire "
                f"stream would sum these cliques at an aggregator instead")
    return "in-network: the aggregating cliques are summed in line at their aggregator cities"


def not_summed_in_network(plan: PlanResult) -> list[str]:
    """Where aggregation is on and the schedule still sums nowhere: why, for its largest clique, one line per
    cause (CostModel.aggregation_limits); empty otherwise."""
    model = plan.cost_model
    if model is None or not plan.host_side or not plan.aggregation:
        return []
    cliques = [c for cliques in plan.best.rounds for c in cliques]
    if not cliques:
        return []
    largest = max(cliques, key=lambda c: len(c.members))
    return [f"{{{','.join(largest.members)}}} {line}" for line in model.aggregation_limits(largest)]


def write_schedule(plan: PlanResult, path: str | os.PathLike[str],
                   destination: str | os.PathLike[str] | None = None) -> None:
    """Write the schedule file to `path`, a temporary file when `destination` is where it will end up; its
    "topology" names a topology file so that `schedule_topology` finds it from `destination`'s folder."""
    reference = topology_reference(plan.topology, path if destination is None else destination)
    with open(path, "w") as handle:
        json.dump(schedule_document(replace(plan, topology=reference)), handle, indent=1)
        handle.write("\n")


SYSTEM_FOLDERS = ("/proc", "/sys", "/dev")
"""Where the files are the kernel's or devices, never a topology."""


def topology_reference(spec: str, destination: str | os.PathLike[str]) -> str:
    """The "topology" a schedule written to `destination` records for the topology `spec` (as --topology
    takes it): a built-in name as is; a file's path relative to the schedule's folder, or absolute where the
    schedule goes to a device, a FIFO or a descriptor, which has no folder of its own."""
    from ..output import writes_in_place
    from .topology import BUILTIN_TOPOLOGIES

    if spec in BUILTIN_TOPOLOGIES:
        return spec
    if writes_in_place(destination):
        return os.path.abspath(spec)
    return os.path.relpath(os.path.abspath(spec), os.path.dirname(os.path.abspath(destination)))


def schedule_topology(name: object, schedule_path: str | os.PathLike[str]) -> str:
    """What to load for a schedule's "topology" `name`: a built-in topology's name as is, or the path of a
    topology file, a relative one taken from the schedule file's folder (not the working directory).
    ScheduleError unless the name ends in .json and leads, symlinks followed, to a .json file outside /proc,
    /sys and /dev; the file is then read as every JSON input is (a regular file of at most 64 MiB)."""
    from .topology import BUILTIN_TOPOLOGIES

    if not isinstance(name, str) or not name:
        raise ScheduleError(f"{schedule_path}: 'topology' must name the topology the schedule was made for")
    if name in BUILTIN_TOPOLOGIES:
        return name
    where = f"{schedule_path}: 'topology' {name!r}"
    if not name.endswith(".json"):
        raise ScheduleError(f"{where} is neither a built-in topology ({', '.join(BUILTIN_TOPOLOGIES)}) nor a "
                            f"topology file ending in .json")
    path = os.path.join(os.path.dirname(os.path.abspath(schedule_path)), name)
    real = os.path.realpath(path)
    if not real.endswith(".json") or any(real == folder or real.startswith(folder + "/")
                                         for folder in SYSTEM_FOLDERS):
        raise ScheduleError(f"{where} leads to {real}, not a topology file (a .json file outside "
                            f"{', '.join(SYSTEM_FOLDERS)})")
    return path


def _check_tree(tree: object, root: object, members: Collection[str], exchange: str, at: str) -> None:
    """A reduction tree maps each aggregator below the root to its parent aggregator, and may map a
    member city that does not aggregate to the aggregator its island sends to; the aggregators are the
    root and the tree's values, and following parents must reach the root."""
    if exchange != AGGREGATE:
        raise ScheduleError(f"{at}: only an aggregating clique has a reduction tree")
    if not isinstance(tree, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in tree.items()):
        raise ScheduleError(f"{at}: 'tree' must map city names to their parent city")
    if root in tree:
        raise ScheduleError(f"{at}: 'tree' gives the aggregator {root!r} a parent, but it is the root")
    aggregators = set(tree.values())
    for city in tree:
        if city not in members and city not in aggregators:
            raise ScheduleError(f"{at}: 'tree' maps {city!r}, which is neither a member nor a city that others "
                                f"send to")
    for city in tree:
        seen = {city}
        step: str | None = city
        while step != root:
            step = tree.get(step)
            if step is None or step in seen:
                raise ScheduleError(f"{at}: 'tree' does not lead every city to the aggregator {root!r}")
            seen.add(step)


def member_paths(members: Iterable[str], root: str, tree: Mapping[str, str] | None) -> dict[str, list[str]]:
    """member -> the aggregators its contribution climbs, its own level's first and the root last, by a
    clique's reduction tree (a validated one, or None): a member sends to its own city when that sums,
    else to tree[city], else to the root."""
    parents = tree or {}
    aggregators = {root, *parents.values()}
    paths = {}
    for member in members:
        path = [member if member in aggregators else parents.get(member, root)]
        while path[-1] != root:
            path.append(parents[path[-1]])
        paths[member] = path
    return paths


def parse_schedule(document: object, source: str = "schedule") -> list[list[ParsedClique]]:
    """Validate a schedule document; returns its rounds as lists of (members, aggregator, tree), tree
    None where the clique has none."""
    if not isinstance(document, dict):
        raise ScheduleError(f"{source}: the top level must be a JSON object")
    islands = document.get("islands")
    if not isinstance(islands, list) or not all(isinstance(i, str) for i in islands) or len(islands) < 2:
        raise ScheduleError(f"{source}: 'islands' must list at least two island names")
    if len(set(islands)) != len(islands):
        raise ScheduleError(f"{source}: 'islands' names an island twice")
    rounds = document.get("rounds")
    if not isinstance(rounds, list) or not rounds:
        raise ScheduleError(f"{source}: 'rounds' must be a non-empty list")
    known = set(islands)
    parsed: list[list[ParsedClique]] = []
    for r, entry in enumerate(rounds):
        where = f"{source}: rounds[{r}]"
        cliques = entry.get("cliques") if isinstance(entry, dict) else None
        if not isinstance(cliques, list):
            raise ScheduleError(f"{where}: missing 'cliques' list")
        placed: set[str] = set()
        round_cliques: list[ParsedClique] = []
        for c, clique in enumerate(cliques):
            at = f"{where}.cliques[{c}]"
            members = clique.get("members") if isinstance(clique, dict) else None
            if not isinstance(members, list) or len(members) < 2:
                raise ScheduleError(f"{at}: 'members' must list at least two islands")
            for member in members:
                if not isinstance(member, str):
                    raise ScheduleError(f"{at}: 'members' must list island names, got {member!r}")
                if member not in known:
                    raise ScheduleError(f"{at}: {member!r} is not one of the islands")
                if member in placed:
                    raise ScheduleError(f"{at}: island {member!r} is in two cliques of the round")
                placed.add(member)
            aggregator = clique.get("aggregator")
            exchange = clique.get("exchange", AGGREGATE)
            if exchange not in EXCHANGES:
                raise ScheduleError(f"{at}: exchange must be one of {', '.join(EXCHANGES)}, got {exchange!r}")
            if exchange == AGGREGATE and not isinstance(aggregator, str):
                raise ScheduleError(f"{at}: an aggregating clique needs an aggregator city")
            if exchange != AGGREGATE and aggregator is not None:
                raise ScheduleError(f"{at}: a {exchange} clique has no aggregator")
            tree = clique.get("tree")
            if "tree" in clique:
                _check_tree(tree, aggregator, members, exchange, at)
            round_cliques.append((tuple(members), aggregator, tree))
        parsed.append(round_cliques)
    if not any(parsed):
        raise ScheduleError(f"{source}: every round of the schedule is idle (no round has a clique), so no island "
                            f"would ever exchange with another")
    return parsed


@dataclass(frozen=True)
class ScheduleFile:
    """A validated schedule file as the islands use it: island names, one period of rounds of
    (members, aggregator), the topology it was made for and the whole document for everything else.

    `topology` is the topology's name (or file) as written, until a user that needs the cities (the
    stream) resolves it with `with_topology`.
    """
    islands: tuple[str, ...]
    period: tuple[tuple[tuple[tuple[str, ...], str | None], ...], ...]
    topology: object
    """What the file names (a built-in name or a file, not yet checked) until `with_topology` gives the Topology."""
    document: dict[str, Any]
    trees: tuple[tuple[Tree | None, ...], ...] = ()
    """Per round of the period, per clique: its reduction tree ({city: parent}) or None."""

    def cliques(self, round_: int) -> tuple[tuple[tuple[str, ...], str | None], ...]:
        return self.period[round_ % len(self.period)]

    def with_topology(self, topology: Topology) -> ScheduleFile:
        return replace(self, topology=topology)


def load_schedule_file(path: str | os.PathLike[str]) -> ScheduleFile:
    """Read and validate a schedule file (the one loader the CLI, the stream and the tests use).

    The aggregator is a city name, or None for a clique that exchanges directly (its "exchange" field
    in the file says all-to-all, ring or host-tree, whose first member is the root). Islands absent from
    a round sit that round out.
    """
    document = read_json(path, "schedule", ScheduleError)
    period = parse_schedule(document, str(path))
    return ScheduleFile(tuple(document["islands"]),
                        tuple(tuple((members, aggregator) for members, aggregator, _ in cliques) for cliques in period),
                        document.get("topology"), document,
                        tuple(tuple(tree for _, _, tree in cliques) for cliques in period))


# ---------------------------------------------------------------------------------------------------
# Readable output


def _time(ms: float) -> str:
    return "never" if math.isinf(ms) else f"{ms:,.1f}"


def describe_round(cliques: Iterable[Clique]) -> str:
    parts = []
    for c in cliques:
        where = (c.hub if c.exchange == AGGREGATE else
                 f"{c.exchange}:{c.members[0]}" if c.exchange == HOST_TREE else c.exchange)
        parts.append("{" + ",".join(c.members) + "}@" + where)
    return "  ".join(parts) if parts else "(idle)"


MIXING_LEGEND = ("rho: ||P - J||, the share of the islands' disagreement that one period P of averaging leaves at "
                 "worst (J: the exact average; 0: one period reaches it)\n"
                 "spectral radius: the largest |eigenvalue| of P - J, the share left per period in the long run "
                 "(the schedule JSON's rho and spectral_radius)")
"""What the plan's and the sweep's two mixing columns are."""


def format_plan(plan: PlanResult) -> str:
    """The human-readable table the CLI prints."""
    best = plan.best
    aggregator = plan.aggregator or PROFILES["ideal"]
    figures = aggregator.to_json()
    limits = ("no limit" if aggregator.ideal else
              f"ports {figures['ingress_gbps'] or 'unlimited'} Gb/s in and out, "
              f"core {figures['core_gbps'] or 'unlimited'} Gb/s")
    hosts = "".join([f", host NICs {plan.host_nic_gbps:g} Gb/s" if plan.host_nic_gbps is not None else "",
                     ", host trees offered per clique" if plan.host_tree else ""])
    objective = ("time to epsilon by rho, whole periods" if not plan.local_steps else
                 f"{plan.local_steps} local step(s) of {plan.step_ms:g} ms before every round; time to epsilon "
                 f"at the spectral radius's rate")
    lines = [
        f"topology {plan.topology}: {len(plan.islands)} islands, model {plan.model_bytes / 1e6:,.0f} MB "
        f"({wire_bytes(plan.model_bytes) / 1e6:,.1f} MB on the wire), epsilon {plan.epsilon:g}, "
        f"multicast {'on' if plan.multicast else 'off'}, aggregation {'on' if plan.aggregation else 'off'}",
        f"aggregator {aggregator.name} ({limits}), reduce in path {'on' if plan.reduce_in_path else 'off'}"
        f"{' (trees in the aggregator tables, any depth)' if plan.tree_tables else ''}, "
        f"routing {plan.routing}{f' ({plan.routing_note})' if plan.routing_note else ''}{hosts}; "
        f"objective: {objective}",
        "",
        f"{'schedule':<14}{'rounds':>7}{'period ms':>12}{'rho':>10}{'spectral radius':>17}{'periods':>9}"
        f"{'time to eps ms':>16}{'x bound':>9}",
    ]
    excluded = plan.excluded_baselines
    rows = [(plan.chosen, best)] + [(name + ("*" if name in excluded else ""), s) for name, s in plan.baselines.items()]
    for name, s in rows:
        periods = ("-" if math.isinf(s.periods) else
                   str(s.periods) if isinstance(s.periods, int) else f"{s.periods:.2f}")
        ratio = s.time_to_epsilon_ms / plan.lower_bound_ms
        lines.append(f"{name:<14}{len(s.rounds):>7}{s.period_ms:>12,.1f}{s.rho:>10.4f}{s.spectral_radius:>17.4f}"
                     f"{periods:>9}{_time(s.time_to_epsilon_ms):>16}{'-' if math.isinf(ratio) else f'{ratio:.2f}':>9}")
    lines.append(f"{'lower bound':<14}{'':>7}{'':>12}{'':>10}{'':>17}{'':>9}{_time(plan.lower_bound_ms):>16}{1:>9.2f}")
    lines.append(MIXING_LEGEND)
    lines.extend(f"{name}*: not a candidate: {why}" for name, why in excluded.items())
    lines.append("")
    lines.append(f"recommendation: {recommendation(plan)}")
    why_not = not_summed_in_network(plan)
    if why_not:
        lines.append("not summed in the network, because:")
        lines.extend(f"  {line}" for line in why_not)
    lines.append(f"{plan.chosen} schedule, one period:")
    model = plan.cost_model
    for i, (cliques, duration) in enumerate(zip(best.rounds, best.round_times_ms), 1):
        lines.append(f"  round {i} ({duration:,.1f} ms): {describe_round(cliques)}")
        if model is not None and plan.reduce_in_path:
            for clique, profile in zip(cliques, model.round_profiles(cliques)):
                tree = profile.tree
                if tree:
                    lines.append(f"    summed on the way to {clique.aggregator}: " +
                                 ", ".join(f"{city}->{parent}" for city, parent in sorted(tree.items())))
    lines.append(f"search: {plan.method}; {plan.evaluations} schedules scored in {plan.wall_s:.1f} s")
    return "\n".join(lines)
