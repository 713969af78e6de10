"""Registered reduction trees of any depth (issue #37): a clique's schedule tree becomes the route each
aggregator's tables hold (`jobs.tree_routes`), and islands sum along it through real `inwire serve` services."""

import threading
from contextlib import contextmanager
from dataclasses import replace

import pytest

import services
from inwire.jobs import CliqueRoute, JobEntry, TreeError, tree_routes
from inwire.model import Aggregator
from inwire.protocol import Opcode
from test_jobs_model import CONFIG, TREE_JOB, Network, chain, contribution_to, destination, field, source_of, values

R, X, Y = (0x0A_00_10_01, 18775), (0x0A_00_10_02, 18775), (0x0A_00_10_03, 18775)
AGGREGATORS = {"R": R, "X": X, "Y": Y}
MEMBERS = [(0x0A_00_20_00 + k, 7000 + k) for k in range(12)]


def test_a_clique_without_a_tree_is_one_level_at_its_root():
    members = {MEMBERS[k]: ("R", k) for k in range(3)}
    assert tree_routes("R", None, members, AGGREGATORS) == {"R": CliqueRoute(level=0b111)}


def test_a_fork_of_two_levels_gathers_each_child_s_members_below_the_root():
    """The schedule's fork A, B - X - R (docs/schedule.md): A and B send to X, which sums them and sends its
    partial to R, where R's island sends; a second child Y under R holds one member. A and B sum nowhere, so
    they need no aggregator."""
    tree = {"X": "R", "A": "X", "B": "X", "Y": "R"}
    members = {MEMBERS[0]: ("X", 0), MEMBERS[1]: ("X", 1), MEMBERS[2]: ("R", 2), MEMBERS[3]: ("Y", 3)}
    assert tree_routes("R", tree, members, AGGREGATORS) == {
        "R": CliqueRoute(level=0b1111, children={X: 0b0011, Y: 0b1000}),
        "X": CliqueRoute(level=0b0011, parent=R),
        "Y": CliqueRoute(level=0b1000, parent=R),
    }


def chain_of(depth):
    """Cities C0 (the root) to C{depth - 1} in a chain, members 2i and 2i + 1 sending to Ci: (tree, members,
    aggregators); the aggregators are those of `test_jobs_model.chain`."""
    tree = {f"C{level}": f"C{level - 1}" for level in range(1, depth)}
    members = {(0x0A_00_20_00 + 16 * level + k, 7000 + k): (f"C{level}", 2 * level + k)
               for level in range(depth) for k in (0, 1)}
    aggregators = {f"C{level}": (0x0A_00_10_01 + level, CONFIG.port) for level in range(depth)}
    return tree, members, aggregators


def test_a_chain_of_5_levels_gives_each_aggregator_its_level_parent_and_child():
    depth = 5
    tree, members, aggregators = chain_of(depth)
    routes = tree_routes("C0", tree, members, aggregators)
    below = [sum(1 << m for m in range(2 * level, 2 * depth)) for level in range(depth + 1)]
    assert routes == {
        f"C{level}": CliqueRoute(level=below[level], parent=aggregators[f"C{level - 1}"] if level else None,
                                 children={aggregators[f"C{level + 1}"]: below[level + 1]} if level < depth - 1
                                 else {})
        for level in range(depth)}


