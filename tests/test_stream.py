"""Islands against the software aggregator and into a capture: bit-exact checks, loss recovery, bad input."""

import json
import os
import socket
import threading

import numpy as np
import pytest

from inwire import client
from inwire.cli import main
from inwire.datagram import payload_of
from inwire.model import Aggregator, AggregatorConfig
from inwire.packets import build_frames, frame_field
from inwire.pcap import read_frames
from inwire.protocol import FRAME_HEADER_BYTES, Opcode
from inwire.serve import SoftwareAggregator
from inwire.stream import StreamConfig, Workload, format_report, load_plan, run_stream
from inwire.transport import CaptureTransport, UdpTransport, probe_stats
from schedules import ISLANDS, PERIOD, write_schedule

REGISTERED = {"engine": "golden"}
"""A service `inwire stream --target udp://` registers its job with: the engine that holds job tables."""


class Service:
    """A software aggregator in a thread, taking registered jobs beside unregistered frames as `inwire serve`
    does; `tamper` may rewrite its answers."""

    def __init__(self, tamper=None, listen=("127.0.0.1", 0), **options):
        self.aggregator = SoftwareAggregator(listen, unicast=True, registered=True, log=lambda line: None,
                                             **options)
        if tamper:
            # serve() decides a recvmmsg batch at a time with the compiled kernel, else datagram by datagram.
            name = "handle_batch" if self.aggregator.batch_io else "handle"
            decide = getattr(self.aggregator, name)
            setattr(self.aggregator, name, lambda *args: [(tamper(body), to) for body, to in decide(*args)])
        self.thread = threading.Thread(target=self.aggregator.serve, daemon=True)
        self.thread.start()
        self.target = "udp://{}:{}".format(*self.aggregator.address)

    def close(self):
        self.aggregator.stop()
        self.thread.join(5)
        self.aggregator.close()


@pytest.fixture
def service():
    services = []

    def start(**options):
        services.append(Service(**options))
        return services[-1]
    yield start
    for running in services:
        running.close()


@pytest.fixture
def schedule(tmp_path):
    return write_schedule(tmp_path / "schedule.json")


def stream_cli(*argv):
    return main(["stream", *argv])


