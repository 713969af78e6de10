"""The WAN lab (`inwire lab`): a three-city network emulated in namespaces, checked link by link, carrying
inwire rounds as registered jobs through chained software aggregators (their bytes counted on every link),
one gloo all_reduce and one host-tree all-reduce."""

import json
import math
import signal
import subprocess
import sys
import time

import pytest

from inwire.client import ClientError, CliqueKey, UdpMember, clique_group
from inwire.control import new_job
from inwire.lab.emulator import (
    LINK_OVERHEAD_BYTES,
    MIN_QUEUE_BYTES,
    TCP_TUNED,
    EmulatedLink,
    WanLab,
    judge,
    leftover_namespaces,
    refuse_unless_ok,
)
from inwire.lab.measure import (
    STRATEGIES,
    Measurement,
    Strategy,
    host_parents,
    link_report,
    once_per_link_bytes,
    plan_strategies,
    queue_bytes_for,
    ranking_disagreements,
    scaled_topology,
)
from inwire.netns import LabError, unavailable_reason
from inwire.plan.cost import AGGREGATE, Clique, CostModel
from inwire.plan.topology import topology_from_dict
from inwire.protocol import (
    AGGREGATION_HEADER_BYTES,
    ELEMENT_BYTES,
    ETHERNET_BYTES,
    INWIRE_PORT,
    IPV4_BYTES,
    MAX_ELEMENTS_PER_FRAME,
    RESULT_TRAILER_BYTES,
    UDP_BYTES,
    Opcode,
    frame_bytes,
)

REASON = unavailable_reason()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"network namespaces unavailable: {REASON}")
RATE_SCALE = 0.002
"""The 10 Gb/s links become 20 Mb/s ones."""
VECTOR_BYTES = 200_000


def chain():
    """A -- B -- C, 6 and 15 ms; the direct A-C link (50 ms) is slower than the way through B, so no route
    takes it and the lab does not emulate it."""
    return topology_from_dict({
        "name": "chain3",
        "cities": [{"name": name, "lat": 0.0, "lon": 10.0 * i} for i, name in enumerate("ABC")],
        "links": [{"a": "A", "b": "B", "latency_ms": 6, "bandwidth_gbps": 10},
                  {"a": "B", "b": "C", "latency_ms": 15, "bandwidth_gbps": 10},
                  {"a": "A", "b": "C", "latency_ms": 50, "bandwidth_gbps": 10}]})


@pytest.fixture(scope="module")
def lab():
    with WanLab(chain(), delay_scale=1.0, rate_scale=RATE_SCALE,
                queue_bytes=queue_bytes_for("ABC", VECTOR_BYTES)) as built:
        yield built


TREE = ((("A", "B", "C"), "A", {"B": "A", "C": "B"}),)
"""One clique summed along the chain to A: C's island sends to B's aggregator, which sums it with B's island's
and sends one partial to A; the result comes back to B once, and B hands it to its own island and to C's."""
FLAT = ((("A", "B", "C"), "A", {}),)
"""The same clique summed at A alone: B's and C's contributions both cross B-A, and their two results A-B."""


@pytest.fixture(scope="module")
def registered(lab):
    """The lab's services, and one repetition of TREE and of FLAT through them (each a registered job):
    {name: (times, retransmits, bytes per link direction, the once-per-link bound)}."""
    strategies = [Strategy("tree", (TREE,), math.nan, "a tree rooted at A"),
                  Strategy("flat", (FLAT,), math.nan, "summed at A alone")]
    with Measurement(lab, lab.cities, VECTOR_BYTES, strategies, reps=1) as measurement:
        yield measurement, {strategy.name: measurement.inwire(strategy) for strategy in strategies}


def test_a_registered_tree_sums_bit_exact_and_each_frame_crosses_each_link_once(lab, registered):
    measurement, runs = registered
    _, retransmits, carried, bound = runs["tree"]
    # Every island's sum was compared with the exact one (Measurement raises otherwise), and no frame was sent
    # twice, so the bytes on the links are exact: every packet carries its IPv4, UDP and inwire headers (and a
    # partial's or result's status trailer) and nothing else crosses a link, so no tolerance is needed.
    assert retransmits == 0
    counts = [min(measurement.chunk, measurement.elements - first)
              for first in range(0, measurement.elements, measurement.chunk)]
    contribution = sum(IPV4_BYTES + UDP_BYTES + AGGREGATION_HEADER_BYTES + ELEMENT_BYTES * count for count in counts)
    summed = contribution + RESULT_TRAILER_BYTES * len(counts)  # a partial or a result
    assert bound == {("C", "B"): contribution, ("B", "A"): summed, ("A", "B"): summed, ("B", "C"): summed}
    assert carried == [bound]
    report = link_report(lab.directions, carried, bound)
    assert report["link_bytes_over_bound"] == 1.0 and report["links_over_bound"] == []
    assert report["link_bytes"] == [{"A->B": summed, "B->A": summed, "B->C": summed, "C->B": contribution}]