def test_the_golden_model_sums_a_chain_of_6_levels_from_these_tables_over_each_link_once():
    """Deeper than a version 2 frame can name (3 levels): every member gets the exact sum from its own
    aggregator, and each link carries one frame each way."""
    depth = 6
    tree, members, aggregators = chain_of(depth)
    routes = tree_routes("C0", tree, members, aggregators)
    models = {}
    for city, (ip, port) in aggregators.items():
        models[city] = Aggregator(replace(CONFIG, ip=ip, port=port, mac=0x02_00_00_10_00_00 | ip & 0xFF))
        models[city].install(JobEntry(members={m for m, (at, _) in members.items() if at == city},
                                      routes={0: routes[city]}, **TREE_JOB))
    network = Network(models.values())
    fanin = len(members)
    for member, (city, index) in sorted(members.items(), key=lambda item: -item[1][1]):  # the deepest first
        network.send(contribution_to(models[city].config, member, index, fanin))
    network.run()
    exact = [sum(m + 1 for m in range(fanin)), sum(-10 * m for m in range(fanin)), 7 * fanin]
    for member, (city, _) in members.items():
        (result,) = network.inbox[member]
        assert (source_of(result), values(result), field(result, "bitmap")) == (aggregators[city], exact,
                                                                                 2**fanin - 1)
    assert all(count == 1 for count in network.links.values())
    assert len(network.links) == 2 * (fanin + depth - 1)


class LosingNetwork(Network):
    """`Network` that loses the first frame of `opcode` on the link `lost` (source, destination)."""

    def __init__(self, aggregators, lost, opcode):
        super().__init__(aggregators)
        self.lost, self.opcode = lost, opcode

    def run(self):
        while self.in_flight:
            data = self.in_flight.pop(0)
            link = (source_of(data), destination(data))
            if link == self.lost and field(data, "opcode") == self.opcode:
                self.lost = None
                continue
            self.links[link] += 1
            if link[1] in self.aggregators:
                self.in_flight += self.aggregators[link[1]].process(data)
            else:
                self.inbox[link[1]].append(data)


@pytest.mark.parametrize(("lost", "opcode"), [((2, 1), Opcode.PARTIAL), ((0, 1), Opcode.RESULT)])
def test_a_frame_lost_between_two_aggregators_of_a_chain_is_recovered_at_that_link(lost, opcode):
    """A chain of 4 aggregators (the golden model, registered tables), two members at each. The partial from
    level 2 to level 1, or the root's result to level 1, is lost; then every member still without a result
    sends its contribution again, once. Every member ends with exactly one result, exact. The levels below
    the lost partial answer with the partials they hold and sum nothing again; a lost result is sent again
    by the root, from the result it holds, to the child that asked and to no one else; each aggregator below
    relays the result down once. No member sends more than its one retransmission."""
    aggregators, endpoints, members = chain()
    depth, fanin = len(aggregators), 2 * len(aggregators)
    network = LosingNetwork(aggregators, (endpoints[lost[0]], endpoints[lost[1]]), opcode)

    def contribute(level, k):
        network.send(contribution_to(aggregators[level].config, members[level][k], 2 * level + k, fanin))

    for level in reversed(range(depth)):
        for k in (0, 1):
            contribute(level, k)
    network.run()
    assert network.lost is None, "the frame was lost"
    served = [member for level in range(depth) for member in members[level] if network.inbox.get(member)]
    assert served == ([] if opcode == Opcode.PARTIAL else members[0])
    before = [aggregator.stats() for aggregator in aggregators]
    network.links.clear()
    for level in reversed(range(depth)):
        for k in (0, 1):
            if members[level][k] not in served:
                contribute(level, k)
    network.run()
    exact = [sum(m + 1 for m in range(fanin)), sum(-10 * m for m in range(fanin)), 7 * fanin]
    for level in range(depth):
        for member in members[level]:
            (result,) = network.inbox[member]
            assert (source_of(result), values(result)) == (endpoints[level], exact)
    moved = [{name: count - earlier[name] for name, count in aggregator.stats().items()}
             for aggregator, earlier in zip(aggregators, before, strict=True)]
    # Summed again only above the lost partial; after a lost result, nowhere.
    resummed = [1 if opcode == Opcode.PARTIAL and level < lost[1] + 1 else 0 for level in range(depth)]
    assert [each["accumulated"] for each in moved] == resummed
    assert [each["relayed"] for each in moved] == [0] + [1] * (depth - 1)
    assert all(network.links[member, endpoints[level]] == (member not in served)
               for level in range(depth) for member in members[level])
    # The root's own members get the result once in all; every partial that reached the root again (one per
    # retransmission below the loss) is answered with the result the root holds, to level 1 alone.
    assert [network.links[endpoints[0], member] for member in members[0]] == [int(opcode == Opcode.PARTIAL)] * 2
    again = network.links[endpoints[1], endpoints[0]] - moved[0]["accumulated"]
    assert again >= 1 and moved[0]["answered"] == again
    assert network.links[endpoints[0], endpoints[1]] == moved[0]["accumulated"] + again


