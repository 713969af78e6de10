"""Reduction trees through the host path: islands following a schedule tree, through chained `inwire serve`
processes on loopback (one address per city, one port) and through one co-simulated gateware per city."""

import json
import socket
import subprocess
import sys

import pytest

from inwire.cli import main
from inwire.datagram import ip_int
from inwire.stream import StreamConfig, StreamError, clique_routes, load_plan, run_stream
from inwire.transport import CaptureTransport
from schedules import ISLANDS, write_schedule

ROOT, CHILD = "127.0.0.2", "127.0.0.3"
TREE_ROUND = [{"members": ISLANDS, "aggregator": "NYC", "tree": {"LAX": "NYC", "SIN": "LAX", "TYO": "LAX"}}]
"""NYC sums SEO, NYC and LAX's partial of {SIN, TYO, LAX}: two levels."""
FLAT_ROUND = [{"members": ["SIN", "TYO", "LAX"], "aggregator": "LAX"}, {"members": ["SEO", "NYC"], "aggregator": "NYC"}]
ENGINES = ["golden", "fast"]
"""Both of serve's decision paths, as tests/test_stream.py runs them."""


def free_port(*addresses):
    """A UDP port free on every address (checked by binding it on each)."""
    for _ in range(20):
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.bind((addresses[0], 0))
            port = probe.getsockname()[1]
            others = []
            try:
                for address in addresses[1:]:
                    other = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                    others.append(other)
                    other.bind((address, port))
                return port
            except OSError:
                continue
            finally:
                for other in others:
                    other.close()
    raise RuntimeError("no UDP port free on every address")


@pytest.fixture
def serves():
    """Start one `inwire serve --unicast` process per address, all on one port; yields a starter that
    returns the port."""
    processes = []

    def start(addresses, engine):
        port = free_port(*addresses)
        for address in addresses:
            process = subprocess.Popen([sys.executable, "-m", "inwire", "serve", "--listen", f"{address}:{port}",
                                        "--unicast", "--unregistered", *(["--golden"] if engine == "golden" else [])],
                                       stderr=subprocess.PIPE, text=True)
            processes.append(process)
            line = process.stderr.readline()
            assert f"listening on udp://{address}:{port}" in line, line
        return port
    yield start
    for process in processes:
        process.terminate()
    for process in processes:
        try:
            process.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()


def write_map(path, cities):
    path.write_text(json.dumps(cities))
    return str(path)


def stream_json(capsys, *argv):
    """`inwire stream --json`, unregistered: the services here take version 2 frames, whose routes these tests
    check (tests/test_stream.py runs registered trees)."""
    code = main(["stream", *argv, "--unregistered", "--json"])
    captured = capsys.readouterr()
    return code, json.loads(captured.out), captured.err


def golden_counters(schedule, config, cities=("LAX", "NYC")):
    """Each city's counters when the same run goes through one golden model per city, frames routed by
    address: what the chained services must count too."""
    plan = load_plan(schedule)
    transport = CaptureTransport(None, plan.islands, 64, config.chunk, cities=sorted(cities))
    report = run_stream(plan, config, transport)
    assert report["bit_exact"]
    return report["aggregators"]


def assert_counted_as_the_model(by_city, expected):
    """Every counter of every service as the models counted; over UDP each service also answered the first
    of the stream's two stats requests."""
    assert by_city.keys() == expected.keys()
    for city, counters in by_city.items():
        assert counters == {**expected[city], "answered": expected[city]["answered"] + 1,
                            "frames_in": expected[city]["frames_in"] + 1}, city