def test_results_sent_down_a_link_twice_exceed_the_tree_s_bound(lab, registered):
    _, runs = registered
    tree_bound = runs["tree"][3]
    _, retransmits, carried, bound = runs["flat"]
    assert retransmits == 0 and carried == [bound]  # the flat clique's own bound holds
    # Summed at A alone, B's and C's results both go down A-B (and both contributions up B-A): against the
    # tree's bound the report names both directions.
    assert bound[("A", "B")] == 2 * tree_bound[("A", "B")]
    report = link_report(lab.directions, carried, tree_bound)
    assert report["links_over_bound"] == ["A->B", "B->A"] and report["link_bytes_over_bound"] > 1.4


def test_the_model_charges_each_link_what_the_registered_tree_sends():
    """The cost model the lab predicts with (trees in the tables, no multicast) picks TREE's tree for the clique
    summed at A, and charges each link direction as many vectors as `once_per_link_bytes` counts on it."""
    islands = ("A", "B", "C")
    model = CostModel(scaled_topology(chain(), 1.0, RATE_SCALE), islands, VECTOR_BYTES, multicast=False,
                      reduce_in_path=True, tree_tables=True)
    profile = model.profile(Clique(islands, "A", AGGREGATE))
    assert profile.tree == TREE[0][2]
    elements = math.ceil(VECTOR_BYTES / ELEMENT_BYTES)
    bound = once_per_link_bytes(chain(), TREE, elements, MAX_ELEMENTS_PER_FRAME)
    vector_bytes = once_per_link_bytes(chain(), [(("A", "B"), "B", {})], elements, MAX_ELEMENTS_PER_FRAME)[("A", "B")]
    charged = {edge: round(profile.loads_bits[index] / model.vector_bits) for edge, index in model.edge_index.items()
               if profile.loads_bits[index]}
    assert charged == {edge: round(count / vector_bytes) for edge, count in bound.items()} == dict.fromkeys(bound, 1)


def test_the_lab_s_aggregators_take_registered_jobs_only(lab, registered):
    """A one-member clique at A's aggregator: unregistered (version 2), no result ever comes; registered with
    the lab's key, from the same socket, it does."""
    measurement, _ = registered
    with lab.inside("A"):
        member = UdpMember((lab.addresses["A"], INWIRE_PORT), chunk=4, timeout_s=0.2, deadline_s=1.0,
                           bind=(lab.addresses["A"], 0))
    try:
        # A well-formed unregistered frame (its result group in 239.0.0.0/8, as version 2 needs), which an
        # aggregator that takes unregistered frames answers at once.
        with pytest.raises(ClientError, match="no result"):
            member.sum(CliqueKey(job=7, round=1, clique=0, group=clique_group(0, 0), fanin=1, exponent=0), 0,
                       [1, 2, 3])
        job = new_job([member.address], measurement.slots)
        with measurement.registered({"A": job}):
            member.join(job)
            key = CliqueKey(job=job.job, round=1, clique=0, group=0, fanin=1, exponent=0, token=job.token)
            assert member.sum(key, 0, [1, 2, 3])[0].tolist() == [1, 2, 3]
    finally:
        member.close()


def test_the_queues_hold_every_island_s_window_in_flight():
    frame = frame_bytes(MAX_ELEMENTS_PER_FRAME, Opcode.RESULT) - ETHERNET_BYTES + LINK_OVERHEAD_BYTES
    chunks = math.ceil(VECTOR_BYTES / ELEMENT_BYTES / MAX_ELEMENTS_PER_FRAME)
    # Twice every island's whole vector (its window holds all of it), then a window of 1024 chunks at most.
    assert queue_bytes_for("ABC", VECTOR_BYTES) == 2 * 3 * chunks * frame
    assert queue_bytes_for(range(9), 64e6) == queue_bytes_for(range(9), 8e6) == 2 * 9 * 1024 * frame
    assert queue_bytes_for(range(9), 64e6, window=100) == 2 * 9 * 100 * frame
    assert queue_bytes_for("AB", 4) == MIN_QUEUE_BYTES
    # A link whose bandwidth-delay product is longer queues that much (as TCP needs), whatever the vector.
    lab = WanLab(chain(), queue_bytes=MIN_QUEUE_BYTES)
    assert lab.queue_limit(EmulatedLink("A", "B", 0.1, 1e9)) == 1e9 / 8 * 0.2
    assert lab.queue_limit(EmulatedLink("A", "B", 0.001, 1e8)) == MIN_QUEUE_BYTES