@pytest.mark.parametrize(("root", "tree", "members", "aggregators", "message"), [
    ("R", {"X": "Y", "Y": "X"}, {MEMBERS[0]: ("R", 0), MEMBERS[1]: ("X", 1)}, AGGREGATORS,
     "tree: a cycle, X -> Y -> X, that never reaches the root R"),
    ("R", {"X": "R", "Y": "X", "Z": "Y", "W": "Z"}, {MEMBERS[0]: ("R", 0), MEMBERS[1]: ("W", 1)},
     {**AGGREGATORS, "W": (0x0A_00_10_04, 18775)},
     "tree: Z gathers members but has no aggregator address"),
    ("R", {"X": "R"}, {MEMBERS[0]: ("R", 0), MEMBERS[1]: ("Q", 1)}, AGGREGATORS,
     "tree: member 10.0.32.1:7001 sends to Q, which is under no aggregator: neither the root R nor a city of the "
     "tree"),
    ("R", {"X": "Q"}, {MEMBERS[0]: ("R", 0), MEMBERS[1]: ("X", 1)}, AGGREGATORS,
     "tree: X -> Q does not reach the root R: Q has no parent"),
    ("R", {"R": "X", "X": "R"}, {MEMBERS[0]: ("R", 0), MEMBERS[1]: ("X", 1)}, AGGREGATORS,
     "tree: it gives the root R a parent (X); the root has none"),
    ("R", None, {MEMBERS[0]: ("R", 0), MEMBERS[1]: ("R", 0)}, AGGREGATORS,
     "tree: the members' indices [0, 0] are not 0 to 1, each once (a clique of at most 64)"),
    ("R", {"X": "R"}, {MEMBERS[0]: ("R", 0), MEMBERS[1]: ("X", 1)}, {"R": R, "X": R},
     "tree: R and X name one aggregator, 10.0.16.1:18775; each level of a tree needs its own"),
])
def test_a_tree_no_tables_can_be_built_from_is_refused_in_one_line(root, tree, members, aggregators, message):
    with pytest.raises(TreeError) as refused:
        tree_routes(root, tree, members, aggregators)
    assert str(refused.value) == message


# --- islands summing along a registered chain of services on loopback ---------------------------------------

