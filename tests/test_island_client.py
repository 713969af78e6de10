"""The one member client (`inwire.client`) as the torch averager uses it: any vector length with the default
slots, the schedule's aggregator cities and reduction trees, islands on their own (non-loopback) addresses,
and a differential test of the client's reading of results against the golden model."""

import contextlib
import errno
import random
import socket
import threading
import tracemalloc

import numpy as np
import pytest

from inwire import client
from inwire.client import CliqueKey, Contributions, MemberSum, UdpMember, contributions, slot, slots_needed
from inwire.codec_average import clique_average
from inwire.datagram import PAYLOAD_HEADER_BYTES, PAYLOAD_HEADER_DTYPE, payload_of, wrap
from inwire.model import Aggregator, AggregatorConfig
from inwire.netns import AGGREGATOR_IP, Lab, inside, unavailable_reason
from inwire.serve import SoftwareAggregator, serving_in_thread

torch = pytest.importorskip("torch")

from inwire.train.averaging import CliqueAverager, InwireExchange, OuterOptimizer, anchor_parameters  # noqa: E402


def flat(model):
    return torch.nn.utils.parameters_to_vector(model.parameters()).detach().cpu().numpy().copy()


def models_for(names, size, seed=0):
    generator = torch.Generator().manual_seed(seed)
    models = {}
    for name in names:
        model = torch.nn.Linear(size, 1, bias=False)
        with torch.no_grad():
            model.weight.copy_(torch.randn(model.weight.shape, generator=generator))
        models[name] = model
    return models


def run_islands(models, make_exchange, schedule, steps=1, namespaces=None, **averager):
    """Each island in its own thread (inside its namespace when given) averaging `steps` times."""
    def island(name):
        if namespaces:
            with inside(namespaces[name]):
                exchange = make_exchange(name)
        else:
            exchange = make_exchange(name)
        try:
            run = CliqueAverager(1, island=name, schedule=schedule, exchange=exchange, **averager.get(name, {}))
            for _ in range(steps):
                run.average_parameters(models[name].parameters())
        finally:
            exchange.close()

    each_island(list(models), island)


def each_island(names, body):
    """`body(name)` for every island at once, each in its own thread; fails with their errors."""
    errors = []

    def guarded(name):
        try:
            body(name)
        except Exception as error:  # reported below
            errors.append((name, error))

    threads = [threading.Thread(target=guarded, args=(name,)) for name in names]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors, errors


def test_a_million_parameters_average_with_the_default_slots_and_chunks():
    """1,059,850 parameters (4,141 chunks) through `inwire serve` with its defaults: the window refills as
    results arrive, so the slots needed do not grow with the vector."""
    names = ("A", "B", "C")
    models = models_for(names, 1_059_850, seed=1)
    before = [flat(models[name]) for name in names]
    with serving_in_thread(SoftwareAggregator(("127.0.0.1", 0), unicast=True, log=lambda line: None)) as server:
        run_islands(models, lambda name: InwireExchange(server.address, deadline_s=120), [[(names, "LON")]])
        counters = server.counters()
    average = clique_average(before)
    for name in names:
        assert np.array_equal(flat(models[name]), average), name
    assert counters["drop_slot"] == 0 and counters["drop_collision"] == 0