@pytest.fixture(scope="module")
def checked(lab):
    return lab.check(seconds=2)


def test_the_emulated_links_hold_their_delay_and_rate(lab, checked):
    assert [link.name for link in lab.links] == ["A-B", "B-C"]
    for row in checked:
        assert row["ok"], row["problems"]
        assert row["measured_delay_ms"] == pytest.approx(row["delay_ms"], rel=0.1)
        assert row["tcp_mbps"] == pytest.approx(row["tcp_expected_mbps"], rel=0.1)
        assert row["udp_mbps"] == pytest.approx(row["udp_expected_mbps"], rel=0.1)
    refuse_unless_ok(checked)
    # Routes follow the shortest paths: A reaches C through B, at the sum of both delays.
    a_to_c = EmulatedLink("A", "C", 21e-3, 0.0)
    assert lab.probe_delay_ms(a_to_c) == pytest.approx(21.0, rel=0.1)


def test_the_check_names_a_link_that_is_not_what_was_asked(lab, checked):
    # The same measurements against a delay 40 % longer on A-B and a rate 25 % higher on B-C.
    slower = EmulatedLink("A", "B", lab.links[0].delay_s * 1.4, lab.links[0].rate_bps)
    faster = EmulatedLink("B", "C", lab.links[1].delay_s, lab.links[1].rate_bps * 1.25)
    rows = [judge(checked[0], slower), judge(checked[1], faster)]
    assert not rows[0]["ok"] and [p.split()[0] for p in rows[0]["problems"]] == ["delay"]
    assert not rows[1]["ok"] and [p.split()[0] for p in rows[1]["problems"]] == ["TCP", "UDP"]
    with pytest.raises(LabError, match=r"2 of 2 links.*A-B: delay.*B-C: TCP"):
        refuse_unless_ok(rows)


def test_a_link_shaped_wrong_is_caught(lab):
    # Halve the rate of B's side of B-C in the kernel: the UDP check (C to B) is unaffected, the TCP one
    # (B to C) sees half the rate.
    namespace, device = lab.namespaces["B"], lab.device("B", "C")
    link = lab.links[1]

    def shape(rate_bps):
        subprocess.run(["tc", "-n", namespace, "qdisc", "change", "dev", device, "root", "tbf", "rate",
                        f"{int(rate_bps)}bit", "burst", "16000", "limit", str(lab.queue_limit(link))], check=True)

    shape(link.rate_bps / 2)
    try:
        row = lab.check(seconds=2, links=[link])[0]
    finally:
        shape(link.rate_bps)
    assert not row["ok"] and any(p.startswith("TCP") for p in row["problems"]), row
    assert row["tcp_mbps"] == pytest.approx(row["tcp_expected_mbps"] / 2, rel=0.15)


def test_one_inwire_round_and_one_gloo_all_reduce_cross_the_lab(lab, checked, registered):
    refuse_unless_ok(checked)
    strategies = plan_strategies(lab.topology, None, VECTOR_BYTES, 1.0, RATE_SCALE,
                                 names=("global_tree", "host_tree", "gloo"))
    tree, hosts, gloo = strategies
    # The model's tree for a chain rooted at B: every island sends straight to B (A and C sum nothing), where
    # the module's services run already (one repetition, as the model's strategies need).
    assert tree.rounds[0][0][1] == "B"
    measurement = registered[0]
    times = measurement.inwire(tree)[0]
    gloo_times, late, error = measurement.gloo(gloo)
    host_times, host_late, host_error = measurement.host_tree(hosts)
    # The sums were checked against every island's vector (Measurement raises otherwise). One round takes at
    # least the slowest member's round trip (A and C to B: 2 x 15 ms) and the busiest link's serialization.
    serialization_ms = 1e3 * 8 * VECTOR_BYTES / lab.links[0].rate_bps
    assert times[0] >= 30 + serialization_ms
    assert times[0] == pytest.approx(tree.predicted_ms, rel=0.5)
    assert gloo_times[0] >= 30 + serialization_ms and error < 1e-3
    # The host tree: B's host sums A's and C's vectors with its own (root B: the model's rule) and sends the
    # sum back; float32 sums in another order than float64 numpy's.
    assert hosts.order[0] == "B" and host_parents(lab.topology, hosts.order) == {"A": "B", "C": "B"}
    assert host_times[0] >= 30 + serialization_ms and host_error < 1e-4 and host_late == 0