CHAIN_MEMBERS = (1, 2, 0, 1, 2)
"""Members sending to each service of the chain, the root's first: one level holds none and only relays."""
ELEMENTS, CHUNK = 10, 4
CHUNKS = -(-ELEMENTS // CHUNK)


def join_chain(stack, addresses, counts, group=0, **member_options):
    """Islands registered along a chain of services at `addresses` (the root's first), `counts[level]` of them
    sending to each level's, each service registered through its control port with the job's entry and its
    own route from `tree_routes`: (islands {island: (its level, its index in the clique)}, the clique's key)."""
    from contextlib import closing

    import inwire.client as client
    from inwire.client import CliqueKey, UdpMember, job_slots
    from inwire.control import JobLease, new_job
    from inwire.datagram import ip_int

    cities = [f"C{level}" for level in range(len(addresses))]
    islands = {}
    for level, count in enumerate(counts):
        for _ in range(count):
            island = stack.enter_context(closing(UdpMember(addresses[level], chunk=CHUNK, **member_options)))
            islands[island] = (level, len(islands))
    endpoint = {island: (ip_int(island.address[0]), island.address[1]) for island in islands}
    aggregators = {city: (ip_int(host), port) for city, (host, port) in zip(cities, addresses, strict=True)}
    routes = tree_routes(cities[0], dict(zip(cities[1:], cities, strict=False)),
                         {endpoint[island]: (cities[level], index) for island, (level, index) in islands.items()},
                         aggregators)
    job = new_job([island.address for island in islands], job_slots(1, client.DEFAULT_WINDOW, len(islands)), group)
    entries = [replace(job, routes={0: routes[city]},
                       members={endpoint[island] for island, (at, _) in islands.items() if at == level})
               for level, city in enumerate(cities)]
    for address, entry in zip(addresses, entries, strict=True):
        stack.enter_context(JobLease(address, entry))
    for island, (level, _) in islands.items():
        island.join(entries[level])
    key = CliqueKey(job=job.job, round=1, clique=0, group=0, fanin=len(islands), exponent=0, token=job.token)
    return islands, key


def sum_in_threads(islands, key, join_s):
    """Every island's sum of the clique's vectors, each in its own thread: ({index: sums}, the exact sum)."""
    import numpy as np

    vectors = {island: np.arange(ELEMENTS) * (index + 1) - 7 * index for island, (_, index) in islands.items()}
    sums = {}

    def island_sums(island):
        sums[islands[island][1]] = island.sum(key, islands[island][1], vectors[island])[0].tolist()

    threads = [threading.Thread(target=island_sums, args=(island,)) for island in islands]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=join_s)
    return sums, sum(vectors.values()).tolist()


@pytest.mark.parametrize("engine", ["fast", "golden"])
def test_islands_sum_along_a_registered_chain_of_5_services_over_each_link_once(engine, monkeypatch):
    """Five `inwire serve` services in a chain, each registered through its control port with the job's entry
    and its own route from `tree_routes`; islands hang at four of the levels. Every island gets the exact sum,
    and each service's counters show each link crossed once per chunk and direction: one partial up (none from
    the root), one result down per child service and per own member, and nothing answered twice."""
    from contextlib import ExitStack

    import inwire.client as client
    from inwire.serve import SoftwareAggregator, serving_in_thread

    if engine == "fast":
        pytest.importorskip("inwire._kernel")
    # A retransmission would be answered again and blur the count of frames on each link: the members' timeouts
    # start and stay far beyond a loopback round trip, however loaded the machine.
    monkeypatch.setattr(client, "MIN_TIMEOUT_S", 10.0)
    depth = len(CHAIN_MEMBERS)
    with ExitStack() as stack:
        services = [stack.enter_context(serving_in_thread(SoftwareAggregator(
            ("127.0.0.1", 0), unicast=True, registered=True, engine=engine, log=lambda line: None)))
            for _ in range(depth)]
        islands, key = join_chain(stack, [service.address for service in services], CHAIN_MEMBERS,
                                  timeout_s=10.0, deadline_s=20.0)
        sums, exact = sum_in_threads(islands, key, join_s=40)
        assert sums == dict.fromkeys(range(len(islands)), exact)
        assert [island.retransmits for island in islands] == [0] * len(islands)
        for level, service in enumerate(services):
            counters = service.counters()
            children = 1 if level < depth - 1 else 0
            below = CHAIN_MEMBERS[level] + children
            assert {name: counters[name] for name in ("accumulated", "partials_emitted", "relayed",
                                                      "results_emitted", "answered", "frames_in")} == {
                "accumulated": CHUNKS * below, "partials_emitted": CHUNKS if level else 0,
                "relayed": CHUNKS if level else 0, "results_emitted": CHUNKS * below, "answered": 0,
                "frames_in": CHUNKS * (below + (1 if level else 0))}, level


GATEWARE_CHAIN_MEMBERS = (1, 1, 2, 0, 1)
"""Members sending to each level of the chain through the gateware, the root's first: the gateware at level
GATEWARE_LEVEL gathers two members and the partial of the level below, which holds none and only relays."""
GATEWARE_LEVEL = 2
GATEWARE_GROUP = "239.73.0.37"


