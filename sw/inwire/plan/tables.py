"""The routes a schedule's reduction trees put in each aggregator's tables (a registered job, `jobs.tree_routes`):
one route per aggregator city and clique index, for the whole period. `job_entries` builds a job's entries from them
(`train.averaging.tree_job_entries` and `inwire stream` register them), `inwire schedule --tables` writes them for
the control plane (docs/schedule.md)."""

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any, cast

from ..jobs import FLAT, CliqueRoute, Endpoint, JobEntry, TreeError, tree_routes
from .schedule_file import ScheduleFile, member_paths

ScheduleRounds = Sequence[Sequence[tuple[Sequence[str], str | None]]]
"""Rounds of cliques as (members, aggregator city or None)."""
ScheduleTrees = Sequence[Sequence[Mapping[str, str] | None]]
"""Per round, per clique: its tree ({city: up}) or None."""


def root_city(cities: Mapping[str, object], members: Sequence[str], aggregator: str | None) -> str:
    """The city of `cities` whose aggregator a clique sums at: its aggregator city, else its first member's
    city, else the first city (an all-to-all clique is summed in-network all the same)."""
    if aggregator is not None and aggregator in cities:
        return aggregator
    return members[0] if members[0] in cities else next(iter(cities))


def member_paths_at(cities: Mapping[str, object], members: Sequence[str], aggregator: str | None,
                    tree: Mapping[str, str] | None) -> dict[str, list[str]]:
    """member -> the aggregator cities its contribution climbs, its own level's first (where it sends) and the
    root last: the clique sums at `root_city`, along its tree where that is its own aggregator city."""
    root = root_city(cities, members, aggregator)
    return member_paths(members, root, tree if root == aggregator else None)


def schedule_rounds(schedule: ScheduleFile | Sequence[Any]) -> tuple[list[list[tuple[tuple[str, ...], str | None]]],
                                                                      Any]:
    """(period: rounds of (members, aggregator), trees: per round per clique a tree or None) of a loaded
    schedule file (`load_schedule_file`) or of a plain list of rounds."""
    period = cast(Sequence[Any], getattr(schedule, "period", schedule))
    trees = getattr(schedule, "trees", ()) or tuple((None,) * len(cliques) for cliques in period)
    return [[(tuple(members), aggregator) for members, aggregator in cliques] for cliques in period], trees


def schedule_routes(rounds: ScheduleRounds, trees: ScheduleTrees, islands: Mapping[str, Endpoint],
                    aggregators: Mapping[str, Endpoint]
                    ) -> tuple[dict[str, dict[int, CliqueRoute]], dict[str, set[Endpoint]]]:
    """(city -> clique index -> the route its aggregator holds, city -> the islands' endpoints that send to it)
    for islands (name -> endpoint) averaging along `rounds` over the per-city `aggregators` (city -> endpoint).
    Each clique sums at `root_city`, along its tree where it sums at its own aggregator city; a route is
    `jobs.tree_routes`', the root's with level 0 (it gathers the whole clique, however many members it has in a
    round), and a clique flat at its root gets `jobs.FLAT` there. The tables hold one route per clique index, so
    two rounds whose cliques of one index would give an aggregator two different routes are refused
    (`jobs.TreeError`)."""
    members: dict[str, set[Endpoint]] = {}
    routes: dict[str, dict[int, CliqueRoute]] = {}
    for period_round, cliques in enumerate(rounds):
        for clique_index, (names, aggregator) in enumerate(cliques):
            where = f"schedule round {period_round}, clique {clique_index}"
            unknown = [name for name in names if name not in islands]
            if unknown:
                raise TreeError(f"{where}: no address for island {', '.join(unknown)}")
            root = root_city(aggregators, names, aggregator)
            paths = member_paths_at(aggregators, names, aggregator, trees[period_round][clique_index])
            tree = trees[period_round][clique_index] if root == aggregator else None
            placed = {islands[name]: (paths[name][0], index) for index, name in enumerate(names)}
            for city, route in tree_routes(root, tree, placed, aggregators, where).items():
                route = replace(route, level=0) if route.parent is None else route
                held = routes.setdefault(city, {}).setdefault(clique_index, route)
                if held != route:
                    raise TreeError(f"{where}: {city}'s aggregator would hold another route for clique "
                                    f"{clique_index} than in an earlier round; a registered job's tables hold one "
                                    f"route per clique index")
            for endpoint, (city, _) in placed.items():
                members.setdefault(city, set()).add(endpoint)
    return routes, members


def job_entries(entry: JobEntry, schedule: ScheduleFile | Sequence[Any], islands: Mapping[str, Endpoint],
                aggregators: Mapping[str, Endpoint]) -> dict[str, JobEntry]:
    """city -> the entry of registered job `entry` its aggregator is registered with, for islands (name ->
    endpoint they send from) averaging along `schedule` (a loaded schedule file, whose trees it follows, or rounds
    of (members, aggregator)) over the per-city `aggregators` (city -> endpoint). Each city's entry holds the
    islands that send to its aggregator in some clique and, per clique index, the route its aggregator holds
    there (`schedule_routes`; a clique flat at its root needs none)."""
    rounds, trees = schedule_rounds(schedule)
    routes, members = schedule_routes(rounds, trees, islands, aggregators)
    return {city: replace(entry, members=frozenset(members.get(city, ())),
                          routes={clique: route for clique, route in routes[city].items() if route != FLAT})
            for city in routes}


def tables_document(rounds: ScheduleRounds, trees: ScheduleTrees, islands: Sequence[str],
                    aggregator_cities: Sequence[str]) -> dict[str, Any]:
    """The tables of every aggregator city a schedule sends to, by city name (format in docs/schedule.md):
    `schedule_routes` over stand-in endpoints, one per island and one per aggregator city, named back."""
    island_at = {name: (index + 1, 1) for index, name in enumerate(islands)}
    city_at = {city: (index + 1, 2) for index, city in enumerate(aggregator_cities)}
    routes, members = schedule_routes(rounds, trees, island_at, city_at)
    island_of = {endpoint: name for name, endpoint in island_at.items()}
    city_of = {endpoint: city for city, endpoint in city_at.items()}
    order = {name: index for index, name in enumerate(islands)}
    cities = {}
    for city in sorted(routes, key=list(aggregator_cities).index):
        cities[city] = {
            "members": sorted((island_of[endpoint] for endpoint in members.get(city, ())), key=order.__getitem__),
            "routes": {str(clique): {"level": route.level,
                                     "parent": None if route.parent is None else city_of[route.parent],
                                     "children": {city_of[child]: held for child, held in sorted(
                                         route.children.items(), key=lambda item: item[0])}}
                       for clique, route in sorted(routes[city].items()) if route != FLAT}}
    return {"islands": list(islands), "cities": cities}