def test_routes_follow_the_tree():
    addresses = {"NYC": ip_int(ROOT), "LAX": ip_int(CHILD)}
    address = addresses.__getitem__
    routes = clique_routes(tuple(ISLANDS), "NYC", TREE_ROUND[0]["tree"], address)
    below = 0b01011  # SIN, TYO and LAX: members 0, 1, 3
    assert routes["SIN"] == ("LAX", {"bitmap": 1, "expect": below, "hop1": ip_int(ROOT), "hop1_expect": 0,
                                     "hop2": 0, "hop2_expect": 0})
    assert routes["LAX"] == ("LAX", {"bitmap": 8, "expect": below, "hop1": ip_int(ROOT), "hop1_expect": 0,
                                     "hop2": 0, "hop2_expect": 0})
    assert routes["SEO"] == ("NYC", {"bitmap": 4, "expect": 0, "hop1": 0, "hop1_expect": 0, "hop2": 0,
                                     "hop2_expect": 0})
    # Three levels: SIN -> SEO -> LAX -> NYC names two hops above SEO; a fourth level is refused.
    three = clique_routes(tuple(ISLANDS), "NYC", {"SEO": "LAX", "LAX": "NYC", "SIN": "SEO"}, addresses.get)
    assert three["SIN"][1]["hop2"] == ip_int(ROOT) and three["SIN"][1]["hop1_expect"] == 0b01101
    with pytest.raises(StreamError, match="climbs 4 aggregators .*at most 3 levels"):
        clique_routes(tuple(ISLANDS), "NYC", {"SEO": "LAX", "LAX": "TYO", "TYO": "NYC", "SIN": "SEO"},
                      addresses.get)


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("loss", [0.0, 0.05])
def test_two_level_round_through_chained_serves(serves, tmp_path, capsys, engine, loss):
    schedule = write_schedule(tmp_path / "tree.json", rounds=[TREE_ROUND, FLAT_ROUND])
    port = serves([ROOT, CHILD], engine)
    cities = write_map(tmp_path / "aggregators.json", {"NYC": f"{ROOT}:{port}", "LAX": f"{CHILD}:{port}"})
    code, report, err = stream_json(capsys, "--target", f"udp:{cities}", "--schedule", str(schedule),
                                    "--rounds", "4", "--elements", "1000", "--chunk", "128", "--loss", str(loss),
                                    # Without loss, no retransmission at all: the counters are compared exactly.
                                    "--timeout-ms", "40" if loss else "2000", "--seed", "3", "--job", "21")
    assert code == 0 and report["bit_exact"] is True, err
    chunks = -(-1000 // 128)
    assert report["results_checked"] == 4 * 5 * chunks
    by_city = report["aggregators"]
    if loss:
        assert report["dropped"] > 0 and report["retransmits"] >= report["dropped"]
        return
    assert report["retransmits"] == 0
    expected = golden_counters(schedule, StreamConfig(rounds=4, elements=1000, chunk=128, seed=3, job=21))
    assert_counted_as_the_model(by_city, expected)
    # LAX sums {SIN, TYO, LAX} and sends one partial per chunk up in the tree rounds.
    assert by_city["LAX"]["partials_emitted"] == 2 * chunks and by_city["NYC"]["partials_emitted"] == 0


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("loss", [0.0, 0.05])
def test_three_levels_through_three_chained_serves(serves, tmp_path, capsys, engine, loss):
    """SEO sends to TYO, which sends {SEO, TYO} to LAX, which sends {SEO, TYO, LAX} to NYC: SEO's frames
    name two aggregators above TYO."""
    three = [{"members": ISLANDS, "aggregator": "NYC", "tree": {"SEO": "TYO", "TYO": "LAX", "LAX": "NYC"}}]
    schedule = write_schedule(tmp_path / "three.json", rounds=[three])
    addresses = {"NYC": ROOT, "LAX": CHILD, "TYO": "127.0.0.4"}
    port = serves(list(addresses.values()), engine)
    cities = write_map(tmp_path / "aggregators.json", {city: f"{ip}:{port}" for city, ip in addresses.items()})
    code, report, err = stream_json(capsys, "--target", f"udp:{cities}", "--schedule", str(schedule),
                                    "--rounds", "2", "--elements", "600", "--loss", str(loss), "--seed", "6",
                                    "--timeout-ms", "40" if loss else "2000", "--job", "23")
    assert code == 0 and report["bit_exact"] is True, err
    if loss:
        assert report["dropped"] > 0
        return
    expected = golden_counters(schedule, StreamConfig(rounds=2, elements=600, seed=6, job=23), addresses)
    assert {city: counters["partials_emitted"] for city, counters in report["aggregators"].items()} == \
        {city: counters["partials_emitted"] for city, counters in expected.items()} == {"NYC": 0, "LAX": 6, "TYO": 6}
    assert_counted_as_the_model(report["aggregators"], expected)


@pytest.mark.parametrize("engine", ENGINES)
def test_a_planned_tree_streams_through_chained_serves(serves, tmp_path, capsys, engine):
    schedule = tmp_path / "planned.json"
    assert main(["schedule", "--reduce-in-path", "--islands", "SEO,TYO,LAX,NYC", "--out", str(schedule)]) == 0
    capsys.readouterr()
    cliques = [c for r in json.loads(schedule.read_text())["rounds"] for c in r["cliques"]]
    # The planner sums at TYO on the way to LAX: SEO sends to TYO, which sends one partial to LAX.
    assert cliques == [{**cliques[0], "aggregator": "LAX", "tree": {"SEO": "TYO", "TYO": "LAX"}}]
    port = serves([ROOT, CHILD], engine)
    cities = write_map(tmp_path / "aggregators.json", {"LAX": f"{ROOT}:{port}", "TYO": f"{CHILD}:{port}"})
    code, report, err = stream_json(capsys, "--target", f"udp:{cities}", "--schedule", str(schedule),
                                    "--rounds", "2", "--elements", "512", "--timeout-ms", "2000", "--job", "22")
    assert code == 0 and report["bit_exact"] is True, err
    assert report["aggregators"]["TYO"]["partials_emitted"] == 2 * 2
    assert report["model_spread"] == 0.0


def test_one_aggregator_ignores_the_trees_and_says_so(tmp_path, capsys):
    schedule = write_schedule(tmp_path / "tree.json", rounds=[TREE_ROUND])
    code, report, err = stream_json(capsys, "--target", f"pcap:{tmp_path / 'flat.pcap'}", "--schedule",
                                    str(schedule), "--rounds", "2", "--elements", "300")
    assert code == 0 and report["bit_exact"] is True
    assert err.count("reduction trees are ignored") == 1
    assert report["aggregator"]["partials_emitted"] == 0 and "aggregators" not in report


@pytest.mark.parametrize("cities, message", [
    ({"NYC": "127.0.0.2:5000"}, "no address for aggregator city LAX"),
    ({"NYC": "127.0.0.2:5000", "LAX": "127.0.0.3:5001"}, "ports 5000, 5001; a partial names only"),
    ({"NYC": "127.0.0.2:5000", "LAX": "127.0.0.2:5000"}, "'NYC' and 'LAX' are both at 127.0.0.2"),
    ({"NYC": "127.0.0.2:0", "LAX": "127.0.0.3:0"}, "port 0 names no aggregator"),
    ({"NYC": 5000}, "'NYC' maps to 5000, not"),
    ([], "must hold a JSON object"),
])
def test_a_bad_aggregator_map_is_one_line_and_exit_2(tmp_path, capsys, cities, message):
    schedule = write_schedule(tmp_path / "tree.json", rounds=[TREE_ROUND])
    target = write_map(tmp_path / "aggregators.json", cities)
    assert main(["stream", "--target", f"udp:{target}", "--schedule", str(schedule)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("inwire stream: ") and message in err and len(err.strip().splitlines()) == 1


def test_a_tree_deeper_than_three_levels_is_refused(tmp_path, capsys):
    deep = [{"members": ISLANDS, "aggregator": "NYC", "tree": {"SEO": "LAX", "LAX": "TYO", "TYO": "NYC",
                                                              "SIN": "SEO"}}]
    schedule = write_schedule(tmp_path / "deep.json", rounds=[deep])
    target = write_map(tmp_path / "aggregators.json", {c: f"127.0.0.{i + 2}:5000" for i, c in
                                                      enumerate(["NYC", "LAX", "TYO", "SEO"])})
    assert main(["stream", "--target", f"udp:{target}", "--schedule", str(schedule), "--unregistered"]) == 2
    assert ("SIN's contribution climbs 4 aggregators (SEO -> LAX -> TYO -> NYC); a frame names at most 3 levels: "
            "--unregistered carries the route in the frame (registered, the aggregators' tables hold a tree of any "
            "depth)\n") in capsys.readouterr().err


@pytest.mark.sim
@pytest.mark.parametrize("loss", [0.0, 0.05])
def test_two_level_round_through_the_gateware_in_cosimulation(tmp_path, capsys, loss):
    schedule = write_schedule(tmp_path / "tree.json", rounds=[TREE_ROUND, FLAT_ROUND])
    code, report, err = stream_json(capsys, "--target", "sim:icarus:8", "--schedule", str(schedule),
                                    "--rounds", "2", "--elements", "300", "--chunk", "100", "--loss", str(loss),
                                    "--timeout-ms", "300" if loss else "5000", "--seed", "4")
    assert code == 0 and report["bit_exact"] is True, err
    assert report["results_checked"] == 2 * 5 * 3
    if loss:
        assert report["dropped"] > 0
        return
    expected = golden_counters(schedule, StreamConfig(rounds=2, elements=300, chunk=100, seed=4, job=1))
    for city in ("LAX", "NYC"):
        assert {k: v for k, v in report["aggregators"][city].items() if v} == \
            {k: v for k, v in expected[city].items() if v}, city


def test_a_tree_city_outside_the_topology_is_refused(tmp_path, capsys):
    schedule = write_schedule(tmp_path / "odd.json", rounds=[[{**TREE_ROUND[0], "tree": {"SIN": "XYZ", "XYZ": "NYC"}}]])
    assert main(["stream", "--target", f"pcap:{tmp_path / 'x.pcap'}", "--schedule", str(schedule)]) == 2
    assert "'XYZ' is not a city of topology 'doublezero9'" in capsys.readouterr().err


def test_a_silent_city_is_named(serves, tmp_path, capsys):
    schedule = write_schedule(tmp_path / "tree.json", rounds=[TREE_ROUND])
    port = serves([ROOT], "golden")
    cities = write_map(tmp_path / "aggregators.json", {"NYC": f"{ROOT}:{port}", "LAX": f"{CHILD}:{port}"})
    assert main(["stream", "--target", f"udp:{cities}", "--schedule", str(schedule), "--timeout-ms", "50",
                 "--unregistered"]) == 2
    err = capsys.readouterr().err
    assert "no answer from the target: aggregator of LAX: no reply to" in err