@contextmanager
def served_gateware(slots, max_elements):
    """`inwire serve --sim icarus:8` on loopback, its results multicast out of lo: its address, once built."""
    with services.served_gateware("--slots", str(slots), "--max-elements", str(max_elements)) as (port, _):
        yield "127.0.0.1", port


def counters_asked_by(island, aggregator):
    """An aggregator's counters, asked by a member of its registered job with a version 3 stats request."""
    import numpy as np

    from inwire.datagram import parse_stats_reply, payload_of
    from inwire.packets import build_frames
    from inwire.protocol import Opcode

    entry = island.entry
    request = build_frames(np.zeros((1, 0), dtype=np.int32), opcode=Opcode.STATS_REQUEST, version=3, sender=0,
                           job=entry.job, token=entry.token, group=entry.group)
    island.socket.settimeout(30)
    island.socket.sendto(payload_of(request[0]), aggregator)
    while True:  # answers to the island's last retransmissions may come first
        counters = parse_stats_reply(island.socket.recv(65535))
        if counters is not None:
            return counters


@pytest.mark.sim
def test_islands_sum_bit_exact_along_a_registered_chain_of_5_levels_through_the_served_gateware(monkeypatch):
    """A chain of five services registered through their control ports, the middle one `inwire serve --sim`:
    the gateware's tables take its route (its level, the parent its partial goes to, the child whose partials
    it takes). The gateware holds jobs with a multicast group only, and with a group a result goes to the group
    and to no child aggregator: each level below the root gets the result when its members' retransmissions
    walk up to a level that has it (docs/protocol.md, Loss recovery); the islands here do not listen on the
    group (their sockets share the services' host), so each takes the answer to its retransmission. Every
    island gets the exact sum; at every level, the gateware's as the golden model's, each chunk is summed once
    per member and child and its result relayed once from the parent, and nothing is refused."""
    from contextlib import ExitStack

    import inwire.client as client
    from inwire.serve import SoftwareAggregator, serving_in_thread

    # Retransmissions carry the result down: a first one soon, none faster than the co-simulation answers.
    monkeypatch.setattr(client, "MIN_TIMEOUT_S", 0.5)
    depth = len(GATEWARE_CHAIN_MEMBERS)
    with ExitStack() as stack:
        gateware = stack.enter_context(served_gateware(slots=32, max_elements=CHUNK))
        services = {level: stack.enter_context(serving_in_thread(SoftwareAggregator(
            ("127.0.0.1", 0), registered=True, engine="golden", multicast_iface="127.0.0.1", log=lambda line: None)))
            for level in range(depth) if level != GATEWARE_LEVEL}
        addresses = [gateware if level == GATEWARE_LEVEL else services[level].address for level in range(depth)]
        islands, key = join_chain(stack, addresses, GATEWARE_CHAIN_MEMBERS, group=GATEWARE_GROUP, timeout_s=2.0,
                                  deadline_s=90.0)
        sums, exact = sum_in_threads(islands, key, join_s=120)
        assert sums == dict.fromkeys(range(len(islands)), exact)
        member = next(island for island, (level, _) in islands.items() if level == GATEWARE_LEVEL)
        counters = {level: service.counters() for level, service in services.items()}
        counters[GATEWARE_LEVEL] = counters_asked_by(member, gateware)
    for level in range(depth):
        below = GATEWARE_CHAIN_MEMBERS[level] + (1 if level < depth - 1 else 0)
        assert {name: counters[level][name] for name in ("accumulated", "relayed", "drop_member", "drop_mismatch",
                                                         "drop_job", "drop_token")} == {
            "accumulated": CHUNKS * below, "relayed": CHUNKS if level else 0, "drop_member": 0, "drop_mismatch": 0,
            "drop_job": 0, "drop_token": 0}, level
        # Up once per chunk, and again for each retransmission that reached the level before the result did.
        assert counters[level]["partials_emitted"] >= (CHUNKS if level else 0), level