def test_an_open_mpi_all_reduce_of_each_algorithm_crosses_the_lab(lab, checked):
    refuse_unless_ok(checked)
    ring, tree = plan_strategies(lab.topology, None, VECTOR_BYTES, 1.0, RATE_SCALE, names=("mpi_ring", "mpi_tree"))
    assert tree.order[0] == "B" and set(ring.order) == set(lab.cities)
    serialization_ms = 1e3 * 8 * VECTOR_BYTES / lab.links[0].rate_bps
    with Measurement(lab, lab.cities, VECTOR_BYTES, [ring, tree], reps=1) as measurement:
        for strategy in (ring, tree):
            times, late, error = measurement.mpi(strategy)
            # Every rank's sum is float64 numpy's up to float32 rounding, and the ranks met across the emulated
            # links: A's and C's vectors reach each other through B, at least 2 x 21 ms of delay for the ring
            # (A to C and back) and for the tree (A and C to B and back), plus one vector's serialization.
            assert len(times) == 1 and error < 1e-4 and late == 0, strategy.name
            assert times[0] >= 2 * 15 + serialization_ms, strategy.name


def test_an_mpirun_stopped_at_its_deadline_is_run_again_once_and_counted(lab, monkeypatch):
    ring, = plan_strategies(lab.topology, None, VECTOR_BYTES, 1.0, RATE_SCALE, names=("mpi_ring",))
    with Measurement(lab, lab.cities, VECTOR_BYTES, [ring], reps=1) as measurement:
        deadlines = iter([0.05, measurement.mpirun_timeout_s()])
        monkeypatch.setattr(measurement, "mpirun_timeout_s", lambda: next(deadlines))
        times, _, error = measurement.mpi(ring)
        assert len(times) == 1 and error < 1e-4 and measurement.mpirun_reruns == {"mpi_ring": 1}
        monkeypatch.setattr(measurement, "mpirun_timeout_s", lambda: 0.05)
        with pytest.raises(LabError, match=r"^mpi_ring: mpirun did not finish in time, 2 times"):
            measurement.mpi(ring)


def test_a_failing_mpirun_is_named_with_its_strategy(lab, monkeypatch):
    from inwire.lab import mpi

    monkeypatch.setitem(mpi.ALGORITHMS, "ring", {"coll_tuned_allreduce_algorithm": "4", "btl": "no-such-transport"})
    ring, = plan_strategies(lab.topology, None, VECTOR_BYTES, 1.0, RATE_SCALE, names=("mpi_ring",))
    with Measurement(lab, lab.cities, VECTOR_BYTES, [ring], reps=1) as measurement:
        with pytest.raises(LabError, match=r"^mpi_ring: mpirun failed \(status [1-9]"):
            measurement.mpi(ring)


SOCKET_CONGESTION = ("import socket; s = socket.socket(); "
                     "print(s.getsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, 16).rstrip(b'\\0').decode(), "
                     "open('/proc/sys/net/ipv4/tcp_slow_start_after_idle').read().strip())")
"""What a new TCP socket in a city gets: its congestion control, and whether it restarts slow start after idle."""


def _new_sockets(lab):
    return {city: subprocess.run(lab.command(city, sys.executable, "-c", SOCKET_CONGESTION), capture_output=True,
                                 text=True, check=True).stdout.split() for city in lab.cities}


def test_a_tuned_strategy_s_sockets_get_reno_without_slow_start_after_idle_in_every_city_and_only_then(lab):
    before = _new_sockets(lab)
    assert before["A"] != ["reno", "0"], "the namespaces' own TCP would not tell tuned from untuned"
    with lab.tcp(TCP_TUNED) as settings:
        assert _new_sockets(lab) == {city: ["reno", "0"] for city in lab.cities}
        assert settings == TCP_TUNED
    assert _new_sockets(lab) == before