def test_islands_get_bit_exact_results(service, schedule):
    running = service()
    plan = load_plan(schedule)
    config = StreamConfig(rounds=4, elements=1000, chunk=128, window=3, job=11)
    report = run_stream(plan, config, UdpTransport({island: running.aggregator.address for island in plan.islands}))
    chunks = -(-1000 // 128)
    assert report["bit_exact"] and report["finished"]
    assert [r["results_checked"] for r in report["rounds"]] == [5 * chunks] * 4
    assert report["retransmits"] == 0 and report["wrong_results"] == 0
    assert report["aggregator"]["accumulated"] == 4 * 5 * chunks
    assert report["aggregator"]["drop_collision"] == 0
    # Clique averages differ between cliques, so the islands' models are not all equal yet.
    assert report["model_spread"] > 0


def test_models_agree_after_a_global_round(service, tmp_path):
    running = service()
    plan = load_plan(write_schedule(tmp_path / "global.json", rounds=[PERIOD[2]]))
    report = run_stream(plan, StreamConfig(rounds=2, elements=300, job=3),
                        UdpTransport({island: running.aggregator.address for island in plan.islands}))
    assert report["bit_exact"] and report["model_spread"] == 0.0


def test_loss_is_recovered_by_retransmission(service, schedule):
    running = service()
    plan = load_plan(schedule)
    config = StreamConfig(rounds=3, elements=2000, loss=0.25, timeout_ms=30, seed=5, job=12)
    report = run_stream(plan, config, UdpTransport({island: running.aggregator.address for island in plan.islands}))
    assert report["bit_exact"]
    assert report["dropped"] > 0 and report["retransmits"] >= report["dropped"]
    assert report["aggregator"]["answered"] > 0 or report["aggregator"]["drop_duplicate"] > 0


def test_wrong_results_fail_the_run(service, schedule, capsys):
    def flip_last_element(body):
        if body[3] != Opcode.RESULT:
            return body
        return body[:-8] + bytes([body[-8] ^ 1]) + body[-7:]
    running = service(tamper=flip_last_element, **REGISTERED)
    assert stream_cli("--target", running.target, "--schedule", str(schedule), "--rounds", "1",
                      "--elements", "256", "--json") == 1
    report = json.loads(capsys.readouterr().out)
    assert report["bit_exact"] is False and report["wrong_results"] == report["results_checked"] == 5


def test_a_round_whose_results_carry_another_token_never_finishes_within_its_timeouts(service, schedule, capsys):
    """Results that do not carry the job's token are refused and counted, so the round runs out of retries."""
    def another_token(body):
        return body[:client.PAYLOAD_HEADER_BYTES - 1] + bytes([body[client.PAYLOAD_HEADER_BYTES - 1] ^ 1]) \
            + body[client.PAYLOAD_HEADER_BYTES:] if body[3] == Opcode.RESULT else body
    running = service(tamper=another_token, **REGISTERED)
    code = stream_cli("--target", running.target, "--schedule", str(schedule), "--rounds", "2",
                      "--elements", "512", "--timeout-ms", "20", "--retries", "3", "--json")
    captured = capsys.readouterr()
    assert code == 1
    report = json.loads(captured.out)
    assert not report["rounds"][0]["finished"] and report["bit_exact"] is False
    assert report["results_refused"] > 0 and report["results_checked"] == 0
    assert "no result for chunk" in captured.err
    # The diagnosis names the refused token, not an address, and never suggests dropping the registration.
    assert report["results_from_elsewhere"] == 0
    assert report["diagnosis"] == [f"the islands refused {report['results_refused']} results without their job's "
                                   f"version and token: results of another job, or forged ones, reach the "
                                   f"islands' ports"]


def test_an_aggregator_too_small_for_the_run_refuses_its_registration(service, schedule, capsys):
    running = service(slots=4, **REGISTERED)
    code = stream_cli("--target", running.target, "--schedule", str(schedule), "--rounds", "2",
                      "--elements", "512", "--timeout-ms", "20", "--job", "5")
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1
    assert "refused the registration of job 5: job 5: no 32 free slots in a row among this aggregator's 4" in err


def test_human_report(service, schedule, capsys):
    running = service(**REGISTERED)
    assert stream_cli("--target", running.target, "--schedule", str(schedule), "--rounds", "3",
                      "--elements", "100") == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split()[:3] == ["round", "cliques", "time"]
    assert "bit_exact: true" in out


def test_pcap_target_writes_a_replayable_capture(tmp_path, schedule, capsys):
    capture = tmp_path / "round.pcap"
    assert stream_cli("--target", f"pcap:{capture}", "--schedule", str(schedule), "--rounds", "2",
                      "--elements", "600", "--json") == 0
    report = json.loads(capsys.readouterr().out)
    assert report["bit_exact"]
    frames = read_frames(capture)
    chunks = -(-600 // 256)
    assert len(frames) == 2 * 5 * chunks
    assert {frame_field(f, "opcode") for f in frames} == {Opcode.CONTRIBUTION}
    # Replayed on a fresh golden model, the capture completes every slot with the sums the islands expect.
    plan = load_plan(schedule)
    workload = Workload(plan, StreamConfig(rounds=2, elements=600, job=report["job"]))
    default = AggregatorConfig()
    model = Aggregator(AggregatorConfig(slots=max(default.slots, report["slots_needed"])))
    results = [out for frame in frames for out in model.process(frame)]
    assert len(results) == 2 * len(PERIOD[0]) * chunks
    for result in results:
        round_, clique = frame_field(result, "round"), frame_field(result, "clique")
        members = plan.cliques(round_)[clique][0]
        expected = workload.expected_sum(workload.clique_of(members[0], round_))
        chunk, count = frame_field(result, "chunk"), frame_field(result, "count")
        got = np.frombuffer(result, ">i4", count, FRAME_HEADER_BYTES)
        assert np.array_equal(got, expected[chunk:chunk + count])


def test_loss_on_the_pcap_target_leaves_retransmissions_in_the_capture(tmp_path, schedule, capsys):
    capture = tmp_path / "lossy.pcap"
    assert stream_cli("--target", f"pcap:{capture}", "--schedule", str(schedule), "--rounds", "1",
                      "--elements", "1024", "--loss", "0.3", "--timeout-ms", "5", "--json") == 0
    report = json.loads(capsys.readouterr().out)
    assert report["bit_exact"] and report["retransmits"] > 0
    assert len(read_frames(capture)) == 5 * 4 + report["retransmits"] - report["dropped"]


@pytest.mark.sim
@pytest.mark.parametrize("simulator", ["icarus", "verilator"])
def test_sim_target_runs_the_islands_against_the_gateware(schedule, capsys, simulator):
    width = "8" if simulator == "icarus" else "64"
    assert stream_cli("--target", f"sim:{simulator}:{width}", "--schedule", str(schedule), "--rounds", "3",
                      "--elements", "300", "--chunk", "128", "--json") == 0
    report = json.loads(capsys.readouterr().out)
    chunks = -(-300 // 128)
    assert report["bit_exact"] and report["finished"]
    assert [r["results_checked"] for r in report["rounds"]] == [5 * chunks] * 3
    assert report["aggregator"]["accumulated"] == 3 * 5 * chunks


def _closed_port():
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.parametrize("argv, message", [
    (["--target", "udp://127.0.0.1:{closed}"], "no answer from 127.0.0.1:"),
    (["--target", "udp://127.0.0.1:{closed}", "--job", "0"], "--job 0 cannot be registered: a registered job's id is "
                                                             "a nonzero 32-bit number"),
    (["--target", "tcp://x"], "is not one of"),
    (["--target", "sim:modelsim"], "sim:SIMULATOR[:WIDTH]"),
    (["--target", "sim:icarus:12"], "sim:SIMULATOR[:WIDTH]"),
    (["--target", "udp://127.0.0.1:{closed}", "--elements", "0"], "--elements must be positive"),
    (["--target", "udp://127.0.0.1:{closed}", "--elements", "-5"], "--elements must be positive"),
    (["--target", "udp://127.0.0.1:{closed}", "--loss", "1.5"], "--loss"),
    (["--target", "udp://nowhere.invalid:1"], "cannot resolve"),
])
def test_bad_input_is_one_line_and_exit_2(schedule, capsys, argv, message):
    argv = [part.format(closed=_closed_port()) for part in argv]
    assert stream_cli(*argv, "--schedule", str(schedule), "--timeout-ms", "50") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err and "Traceback" not in err


@pytest.mark.parametrize("content, message", [
    (None, "cannot read schedule"),
    ("{not json", "not valid JSON"),
    ({"rounds": [[{"members": ["SIN", "ATL"], "aggregator": "TYO"}]]}, "is not one of the islands"),
    ({"aggregator": "ATL"}, "'ATL' is not a city of topology"),
    ({"islands": ISLANDS + ["ATL"]}, "'ATL' is not a city of topology"),
    ({"topology": "atlantis"}, "'topology' 'atlantis' is neither a built-in topology"),
    ({"topology": "atlantis.json"}, "cannot read topology"),
])
def test_bad_schedules_are_one_line_and_exit_2(tmp_path, capsys, content, message):
    path = tmp_path / "schedule.json"
    if isinstance(content, str):
        path.write_text(content)
    elif isinstance(content, dict):
        islands = content.get("islands", ISLANDS)
        rounds = PERIOD
        if "rounds" in content:
            rounds = [[{**c} for c in cliques] for cliques in content["rounds"]]
        if "aggregator" in content:
            rounds = [[{**PERIOD[0][0], "aggregator": content["aggregator"]}]]
        write_schedule(path, rounds=rounds, islands=islands, topology=content.get("topology", "doublezero9"))
    assert stream_cli("--target", "pcap:" + str(tmp_path / "x.pcap"), "--schedule", str(path)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err


@pytest.mark.parametrize("io", ["batched", "python"])
def test_islands_are_bit_exact_over_both_io_paths(service, schedule, io):
    """recvmmsg/sendmmsg (with the compiled kernel: the fast path's service) and the all-Python loops (the golden
    model's service), on both ends."""
    from inwire import fastpath

    if io == "batched" and fastpath.compiled is None:
        if os.environ.get("CI") == "true":
            pytest.fail("the compiled fast path inwire._kernel is not built (make setup builds it)")
        pytest.skip("the compiled fast path inwire._kernel is not built")
    running = service(engine="fast" if io == "batched" else "golden")
    assert running.aggregator.batch_io == (io == "batched")
    plan = load_plan(schedule)
    config = StreamConfig(rounds=3, elements=3000, chunk=200, window=6, job=21)
    report = run_stream(plan, config, UdpTransport({island: running.aggregator.address for island in plan.islands},
                                                   window=config.window, chunk=config.chunk,
                                                   batch_io=io == "batched"))
    assert report["bit_exact"] and report["retransmits"] == 0
    assert report["results_checked"] == sum(len(m) for r in range(3) for m, _ in plan.cliques(r)) * 15


@pytest.mark.parametrize("islands", [3, 9])
def test_a_full_window_from_every_island_is_not_dropped(service, tmp_path, islands):
    """islands x 32 datagrams in flight at once fit the service's receive buffer: no drops, no retransmits
    (the Linux default buffer holds about 90 datagrams of 1 KiB)."""
    cities = ["LON", "FRA", "AMS", "NYC", "LAX", "SIN", "TYO", "SEO", "BAR"][:islands]
    path = write_schedule(tmp_path / "clique.json", rounds=[[{"members": cities, "aggregator": "AMS"}]],
                          islands=cities)
    running = service()
    granted = running.aggregator.receive_buffer
    assert granted >= islands * 32 * 2300, (
        f"the kernel granted a {granted}-byte receive buffer, too small for {islands} x 32 datagrams of 1 KiB: "
        f"raise net.core.rmem_max (sysctl -w net.core.rmem_max=4194304) or run the tests as root")
    plan = load_plan(path)
    config = StreamConfig(rounds=2, elements=256 * 96, chunk=256, window=32, timeout_ms=2000, job=22)
    report = run_stream(plan, config, UdpTransport({island: running.aggregator.address for island in plan.islands},
                                                   window=config.window, chunk=config.chunk))
    assert report["bit_exact"] and report["retransmits"] == 0
    assert report["aggregator"]["accumulated"] == 2 * islands * 96


def test_jumbo_chunks_on_loopback(service, schedule):
    running = service(max_elements=2048)
    plan = load_plan(schedule)
    config = StreamConfig(rounds=2, elements=5000, chunk=2048, window=2, job=23)
    report = run_stream(plan, config, UdpTransport({island: running.aggregator.address for island in plan.islands},
                                                   window=config.window, chunk=config.chunk))
    assert report["bit_exact"] and report["results_checked"] == 5 * 3 * 2


def test_chunk_above_8_kib_is_refused(schedule, capsys):
    assert stream_cli("--target", "pcap:/dev/null", "--schedule", str(schedule), "--chunk", "2049") == 2
    assert "--chunk must lie in [1, 2048]" in capsys.readouterr().err


class BatchingCapture(CaptureTransport):
    """The golden model's answers held and handed to the islands in batches, as recvmmsg reads them: through
    `deliver_batch` (`batched`) or datagram by datagram through `deliver`, the same batches either way. Each
    batch also carries what no island's sum takes: the island's previous batch again (results it already has,
    or of an earlier round), a datagram too short to have an opcode, and one of another job; stats are asked
    in-band, so their replies share those batches."""

    SLOT = UdpTransport.SLOT

    def __init__(self, batched, plan, config):
        super().__init__(None, plan.islands, 64, config.chunk)
        self.batched = batched
        self.queued, self.previous, self.sent = {}, {}, {}
        self.batches = 0
        self.foreign = payload_of(build_frames(np.ones(4, dtype=np.int32), status=0, opcode=Opcode.RESULT,
                                               job=config.job + 1)[0].tobytes())

    async def start(self, deliver, deliver_batch=None):
        await super().start(self.hold)
        self.deliver_each, self.deliver_batch = deliver, deliver_batch if self.batched else None

    def hold(self, island, payload):
        if not self.queued:
            self.loop.call_soon(self.flush)
        self.queued.setdefault(island, []).append(bytes(payload))

    def flush(self):
        queued, self.queued = self.queued, {}
        for island, payloads in queued.items():
            batch = [*self.previous.get(island, []), b"\x01", *payloads, self.foreign]
            self.previous[island] = payloads
            sizes, buffer = [len(p) for p in batch], bytearray(self.SLOT * len(batch))
            for index, payload in enumerate(batch):
                buffer[index * self.SLOT:index * self.SLOT + len(payload)] = payload
            self.batches += 1
            if self.deliver_batch is not None:
                self.deliver_batch(island, buffer, sizes, self.SLOT)
            else:
                for index, size in enumerate(sizes):
                    self.deliver_each(island, memoryview(buffer)[index * self.SLOT:index * self.SLOT + size])

    def send(self, island, payload, city=None):
        self.sent.setdefault(island, []).append(bytes(payload))
        super().send(island, payload, city)

    async def stats(self, island, stats_future, first_wait, budget, city=None, request=None):
        return await probe_stats(self, island, stats_future, first_wait, budget, city, request)


def test_batched_delivery_sends_what_per_datagram_delivery_sends(schedule):
    """A batch handed over at once (`deliver_batch`, one `on_results` call) and the same batch datagram by
    datagram: every island sends the same datagrams in the same order, and the stats replies, in batches with
    results and other datagrams, reach the stats requests."""
    plan = load_plan(schedule)
    config = StreamConfig(rounds=3, elements=3000, chunk=200, window=6, job=23)
    runs = {}
    for batched in (True, False):
        transport = BatchingCapture(batched, plan, config)
        runs[batched] = transport, run_stream(plan, config, transport)
    (batched, report), (each, expected) = runs[True], runs[False]
    assert batched.batches == each.batches > 3 * len(plan.islands)
    assert batched.sent == each.sent
    assert report["bit_exact"] and report["retransmits"] == 0
    assert report["aggregator"] == expected["aggregator"] and report["aggregator"]["accumulated"] > 0
    assert [r["results_checked"] for r in report["rounds"]] == [r["results_checked"] for r in expected["rounds"]]


class RefusingSocket:
    """An island's socket whose first `refused` sends fail as with a full send buffer: the datagram is lost."""

    def __init__(self, sock, refused):
        self.sock, self.refused = sock, refused

    def sendto(self, payload, target):
        if self.refused:
            self.refused -= 1
            raise BlockingIOError("send buffer full")
        return self.sock.sendto(payload, target)

    def __getattr__(self, name):
        return getattr(self.sock, name)


class RefusingTransport(UdpTransport):
    """UdpTransport whose islands' sockets each refuse their first `refused` sends."""

    refused = 2

    async def start(self, deliver, deliver_batch=None):
        await super().start(deliver, deliver_batch)
        self.sockets = {island: RefusingSocket(sock, self.refused) for island, sock in self.sockets.items()}


def test_sends_the_islands_sockets_refused_are_reported(service, schedule):
    """A datagram an island's socket could not send is lost and retransmitted; the report counts it
    (`send_errors`), beside the kernel's drops, and the summary line names it."""
    running = service()
    plan = load_plan(schedule)
    config = StreamConfig(rounds=1, elements=300, chunk=128, window=3, job=12, timeout_ms=50)
    report = run_stream(plan, config, RefusingTransport({island: running.aggregator.address
                                                         for island in plan.islands}))
    assert report["bit_exact"] and report["retransmits"] >= 1
    assert report["send_errors"] == RefusingTransport.refused * len(plan.islands)
    assert f"{report['send_errors']} sends the islands' sockets refused" in format_report(report, running.target)


# --- a registered tree of any depth through one service per city (issue #36) ------------------------------------

CHAIN = {"SIN": "TYO", "TYO": "SEO", "SEO": "FRA", "FRA": "LAX", "LAX": "NYC"}
"""SIN sends to TYO and its contribution climbs five aggregators, TYO -> SEO -> FRA -> LAX -> NYC, two more than a
version 2 frame's hops can name. No island is at FRA: its aggregator only relays."""
CHAIN_CITIES = ["NYC", "LAX", "FRA", "SEO", "TYO"]
"""The cities that sum along CHAIN, the root's first."""
CHAIN_PERIOD = [[{"members": ISLANDS, "aggregator": "NYC", "tree": CHAIN}], [{"members": ISLANDS, "aggregator": "AMS"}]]
"""The chain, then every island flat at AMS: each member's results come from another aggregator each round."""


@pytest.fixture
def city_services(tmp_path):
    """One in-process service per city that sums in CHAIN_PERIOD, taking registered jobs only (`inwire serve`'s
    default), each at its own loopback address on one port; yields {city: Service} and the path of the `udp:FILE`
    map naming them."""
    from test_tree import free_port

    addresses = {city: f"127.0.0.{2 + k}" for k, city in enumerate([*CHAIN_CITIES, "AMS"])}
    port = free_port(*addresses.values())
    services = {}
    try:
        for city, address in addresses.items():
            services[city] = Service(**REGISTERED, listen=(address, port), unregistered=False)
        path = tmp_path / "aggregators.json"
        path.write_text(json.dumps({city: f"{address}:{port}" for city, address in addresses.items()}))
        yield services, str(path)
    finally:
        for running in services.values():
            running.close()


@pytest.mark.parametrize("loss", [0.0, 0.05])
def test_a_registered_tree_of_five_levels_streams_bit_exact(city_services, tmp_path, capsys, loss):
    """`inwire stream --target udp:FILE` registers each city's part of the tree with its service and the islands
    send version 3 frames without a route: every result is exact, each level below the root sends its partials
    up (FRA only relays, and its counters are asked for by the first island, its member) and the root sends none."""
    services, cities = city_services
    schedule = write_schedule(tmp_path / "chain.json", rounds=CHAIN_PERIOD)
    code = stream_cli("--target", f"udp:{cities}", "--schedule", str(schedule), "--rounds", "4", "--elements", "600",
                      "--loss", str(loss), "--timeout-ms", "60" if loss else "2000", "--seed", "2", "--json")
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert code == 0 and report["bit_exact"] and report["registered"], captured.err
    chunks = -(-600 // 256)
    assert report["results_checked"] == 4 * len(ISLANDS) * chunks
    partials = {city: counters["partials_emitted"] for city, counters in report["aggregators"].items()}
    if loss:
        assert report["dropped"] > 0 and report["retransmits"] >= report["dropped"]
        assert all(partials[city] >= 2 * chunks for city in CHAIN_CITIES[1:]) and partials["NYC"] == 0
    else:
        assert report["retransmits"] == 0 and report["results_refused"] == 0
        assert partials == {"NYC": 0, "AMS": 0, **dict.fromkeys(CHAIN_CITIES[1:], 2 * chunks)}
        assert report["aggregators"]["FRA"]["accumulated"] == 2 * chunks  # SEO's partials alone
        assert report["aggregators"]["AMS"]["accumulated"] == 2 * len(ISLANDS) * chunks
    counters = {city: running.aggregator.counters() for city, running in services.items()}
    assert all(counters[city]["drop_version"] == 0 and counters[city]["drop_member"] == 0 for city in counters)


def test_a_tree_no_tables_can_hold_is_refused_before_any_registration(tmp_path, capsys):
    """Clique 0 sums along LAX -> NYC in round 0 and flat at LAX in round 1: LAX's tables would need two routes
    for it. Refused in one line before a socket is opened (no service answers at these addresses)."""
    schedule = write_schedule(tmp_path / "two.json", rounds=[
        [{"members": ISLANDS, "aggregator": "NYC", "tree": {"LAX": "NYC", "SIN": "LAX"}}],
        [{"members": ISLANDS, "aggregator": "LAX"}]])
    cities = tmp_path / "aggregators.json"
    cities.write_text(json.dumps({"NYC": "127.0.0.2:5000", "LAX": "127.0.0.3:5000"}))
    assert stream_cli("--target", f"udp:{cities}", "--schedule", str(schedule)) == 2
    assert capsys.readouterr().err == (
        "inwire stream: schedule round 1, clique 0: LAX's aggregator would hold another route for clique 0 than in "
        "an earlier round; a registered job's tables hold one route per clique index\n")