def test_islands_average_along_a_registered_3_level_tree_of_per_city_services(tmp_path):
    """The clique R, X, Y, Z sums along the schedule's tree Z -> Y -> X -> R (Y and Z's islands send to Y, X's
    to X, R's to R) as a registered job: each city's service registered with its entry from `tree_job_entries`,
    every island ends with the exact clique average, at every averaging, and the partials went up the tree."""
    from contextlib import ExitStack, closing

    pytest.importorskip("torch")
    import numpy as np
    import torch

    from inwire.client import DEFAULT_WINDOW, job_slots
    from inwire.codec_average import clique_average
    from inwire.control import JobLease, new_job
    from inwire.plan.schedule_file import load_schedule_file
    from inwire.serve import SoftwareAggregator, serving_in_thread
    from inwire.train.averaging import InwireExchange, tree_job_entries
    from islands import average_in_threads
    from schedules import write_schedule

    names = ["R", "X", "Y", "Z"]
    schedule = load_schedule_file(write_schedule(tmp_path / "tree.json", islands=names, rounds=[[
        {"members": names, "aggregator": "R", "tree": {"X": "R", "Y": "X", "Z": "Y"}}]]))
    models = {}
    for seed, name in enumerate(names):
        torch.manual_seed(seed)
        models[name] = torch.nn.Linear(20, 15)  # 315 parameters: two chunks
    flat = [torch.nn.utils.parameters_to_vector(models[name].parameters()).detach().numpy().copy() for name in names]
    expected = clique_average([clique_average(flat)] * len(names))  # the second averaging starts from the first
    with ExitStack() as stack:
        services = {city: stack.enter_context(serving_in_thread(SoftwareAggregator(
            ("127.0.0.1", 0), unicast=True, registered=True, log=lambda line: None))) for city in ("R", "X", "Y")}
        aggregators = {city: service.address for city, service in services.items()}
        exchanges = {name: stack.enter_context(closing(InwireExchange(aggregators, deadline_s=20)))
                     for name in names}
        job = new_job([exchange.address for exchange in exchanges.values()], job_slots(1, DEFAULT_WINDOW, len(names)))
        entries = tree_job_entries(job, schedule, {name: exchange.address for name, exchange in exchanges.items()},
                                   aggregators)
        assert {city: len(entry.members) for city, entry in entries.items()} == {"R": 1, "X": 1, "Y": 2}
        for city, entry in entries.items():
            stack.enter_context(JobLease(services[city].address, entry))
        for exchange in exchanges.values():
            exchange.join(job)
        outcome = average_in_threads(models, exchanges, dict.fromkeys(names, schedule), 2)
        counters = {city: service.counters() for city, service in services.items()}
    errors = [error for error in outcome.values() if error is not None]
    assert not errors, errors
    for name in names:
        assert np.array_equal(torch.nn.utils.parameters_to_vector(models[name].parameters()).detach().numpy(),
                              expected), name
    assert counters["R"]["partials_emitted"] == 0
    assert all(counters[city]["partials_emitted"] > 0 and counters[city]["relayed"] > 0 for city in ("X", "Y"))