def test_the_tuned_baselines_are_the_same_plans_as_the_untuned_ones():
    names = [name for name in STRATEGIES if name.startswith(("host_tree", "gloo"))]
    assert names == ["host_tree", "host_tree_tuned", "gloo", "gloo_tuned"]
    plain_tree, tuned_tree, plain_gloo, tuned_gloo = plan_strategies(chain(), None, VECTOR_BYTES, 1.0, RATE_SCALE,
                                                                     names=names)
    for plain, tuned in ((plain_tree, tuned_tree), (plain_gloo, tuned_gloo)):
        assert tuned.tuned and not plain.tuned
        assert (tuned.order, tuned.predicted_ms) == (plain.order, plain.predicted_ms)
        assert "reno" in tuned.description and "reno" not in plain.description


def test_a_measured_order_against_a_clear_prediction_is_reported():
    def entries(*rows):
        return [{"name": name, "predicted_ms": predicted, "measured_ms": measured}
                for name, predicted, measured in rows]

    assert ranking_disagreements(entries(("x", 100, 110), ("y", 200, 190))) == []
    assert ranking_disagreements(entries(("x", 100, 300), ("y", 200, 250))) == [("x", "y")]
    # Predictions 3 % apart are a tie: either measured order agrees with the model.
    assert ranking_disagreements(entries(("x", 100, 300), ("y", 103, 250))) == []


def test_leftover_namespaces_of_a_dead_run_are_found_and_removed():
    dead = 2 ** 22 + 1  # above the default pid_max: no process has it
    name = f"iwlab{dead}n0c0"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        assert name in leftover_namespaces()
        with WanLab(chain(), rate_scale=RATE_SCALE) as other:
            assert name not in namespaces()
            own = set(other.namespaces.values())
            assert own <= namespaces()
        assert not own & namespaces()  # removed on exit
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True)


def namespaces():
    listing = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=10).stdout
    return {line.split()[0] for line in listing.splitlines() if line.strip()}


def test_the_cli_refuses_bad_options_in_one_line():
    for argv, message in ((["--rate-scale", "0.5"], "--rate-scale"), (["--strategies", "ring"], "unknown strategy"),
                          (["--reps", "0"], "--reps"), (["--loss", "0.7"], "--loss")):
        run = subprocess.run([sys.executable, "-m", "inwire", "lab", *argv], capture_output=True, text=True)
        assert run.returncode == 2 and message in run.stderr and len(run.stderr.strip().splitlines()) == 1, run.stderr


def test_without_root_the_lab_says_so_in_one_line(tmp_path):
    run = subprocess.run(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", sys.executable, "-m",
                          "inwire", "lab", "--check-only", "--topology", "doublezero9"],
                         capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert run.returncode == 2, run.stderr
    assert run.stderr.strip().splitlines()[-1] == ("inwire lab: network namespaces unavailable: they need root; run "
                                                   "the command as root")


def test_ctrl_c_removes_the_namespaces(tmp_path):
    topology = tmp_path / "chain3.json"
    topology.write_text(json.dumps(chain().to_dict()))
    before = namespaces()
    process = subprocess.Popen([sys.executable, "-m", "inwire", "lab", "--check-only", "--topology", str(topology)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # The lab is up once its link process has started: the check (seconds of iperf3) is then running.
        for _ in range(300):
            ours = {name for name in namespaces() if name.startswith(f"iwlab{process.pid}n")}
            if len(ours) == 3 and "iperf3" in subprocess.run(["ps", "-e", "-o", "comm"], capture_output=True,
                                                             text=True).stdout:
                break
            time.sleep(0.1)
        else:
            pytest.fail("the lab did not come up")
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 130, err
    assert namespaces() <= before


def test_rotation_is_two_rounds_of_three_cliques_of_three_that_cross_once():
    from inwire.plan.topology import load_topology

    rotation, = plan_strategies(load_topology("doublezero9"), None, 500_000, 4.0, RATE_SCALE, names=("rotation",))
    rows, columns = ([set(members) for members, _, _ in cliques] for cliques in rotation.rounds)
    islands = set(load_topology("doublezero9").cities)
    for cliques in (rows, columns):
        assert sorted(map(len, cliques)) == [3, 3, 3] and set().union(*cliques) == islands
    # Every clique of the second round meets every clique of the first in one island: two rounds mix all nine.
    assert all(len(row & column) == 1 for row in rows for column in columns)
    assert all(root is not None for cliques in rotation.rounds for _, root, _ in cliques)
    assert rotation.predicted_ms > 0