def test_the_schedule_s_cities_and_tree_are_followed():
    """Round 0: A, B, C sum along a tree (B's city TYO sums A's and its own, then sends up to LAX, the
    root, where C sends); round 1: A and C at TYO, B alone. Every clique sums at its own city's
    service, every average is the codec's."""
    from inwire.plan.schedule_file import ScheduleFile

    tyo = SoftwareAggregator(("127.0.0.2", 0), unicast=True, log=lambda line: None)
    port = tyo.address[1]
    services = {"TYO": tyo, "LAX": SoftwareAggregator(("127.0.0.3", port), unicast=True, log=lambda line: None)}
    aggregators = {city: service.address for city, service in services.items()}
    schedule = ScheduleFile(islands=("A", "B", "C"), topology=None, document={},
                            period=(((("A", "B", "C"), "LAX"),), ((("A", "C"), "TYO"), (("B",), None))),
                            trees=(({"TYO": "LAX", "A": "TYO", "B": "TYO"},), (None, None)))
    names = ("A", "B", "C")
    models = models_for(names, 3000, seed=2)
    before = {name: flat(models[name]) for name in names}
    with serving_in_thread(services["TYO"]), serving_in_thread(services["LAX"]):
        run_islands(models, lambda name: InwireExchange(aggregators), schedule, steps=2)
        counters = {city: service.counters() for city, service in services.items()}
    average = clique_average([before[name] for name in names])
    pair = clique_average([average, average])
    assert np.array_equal(flat(models["A"]), pair) and np.array_equal(flat(models["C"]), pair)
    assert np.array_equal(flat(models["B"]), average)
    chunks = -(-3001 // 256)
    # TYO: A's and B's chunks in round 0 (a partial each up), A's and C's in round 1; LAX: C's and the partials.
    # Each clique's agreement on what it averages (one chunk) goes the same way first.
    # Retransmissions are answered, never summed again: the sums are exact, the answers at least one each.
    moved = {city: {name: value for name, value in named.items() if value} for city, named in counters.items()}
    assert counters["TYO"]["accumulated"] == 4 * (chunks + 1), moved
    assert counters["LAX"]["accumulated"] == 2 * (chunks + 1), moved
    assert counters["TYO"]["partials_emitted"] >= chunks and counters["TYO"]["results_emitted"] >= chunks
    assert counters["LAX"]["results_emitted"] >= chunks and counters["LAX"]["partials_emitted"] == 0


def test_an_all_to_all_clique_sums_at_its_first_member_s_city_or_the_map_s_first():
    """A clique the schedule exchanges all-to-all names no aggregator city; it is summed in the network all
    the same: round 0's (B, A) at B's city, round 1's (A, C) at the map's first city, C (A has no service)."""
    from inwire.plan.schedule_file import ScheduleFile

    first = SoftwareAggregator(("127.0.0.2", 0), unicast=True, log=lambda line: None)
    services = {"C": first, "B": SoftwareAggregator(("127.0.0.3", first.address[1]), unicast=True,
                                                    log=lambda line: None)}
    aggregators = {city: service.address for city, service in services.items()}
    schedule = ScheduleFile(islands=("A", "B", "C"), topology=None, document={},
                            period=(((("B", "A"), None), (("C",), None)), ((("A", "C"), None), (("B",), None))),
                            trees=())
    names = ("A", "B", "C")
    models = models_for(names, 1000, seed=6)
    before = {name: flat(models[name]) for name in names}
    with serving_in_thread(services["C"]), serving_in_thread(services["B"]):
        run_islands(models, lambda name: InwireExchange(aggregators), schedule, steps=2)
        counters = {city: service.counters() for city, service in services.items()}
    pair = clique_average([before["B"], before["A"]])
    assert np.array_equal(flat(models["B"]), pair)
    assert np.array_equal(flat(models["A"]), clique_average([pair, before["C"]]))
    assert np.array_equal(flat(models["C"]), flat(models["A"]))
    chunks = -(-1001 // 256) + 1  # and the clique's agreement on what it averages
    assert counters["B"]["accumulated"] == 2 * chunks and counters["C"]["accumulated"] == 2 * chunks, counters


def test_the_outer_optimizer_is_any_torch_optimizer_and_resumes_bit_for_bit():
    """torchft's DiLoCo shape: SGD with Nesterov momentum on the anchor parameters. Three steps of a rotation
    of pairs (A-B, B-C, A-C: each island averages in two of them) in one go equal two, a state_dict round
    trip through new objects, and one more: the resumed islands continue the rotation where it stopped."""
    names = ("A", "B", "C")
    schedule = [[(("A", "B"), "LON"), (("C",), None)], [(("B", "C"), "LON"), (("A",), None)],
                [(("A", "C"), "LON"), (("B",), None)]]

    def averagers_for(models):
        outers = {name: torch.optim.SGD(anchor_parameters(models[name]), lr=0.7, momentum=0.9, nesterov=True)
                  for name in names}
        return {name: {"outer_optimizer": outers[name]} for name in names}

    with serving_in_thread(SoftwareAggregator(("127.0.0.1", 0), unicast=True, log=lambda line: None)) as server:
        straight = models_for(names, 700, seed=3)
        run_islands(straight, lambda name: InwireExchange(server.address, job=1), schedule, steps=3,
                    **averagers_for(straight))

        resumed = models_for(names, 700, seed=3)
        states, first, then = {}, averagers_for(resumed), averagers_for(resumed)

        def part(name, options, steps, state=None):
            exchange = InwireExchange(server.address, job=2)
            try:
                run = CliqueAverager(1, island=name, schedule=schedule, exchange=exchange, **options[name])
                if state is not None:
                    run.load_state_dict(state)
                for _ in range(steps):
                    run.average_parameters(resumed[name].parameters())
                states[name] = run.state_dict()
            finally:
                exchange.close()

        each_island(names, lambda name: part(name, first, 2))
        each_island(names, lambda name: part(name, then, 1, states[name]))
    for name in names:
        assert np.array_equal(flat(straight[name]), flat(resumed[name])), name


@pytest.mark.parametrize("outer, limit", [(None, 2.5), (OuterOptimizer(0.7, 0.9), 3.5)], ids=["plain", "outer"])
def test_an_averaging_grows_memory_by_a_bounded_number_of_models_per_island(outer, limit):
    """Two islands average a model of 2**20 float32 parameters twice, in this process, with numpy's arrays
    traced (numpy reports them to tracemalloc; torch's tensors, the models among them, it does not): the
    traced memory never grows past `limit` x the model's bytes per island. Plain averaging needs its wire
    buffer (the parameters quantized into it, the sums and the average in its place) and the anchor the
    averager keeps; an outer step (numpy's) its momentum buffer too. A staged copy of the parameters, the
    vectors kept for logs, copied anchors and the outer step's temporaries took 5 (plain) and 9 x."""
    names, size = ("A", "B"), 1 << 20
    models = models_for(names, size, seed=6)
    if outer is None:
        expected = clique_average([clique_average([flat(models[name]) for name in names])] * len(names))
    with serving_in_thread(SoftwareAggregator(("127.0.0.1", 0), unicast=True, log=lambda line: None)) as server:
        exchanges = {name: InwireExchange(server.address, deadline_s=60) for name in names}
        averagers = {name: CliqueAverager(1, island=name, schedule=[[(names, "LON")]], exchange=exchanges[name],
                                          outer=outer) for name in names}
        tracemalloc.start()
        try:
            start = tracemalloc.get_traced_memory()[0]
            each_island(names, lambda name: [averagers[name].average_parameters(models[name].parameters())
                                             for _ in range(2)])
            growth = tracemalloc.get_traced_memory()[1] - start
        finally:
            tracemalloc.stop()
            for exchange in exchanges.values():
                exchange.close()
    per_island = growth / len(names) / (4 * size)
    assert per_island <= limit, f"{per_island:.2f} x the model's bytes per island"
    if outer is None:
        for name in names:
            assert np.array_equal(flat(models[name]), expected), name


DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", DEVICES)
def test_parameters_of_another_dtype_and_device_are_converted_and_loaded_back(device):
    """Parameters of another dtype (float64), on `device`, are converted to float32 one at a time as they are
    quantized, and the average is loaded back in their own dtype and device. No GPU here: only "cpu" runs; on
    a machine with CUDA the same test runs on "cuda"."""
    names = ("A", "B")
    models = {name: model.to(device, torch.float64) for name, model in models_for(names, 500, seed=4).items()}
    before = [flat(models[name]).astype(np.float32) for name in names]
    with serving_in_thread(SoftwareAggregator(("127.0.0.1", 0), unicast=True, log=lambda line: None)) as server:
        run_islands(models, lambda name: InwireExchange(server.address), [[(names, "LON")]])
    average = clique_average(before)
    for name in names:
        assert models[name].weight.dtype == torch.float64 and models[name].weight.device.type == device
        assert np.array_equal(flat(models[name]).astype(np.float32), average)


REASON = unavailable_reason()


@pytest.mark.skipif(REASON is not None, reason=f"network namespaces unavailable: {REASON}")
@pytest.mark.parametrize("unicast", [True, False], ids=["unicast", "multicast"])
def test_islands_in_their_own_namespaces_reach_an_aggregator_in_another(unicast):
    """Each island's socket binds the address that routes to the aggregator (10.77.0.1x, not loopback)."""
    names = ("A", "B", "C")
    models = models_for(names, 2000, seed=5)
    before = [flat(models[name]) for name in names]
    with Lab(names) as lab:
        target = lab.start_aggregator(slots=256, unicast=unicast)
        bound = {}

        def make(name):
            exchange = InwireExchange(target, multicast=not unicast, deadline_s=20)
            bound[name] = exchange.client.address[0]
            return exchange
        run_islands(models, make, [[(names, "NYC")]], namespaces=lab.namespaces)
        final = lab.stop_aggregator()
    assert bound == lab.addresses and AGGREGATOR_IP not in bound.values()
    average = clique_average(before)
    assert all(np.array_equal(flat(models[name]), average) for name in names)
    assert ("unicast_copies" in final) == unicast


def test_the_client_reads_what_the_model_answers():
    """Random cliques, chunk sizes, windows and vector lengths: every member's `MemberSum`, fed by the
    golden model (with duplicated, reordered and lost answers), ends with the model's sums, and sends only
    what its window allows."""
    rnd = random.Random(8)
    config = AggregatorConfig(slots=slots_needed(3, 5), max_elements=64)
    address = ("10.73.87.1", config.port)
    for trial in range(25):
        fanin, chunk, window = rnd.randint(2, 5), rnd.choice((1, 7, 64)), rnd.randint(1, 5)
        elements = rnd.randint(1, 400)
        clique = rnd.randrange(3)
        key = CliqueKey(job=trial, round=rnd.randrange(1000), clique=clique, group=0xEF000001, fanin=fanin,
                        exponent=-rnd.randrange(4), max_cliques=3)
        rng = np.random.default_rng(trial)
        vectors = rng.integers(-2**20, 2**20, (fanin, elements)).astype(np.int32)
        model = Aggregator(config)
        runs = [MemberSum(contributions(vectors[m], m, key, chunk, window), key, elements, chunk, window)
                for m in range(fanin)]
        queue = [(m, p) for m, run in enumerate(runs) for p in run.start(0.0)]
        now = 0.0
        while not all(run.done for run in runs):
            if not queue:
                now += 1.0
                queue = [(m, p) for m, run in enumerate(runs) for p in run.due(now)]
                continue
            member, payload = queue.pop(rnd.randrange(len(queue)))
            assert len(runs[member].deadline) <= window
            for frame in model.process(wrap(payload, ("10.0.0.9", 4000 + member), address, bytes(6))):
                answer = payload_of(frame)
                for receiver in range(fanin):
                    if rnd.random() < 0.1:
                        continue  # lost on the way to this member
                    copies = 2 if rnd.random() < 0.1 else 1
                    for _ in range(copies):
                        queue += [(receiver, p) for p in runs[receiver].on_result(answer, now)]
        expected = vectors.astype(np.int64).sum(axis=0)
        for run in runs:
            assert np.array_equal(run.sums().astype(np.int64), expected)
            assert not run.wrong_chunks and not run.overflow and run.failed_chunk is None
        used = {slot(key.round, clique, j, window, 3) for j in range(-(-elements // chunk))}
        assert max(used) < config.slots


def test_consecutive_rounds_use_disjoint_slots():
    """The slots a round's payloads name, every clique's every chunk, never meet the next round's: the last
    round's results stay in place for late retransmissions while the next round sums. Across the 32-bit
    wrap too (round 2**32 - 1, then 0). All of them fit the slots the schedule asks for."""
    chunk = 2

    def slots_of(round_, window, max_cliques):
        used = set()
        for clique in range(max_cliques):
            key = CliqueKey(job=1, round=round_, clique=clique, group=0xEF000001, fanin=2, exponent=0,
                            max_cliques=max_cliques)
            # Five windows of chunks: both of a round's window pools, each reused.
            vector = np.zeros(5 * window * chunk, dtype=np.int32)
            used |= {int(np.frombuffer(payload[:PAYLOAD_HEADER_BYTES], dtype=PAYLOAD_HEADER_DTYPE)["slot"][0])
                     for payload in contributions(vector, 0, key, chunk, window)}
        return used

    for window in (1, 2, 5):
        for max_cliques in (1, 3):
            for round_ in (0, 1, 6, 2**32 - 2, 2**32 - 1):
                this, following = slots_of(round_, window, max_cliques), slots_of((round_ + 1) % 2**32, window,
                                                                                 max_cliques)
                assert len(this) == 2 * window * max_cliques, (round_, window, max_cliques, sorted(this))
                assert not this & following, (round_, window, max_cliques, sorted(this & following))
                assert max(this | following) < slots_needed(max_cliques, window)


def test_adaptive_retransmission_measures_backs_off_and_resends_a_gap_at_once():
    """Round trips of 10 ms make the timeout ~10-30 ms instead of `timeout_s`; a chunk whose three successors'
    results came back is sent again at once (one time only); a chunk that keeps timing out waits twice as
    long each time; a fixed-timeout sum (min_timeout_s None) does none of it."""
    key = CliqueKey(job=1, round=2, clique=0, group=0xEF000001, fanin=1, exponent=0)
    config = AggregatorConfig(slots=slots_needed(1, 8), max_elements=4)
    address = ("10.73.87.1", config.port)

    def answer(model, payload):
        return [payload_of(frame) for frame in model.process(wrap(payload, ("10.0.0.9", 4000), address, bytes(6)))]

    vector = np.arange(40, dtype=np.int32)
    adaptive = MemberSum(contributions(vector, 0, key, 4, 8), key, 40, 4, 8, timeout_s=1.0, retries=None,
                         min_timeout_s=0.002)
    model = Aggregator(config)
    first = adaptive.start(0.0)
    assert len(first) == 8
    # Chunk 0 is lost; 1, 2 and 3 come back 10 ms later.
    for payload in first[1:4]:
        (result,) = answer(model, payload)
        resent = adaptive.on_result(result, 0.010)
    assert resent[0] == first[0] and adaptive.retransmits == 1
    assert 0.002 <= adaptive.rto < 0.05
    # Chunk 4 is lost every time; everything else comes back. Once its three successors are in it is sent
    # again at once, then its waits double from the measured timeout, up to timeout_s.
    queue, now = [first[0], *first[5:]], 0.020
    while queue:
        for result in answer(model, queue.pop(0)):
            queue += [p for p in adaptive.on_result(result, now) if p != first[4]]
    assert list(adaptive.deadline) == [4] and adaptive.retransmits == 2 and adaptive.remaining == 1
    times = []
    for _ in range(8):
        now = adaptive.deadline[4]
        assert adaptive.due(now) == [first[4]]
        times.append(adaptive.deadline[4] - now)
    assert all(later == pytest.approx(min(2 * earlier, 1.0)) for earlier, later in zip(times, times[1:]))
    assert times[0] < 0.1 and times[-1] == pytest.approx(1.0)
    fixed = MemberSum(contributions(vector, 0, key, 4, 8), key, 40, 4, 8, timeout_s=1.0)
    sent = fixed.start(0.0)
    fixed_model = Aggregator(config)
    for payload in sent[1:4]:
        (result,) = answer(fixed_model, payload)
        assert all(freed not in sent for freed in fixed.on_result(result, 0.010))
    assert fixed.retransmits == 0 and fixed.deadline[0] == 1.0


def whole_window_sum():
    """A one-member sum of 8 chunks, all sent at 0 under a first timeout of 1 s with adaptive timeouts from
    2 ms; the sent payloads; the golden model's answers to a payload."""
    key = CliqueKey(job=1, round=2, clique=0, group=0xEF000001, fanin=1, exponent=0)
    config = AggregatorConfig(slots=slots_needed(1, 8), max_elements=4)
    address, model = ("10.73.87.1", config.port), Aggregator(config)
    run = MemberSum(contributions(np.arange(32, dtype=np.int32), 0, key, 4, 8), key, 32, 4, 8, timeout_s=1.0,
                    retries=None, min_timeout_s=0.002)

    def answer(payload):
        return [payload_of(frame) for frame in model.process(wrap(payload, ("10.0.0.9", 4000), address, bytes(6)))]

    return run, run.start(0.0), answer


def test_a_lost_last_chunk_waits_one_measured_timeout_not_the_first():
    """The whole vector goes out at once under a long first timeout (1 s, nothing measured yet); the last
    chunk is lost. No later result can reveal the gap, so only its timeout can: the one measured from the
    other chunks' 10 ms round trips, counted from the last result, not the 1 s it was sent under."""
    run, sent, answer = whole_window_sum()
    for payload in sent[:-1]:
        for result in answer(payload):
            assert not run.on_result(result, 0.010)
    assert run.rto < 0.05 and list(run.deadline) == [7]
    due_at = 0.010 + run.rto
    assert run.next_deadline() == pytest.approx(due_at)
    assert run.due(due_at - 0.001) == [] and run.due(due_at) == [sent[7]] and run.retransmits == 1
    # Sent again, it waits its backed-off timeout from now (Karn: no round trip is taken from it).
    assert run.next_deadline() == pytest.approx(due_at + 2 * run.rto)


def test_every_gap_in_a_window_is_sent_again_at_once_not_only_the_oldest():
    """Chunks 1 and 3 of a whole window are lost. Each is sent again as soon as the result of a chunk
    FAST_RETRANSMIT after it is in (1 at 4's result, 3 at 6's), once, long before the first timeout (1 s),
    which a window with several losses used to wait out for all but its oldest gap."""
    run, sent, answer = whole_window_sum()
    resent = {}
    for k in (0, 2, 4, 5, 6, 7):
        for result in answer(sent[k]):
            resent[k] = list(run.on_result(result, 0.010 + 0.001 * k))
    assert resent[4] == [sent[1]] and resent[6] == [sent[3]]
    assert not any(resent[k] for k in (0, 2, 5, 7)) and run.retransmits == 2
    assert sorted(run.deadline) == [1, 3] and max(run.deadline.values()) < 0.1
    for k in (1, 3):
        for result in answer(sent[k]):
            run.on_result(result, 0.030)
    assert run.done and np.array_equal(run.sums(), np.arange(32, dtype=np.int32))


def test_chunks_queued_behind_others_are_not_timed_while_results_flow():
    """A window of 8 whose results come back one every 30 ms (each chunk waits behind the ones before it):
    the timeout measured from the first (10 ms) is far shorter than the later chunks' waits, yet none is
    sent again, because each result restarts the timer; when results stop, one chunk goes out per timeout."""
    run, sent, answer = whole_window_sum()
    now = 0.0
    for k, payload in enumerate(sent[:5]):
        now = 0.010 + 0.030 * k
        assert run.due(now - 1e-6) == []
        for result in answer(payload):
            run.on_result(result, now)
    assert run.retransmits == 0 and list(run.deadline) == [5, 6, 7]
    stalled = run.progress_at + run.rto
    assert run.due(stalled) == [sent[5]] and run.due(stalled) == []
    assert run.due(stalled + run.rto) == [sent[6]] and run.retransmits == 2


def test_a_lost_tail_chunk_is_probed_after_two_round_trips_not_after_a_timeout():
    """Results come back one every 10 ms (the window drains through a queue), so the round trips grow from
    10 to 70 ms and the timeout (srtt + 4 rttvar) to about 150 ms; the last chunk is lost, and no later
    result can reveal it. The newest chunk in flight goes out again two smoothed round trips after the last
    result (the tail-loss probe), well before the timeout; one probe per stall only, then the probe's own
    timeout."""
    run, sent, answer = whole_window_sum()
    for k, payload in enumerate(sent[:-1]):
        for result in answer(payload):
            assert not run.on_result(result, 0.010 * (k + 1))
    assert list(run.deadline) == [7] and run.rto > 2 * client.PROBE_SRTTS * run.srtt
    probe_at = 0.070 + client.PROBE_SRTTS * run.srtt
    assert run.next_deadline() == pytest.approx(probe_at) and probe_at < 0.070 + run.rto
    assert run.due(probe_at - 0.001) == [] and run.due(probe_at) == [sent[7]] and run.retransmits == 1
    assert run.next_deadline() == pytest.approx(probe_at + run.rto)
    assert run.due(probe_at + run.rto - 0.001) == [] and run.retransmits == 1
    (result,) = answer(sent[7])
    run.on_result(result, probe_at + 0.010)
    assert run.done and np.array_equal(run.sums(), np.arange(32, dtype=np.int32))


@pytest.mark.parametrize("kind", ["python", "compiled"])
def test_a_lost_fast_retransmission_is_sent_again_two_round_trips_later_not_after_the_timeout_floor(kind):
    """Round trips of 1 ms under `UdpMember`'s timeout floor (MIN_TIMEOUT_S, 20 ms): chunk 1 is lost, sent
    again at its third successor's result, and lost again (or its result on the way back). Its window is
    blocked behind it, so no later result can reveal the second loss: it goes out once more PROBE_SRTTS
    smoothed round trips after the fast retransmission, then at waits doubling from there, not a whole
    floored timeout later."""
    if kind == "compiled" and client.compiled is None:
        pytest.skip("the compiled kernel (inwire._kernel) is not built")
    make = MemberSum if kind == "python" else client.CompiledMemberSum
    key = CliqueKey(job=1, round=2, clique=0, group=0xEF000001, fanin=1, exponent=0)
    config = AggregatorConfig(slots=slots_needed(1, 8), max_elements=4)
    address, model = ("10.73.87.1", config.port), Aggregator(config)
    vector = np.arange(32, dtype=np.int32)
    run = make(Contributions(vector, 0, key, 4, 8), key, 32, 4, 8, timeout_s=1.0, retries=None,
               min_timeout_s=client.MIN_TIMEOUT_S)

    def answer(payload):
        return [payload_of(frame) for frame in model.process(wrap(payload, ("10.0.0.9", 4000), address, bytes(6)))]

    sent = run.start(0.0)
    resent = {}
    for k in (0, 2, 3, 4, 5, 6, 7):
        for result in answer(sent[k]):
            resent[k] = list(run.on_result(result, 0.001 + 0.0001 * k))
        if k == 4:  # the fast retransmission, with the round trips measured so far
            fast_at, wait = 0.001 + 0.0001 * k, client.PROBE_SRTTS * max(run.srtt, run.interval)
    assert resent[4] == [sent[1]] and not any(resent[k] for k in (0, 2, 3, 5, 6, 7))
    assert run.retransmits == 1 and list(run.deadline) == [1]
    assert run.rto == client.MIN_TIMEOUT_S and wait < run.rto / 4
    at = fast_at
    for _ in range(3):
        assert run.next_deadline() == pytest.approx(at + wait)
        assert run.due(at + wait - 1e-6) == []
        at += wait
        assert run.due(at) == [sent[1]]
        wait *= 2
    assert run.retransmits == 4 and at < fast_at + run.rto  # three re-sends before the floor's first
    for result in answer(sent[1]):
        run.on_result(result, at + 0.001)
    assert run.done and np.array_equal(run.sums(), vector)


def failures_of_members_without(absent, names=None, deadline_s=2.0):
    """Every member of a clique of three but `absent` sums through `inwire serve` (names given or not) and
    fails; their errors, by member index."""
    key = CliqueKey(job=4, round=9, clique=0, group=0xEF000001, fanin=3, exponent=0)
    failures = {}
    with serving_in_thread(SoftwareAggregator(("127.0.0.1", 0), unicast=True, log=lambda line: None)) as server:
        def member(index):
            island = UdpMember(server.address, deadline_s=deadline_s)
            try:
                island.sum(key, index, np.arange(3000, dtype=np.int32), members=names)
            except client.ClientError as error:
                failures[index] = error
            finally:
                island.close()

        each_island([index for index in range(3) if index != absent], member)
    return failures


def test_a_missing_member_is_named_by_every_other_member():
    """Three islands, one of which never sends: each of the others fails at its deadline with an error that
    names the missing one (by island name when the caller gave names, else by index), found by the roll call
    at the aggregator; the members that answered it are not named."""
    named = failures_of_members_without(1, names=["LON", "NYC", "TYO"])
    assert sorted(named) == [0, 2]
    for error in named.values():
        assert error.missing == ("NYC",) and "no contribution of NYC arrived" in str(error), error
    indexed = failures_of_members_without(0)
    assert sorted(indexed) == [1, 2]
    for error in indexed.values():
        assert error.missing == (0,) and "no contribution of member 0 arrived" in str(error), error


@pytest.fixture(params=["batched", "each"])
def socket_path(request, monkeypatch):
    """`UdpMember` with recvmmsg/sendmmsg through the compiled kernel, and datagram by datagram without it."""
    if request.param == "batched":
        if client.compiled is None:
            pytest.skip("the compiled kernel inwire._kernel is not built")
    else:
        monkeypatch.setattr(client, "compiled", None)
    return request.param


def test_udp_members_recover_lost_datagrams_on_either_socket_path(socket_path):
    """A fifth of every member's datagrams dropped on purpose: the sums are exact all the same, found by
    retransmission, and the payloads made on demand are those `contributions` lists."""
    fanin, elements, chunk, window = 3, 5000, 64, 4
    key = CliqueKey(job=3, round=5, clique=0, group=0xEF000001, fanin=fanin, exponent=0)
    vectors = np.random.default_rng(4).integers(-2**20, 2**20, (fanin, elements)).astype(np.int32)
    assert list(Contributions(vectors[1], 1, key, chunk, window)) == contributions(vectors[1], 1, key, chunk, window)
    sums, retransmits = {}, {}
    with serving_in_thread(SoftwareAggregator(("127.0.0.1", 0), unicast=True, max_elements=chunk,
                                              log=lambda line: None)) as server:
        def member(index):
            island = UdpMember(server.address, chunk=chunk, window=window, deadline_s=60, loss=0.2, seed=index)
            try:
                sums[index] = island.sum(key, index, vectors[index])
                retransmits[index] = island.retransmits
            finally:
                island.close()

        each_island(range(fanin), member)
    for index in range(fanin):
        total, overflow = sums[index]
        assert total.dtype == np.int32 and np.array_equal(total, vectors.sum(axis=0)) and not overflow
        assert retransmits[index] > 0


def test_the_loss_injection_draws_once_per_dropped_datagram_not_once_per_datagram(socket_path):
    """A member dropping 1 % of its datagrams on purpose sends 3000, one to three a call, to a socket that
    reads them as they come: it drew its random numbers once per datagram it dropped (the gap to the next
    drop), not once per datagram, which cost a lossy run CPU its lossless reference does not spend; the
    datagrams that arrive are the others, in order."""
    class Counted:
        def __init__(self, rng):
            self.rng, self.draws = rng, 0

        def __getattr__(self, name):
            draw = getattr(self.rng, name)

            def counted(*args, **kwargs):
                self.draws += 1
                return draw(*args, **kwargs)
            return counted

    receiver = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    receiver.bind(("127.0.0.1", 0))
    receiver.setblocking(False)
    island = UdpMember(receiver.getsockname(), loss=0.01, seed=5)
    try:
        island.loss_rng = Counted(island.loss_rng)
        send = island._sender(receiver.getsockname())
        payloads = [index.to_bytes(4, "big") for index in range(3000)]
        arrived, start = [], 0
        while start < len(payloads):
            calls = payloads[start:start + 1 + start % 3]
            start += len(calls)
            send(calls)
            with contextlib.suppress(BlockingIOError):
                while True:
                    arrived.append(receiver.recv(16))
    finally:
        island.close()
        receiver.close()
    dropped = len(payloads) - len(arrived)
    assert arrived == sorted(arrived) and set(arrived) <= set(payloads)
    assert 10 <= dropped <= 60 and island.loss_rng.draws == dropped


def test_a_datagram_the_kernel_refuses_raises_its_error_on_either_socket_path(socket_path):
    """A broadcast address without SO_BROADCAST: the kernel's EACCES, as an OSError, at the first send."""
    key = CliqueKey(job=1, round=0, clique=0, group=0xEF000001, fanin=2, exponent=0)
    island = UdpMember(("255.255.255.255", 9), bind=("127.0.0.1", 0), deadline_s=5)
    try:
        with pytest.raises(OSError) as raised:
            island.sum(key, 0, np.zeros(1000, dtype=np.int32))
        assert raised.value.errno == errno.EACCES
    finally:
        island.close()


def test_contributions_keeps_the_sequence_methods():
    """`Contributions` is a `Sequence` of payloads: its chunk total has a name of its own, so `count` and
    `index` stay the sequence's methods."""
    key = CliqueKey(job=3, round=5, clique=0, group=0xEF000001, fanin=2, exponent=0)
    payloads = Contributions(np.arange(150, dtype=np.int32), 1, key, 64, 4)
    assert payloads.chunks == len(payloads) == 3
    assert payloads.count(payloads[2]) == 1 and payloads.index(payloads[1]) == 1


def test_two_registered_trainings_on_one_aggregator_both_get_their_own_averages():
    """The issue's two trainings on one `inwire serve`, each of two islands with the same schedule (so the
    same rounds, cliques and slot numbers): each training a registered job of its own, joined by its
    islands, both averages are their own clique's, at once."""
    from inwire.client import job_slots
    from inwire.control import JobLease, new_job

    trainings = {"X": ("A", "B"), "Y": ("C", "D")}
    models = models_for([name for names in trainings.values() for name in names], 3000, seed=6)
    before = {name: flat(model) for name, model in models.items()}
    exchanges = {}
    with serving_in_thread(SoftwareAggregator(("127.0.0.1", 0), unicast=True, engine="golden", registered=True,
                                              log=lambda line: None)) as server:
        leases = []
        for names in trainings.values():
            made = {name: InwireExchange(server.address, deadline_s=20) for name in names}
            entry = new_job([exchange.address for exchange in made.values()], job_slots(1, client.DEFAULT_WINDOW, 2))
            for exchange in made.values():
                exchange.join(entry)
            exchanges.update(made)
            leases.append(JobLease(server.address, entry))
        with leases[0], leases[1]:
            each_island(list(trainings), lambda training: run_islands(
                {name: models[name] for name in trainings[training]}, exchanges.__getitem__,
                [[(trainings[training], "LON")]]))
    for names in trainings.values():
        average = clique_average([before[name] for name in names])
        for name in names:
            assert np.array_equal(flat(models[name]), average), name


class Arrivals(SoftwareAggregator):
    """A golden-model service that notes (clique, round) of every contribution as it arrives, by source port."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, engine="golden", **kwargs)
        self.arrivals = {}

    def handle(self, payload, peer, now=None):
        header = np.frombuffer(payload[:PAYLOAD_HEADER_BYTES], dtype=PAYLOAD_HEADER_DTYPE)[0]
        if header["opcode"] == client.Opcode.CONTRIBUTION and header["chunk"] != client.PRESENCE_CHUNK:
            self.arrivals.setdefault(peer[1], []).append((int(header["clique"]), int(header["round"])))
        return super().handle(payload, peer, now)


@pytest.mark.parametrize("retries", [False, True])
def test_averagings_handed_over_together_are_in_flight_together(retries):
    """Three averagings of one clique at once (the DDP hook's buckets of a step): each is the codec's average, and
    each member's first window of every one of them goes out before any of its results can come back, where
    one after another would send the first averaging whole first. With `retries` a member's values need
    re-sends at raised bounds (a bound of 1 for values near 100), each averaging's on its own while the others
    go on: none waits for another's."""
    rng = np.random.default_rng(5)
    scale, bound = (100.0, 1.0) if retries else (1.0, 16.0)
    vectors = {name: [rng.standard_normal(chunks * 64).astype(np.float32) * scale for chunks in (9, 6, 7)]
               for name in "AB"}
    got, errors = {}, []
    with serving_in_thread(Arrivals(("127.0.0.1", 0), unicast=True, log=lambda line: None)) as server:
        exchanges = {name: InwireExchange(server.address, chunk=64, bound=bound, deadline_s=20) for name in "AB"}

        def island(name):
            try:
                got[name] = exchanges[name].average_many(
                    [(0, clique, vector) for clique, vector in enumerate(vectors[name])], ["A", "B"], "AB".index(name),
                    max_cliques=3)
            except Exception as error:  # reported below
                errors.append(error)
            finally:
                exchanges[name].close()

        ports = {name: exchanges[name].address[1] for name in "AB"}
        threads = [threading.Thread(target=island, args=(name,)) for name in "AB"]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
    assert not errors, errors
    for clique in range(3):
        expected = clique_average([vectors[name][clique] for name in "AB"], bound)
        for name in "AB":
            assert np.array_equal(got[name][clique], expected), (name, clique)
    for name in "AB":
        first = [clique for clique, _ in server.arrivals[ports[name]][:3 * client.DEFAULT_WINDOW]]
        assert sorted(set(first)) == [0, 1, 2], (name, first)
        resent = {clique for clique, round_ in server.arrivals[ports[name]] if round_ > 0}
        assert resent == ({0, 1, 2} if retries else set()), (name, resent)