def test_a_clique_index_with_two_routes_at_one_aggregator_is_refused_in_one_line(tmp_path):
    """Round 0 sums clique 0 along X -> R, round 1 sums clique 0 flat at X: X's tables would need two routes
    for clique 0 (a partial to R, and none); an island the exchanges do not name is refused too."""
    pytest.importorskip("torch")
    from inwire.control import new_job
    from inwire.plan.schedule_file import load_schedule_file
    from inwire.train.averaging import tree_job_entries
    from schedules import write_schedule

    names = ["R", "X", "Y"]
    islands = {name: ("127.0.0.1", 5000 + k) for k, name in enumerate(names)}
    aggregators = {"R": ("127.0.0.1", 6000), "X": ("127.0.0.1", 6001)}
    job = new_job(islands.values(), 16)
    schedule = load_schedule_file(write_schedule(tmp_path / "two.json", islands=names, rounds=[
        [{"members": names, "aggregator": "R", "tree": {"X": "R", "Y": "X"}}],
        [{"members": ["X", "Y"], "aggregator": "X"}]]))
    with pytest.raises(TreeError) as refused:
        tree_job_entries(job, schedule, islands, aggregators)
    assert str(refused.value) == ("schedule round 1, clique 0: X's aggregator would hold another route for clique 0 "
                                  "than in an earlier round; a registered job's tables hold one route per clique "
                                  "index")
    with pytest.raises(TreeError) as refused:
        tree_job_entries(job, schedule, {"R": islands["R"]}, aggregators)
    assert str(refused.value) == "schedule round 0, clique 0: no address for island X, Y"


@pytest.mark.parametrize("engine", ["fast", "golden"])
def test_a_stalled_sum_s_roll_call_names_the_missing_member_at_every_level_of_a_registered_tree(engine):
    """A chain of two services, member 0 at the root C0, members 1 and 2 below at C1; member 2 never sends. The
    island below is told that member 2's contribution never arrived (its roll call, kept at its own service,
    finds member 1 and not member 2); the island at the root, whose service holds no record of members 1 and 2,
    is told that every member sending there answered and that 1 and 2 send to another aggregator of the tree,
    not that they are missing."""
    from contextlib import ExitStack, closing

    import numpy as np

    import inwire.client as client
    from inwire.client import ClientError, CliqueKey, UdpMember, job_slots
    from inwire.control import JobLease, new_job
    from inwire.datagram import ip_int
    from inwire.serve import SoftwareAggregator, serving_in_thread

    if engine == "fast":
        pytest.importorskip("inwire._kernel")
    cities = ["C0", "C1"]
    with ExitStack() as stack:
        services = {city: stack.enter_context(serving_in_thread(SoftwareAggregator(
            ("127.0.0.1", 0), unicast=True, registered=True, engine=engine, log=lambda line: None)))
            for city in cities}
        islands = [stack.enter_context(closing(UdpMember(services[city].address, chunk=CHUNK, timeout_s=0.05,
                                                         deadline_s=1.5)))
                   for city in ("C0", "C1", "C1")]
        place = {island: (city, index) for index, (island, city) in enumerate(zip(islands, ("C0", "C1", "C1")))}
        endpoint = {island: (ip_int(island.address[0]), island.address[1]) for island in islands}
        aggregators = {city: (ip_int(service.address[0]), service.address[1]) for city, service in services.items()}
        routes = tree_routes("C0", {"C1": "C0"}, {endpoint[island]: at for island, at in place.items()}, aggregators)
        job = new_job([island.address for island in islands], job_slots(1, client.DEFAULT_WINDOW, len(islands)))
        entries = {city: replace(job, routes={0: routes[city]},
                                 members={endpoint[island] for island, (at, _) in place.items() if at == city})
                   for city in cities}
        for city in cities:
            stack.enter_context(JobLease(services[city].address, entries[city]))
        for island, (city, _) in place.items():
            island.join(entries[city])
        key = CliqueKey(job=job.job, round=1, clique=0, group=0, fanin=3, exponent=0, token=job.token)
        failures = {}

        def island_sums(island):
            with pytest.raises(ClientError) as failure:
                island.sum(key, place[island][1], np.arange(ELEMENTS))
            failures[place[island][1]] = failure.value

        threads = [threading.Thread(target=island_sums, args=(island,)) for island in islands[:2]]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=20)
    assert failures[1].missing == (2,) and "no contribution of member 2 arrived" in str(failures[1]), failures[1]
    assert failures[0].missing == () and ("every member that sends to this aggregator answered the roll call; "
                                          "member 1, member 2 send to other aggregators of the registered tree"
                                          in str(failures[0])), failures[0]
