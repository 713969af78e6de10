"""Islands training through an aggregator, round by round along a schedule (`inwire stream`).

Every island of the schedule runs as an asyncio task with its own socket. In round r (schedule round
r mod period) each clique member quantizes its seeded gradient at the clique's shared exponent, packetizes
it with the numpy builder and sends the chunks to the aggregator, keeping at most `window` chunks in
flight. Each result is checked bit for bit against the sum the island computes itself from every
member's seeded gradient, then the average is applied to the island's model. Lost datagrams are
recovered by timeout and retransmission (contributions are idempotent; a completed slot answers with its
stored result). Rounds run in lock step: round r+1 starts when every island has finished round r.

Reduction trees: with one aggregator per city (`--target udp:FILE`, or `sim:` for a schedule with trees),
each member sends to its own level's aggregator as the clique's schedule tree says (docs/schedule.md). A
registered run (a token in the config: `inwire stream` over UDP) sends version 3 frames without a route: each
city's aggregator holds its part of every tree in its job tables (`plan.tables.job_entries`), so a tree may
have any depth, and a member's results come from the aggregator it sent to. Unregistered (version 2) frames
carry the route: bitmap = the member's own bit, expect = its level (0 at the root), and the hops above with
their levels, at most three levels. A member that misses a result retransmits to the same aggregator, and
the aggregators walk the loss up the tree (docs/protocol.md). With one aggregator the trees are ignored.

What a member does for one round (slots, payloads, the window, retransmission, reading results) is
`inwire.client`'s, the one member client that the torch integration uses too; this module adds the
workload (seeded gradients, the sums to expect), the rounds in lock step, the transports and the report.
"""

import asyncio
import math
import time
from dataclasses import dataclass

import numpy as np

from . import client
from .client import RouteError, clique_group
from .client import member_sum as member_sum_of
from .codec import choose_exponent, dequantize, quantize
from .datagram import opcode_of, parse_endpoint, parse_stats_reply, stats_request
from .diagnosis import diagnose
from .errors import InwireError
from .jobs import TreeError
from .plan.cost import ScheduleError
from .plan.jsonfile import read_json
from .plan.schedule_file import load_schedule_file, schedule_topology
from .plan.tables import member_paths_at, schedule_rounds, tables_document
from .plan.topology import TopologyError, load_topology
from .protocol import (
    ELEMENT_BYTES,
    ELEMENT_DTYPE,
    FAULT_DROP_COUNTERS,
    INT32_MAX,
    INT32_MIN,
    JOB_VERSION,
    JUMBO_ELEMENTS_PER_FRAME,
    MAX_ELEMENTS_PER_FRAME,
    MAX_FANIN,
    MTU_BYTES,
    RETRANSMISSION_DROP_COUNTERS,
    Opcode,
)
from .simulators import parse_simulator
from .transport import CaptureTransport, StatsSilence, UdpTransport

GRADIENT_BOUND = 1.0
"""Seeded gradients lie in [-1, 1): every member knows this bound, so all pick the same exponent."""
LEARNING_RATE = 0.1
DEFAULT_CHUNK = client.DEFAULT_CHUNK
DEFAULT_WINDOW = client.DEFAULT_WINDOW
DEFAULT_TIMEOUT_MS = round(1000 * client.DEFAULT_TIMEOUT_S)
DEFAULT_RETRIES = client.DEFAULT_RETRIES
STATS_FIRST_WAIT_S = 0.3
"""Shortest wait for the first stats reply; each later request waits twice as long as the one before."""
STATS_MIN_BUDGET_S = 0.9
"""Shortest time the counters are asked for (three requests' worth of STATS_FIRST_WAIT_S), however short the
run's timeout and retries."""
MAX_ELEMENTS = 1 << 26
"""Largest --elements: 256 MiB of int32 per island (the chunk offset field would take up to 2**32)."""
BYTES_PER_ELEMENT = 32
"""Memory an island's element costs during a round: its float64 gradient, int32 contribution, payloads,
received sums and expected bytes, float32 model and its share of the int64 expected sums."""
MAX_TIMEOUT_MS = 60_000
"""Longest --timeout-ms: a result a minute late is lost (inf or 1e300 never gave a round up)."""
MAX_FRAMES = {"pcap": 1 << 20, "sim": 1 << 17}
"""Most contributions a run may send to an in-process aggregator: the golden model takes ~0.25 ms a frame
(a million frames: minutes, a capture of ~1 GB), the gateware in co-simulation far longer."""


UNREGISTRABLE_JOB = "--job 0 cannot be registered: a registered job's id is a nonzero 32-bit number"


class StreamError(InwireError):
    """The run cannot start; the message is one line for the user."""


@dataclass(frozen=True)
class Target:
    kind: str
    """'udp', 'pcap', 'sim' or 'iface'."""
    value: object
    text: str


def parse_target(text):
    kind, sep, rest = str(text).partition(":")
    if kind == "udp" and rest.startswith("//"):
        return Target("udp", parse_endpoint(rest[2:], "--target"), text)
    if kind == "udp" and sep and rest:
        return Target("udp", load_aggregator_map(rest), text)
    if kind == "pcap" and sep and rest:
        return Target("pcap", rest, text)
    if kind == "sim" and sep:
        try:
            return Target("sim", parse_simulator(rest), text)
        except ValueError as error:
            raise StreamError(f"target {text!r}: {error}") from None
    if kind == "iface" and sep and rest:
        return Target("iface", rest, text)
    raise StreamError(f"target {text!r} is not one of udp://HOST:PORT, udp:FILE, pcap:FILE, sim:icarus, "
                      f"sim:verilator, iface:NAME")


def load_aggregator_map(path):
    """`udp:FILE`: a JSON object mapping each aggregator city to "IPv4:PORT", as {city: (ip, port)}.

    A partial names the next aggregator by its IPv4 address alone and goes to the port it came from, so
    every aggregator of the map listens on the same port, each at its own address."""
    document = read_json(path, "aggregator map", StreamError)
    where = f"target udp:{path}"
    if not isinstance(document, dict) or not document:
        raise StreamError(f"{where}: the file must hold a JSON object mapping each aggregator city to "
                          f"\"IPv4:PORT\"")
    aggregators = {}
    for city, endpoint in document.items():
        if not isinstance(endpoint, str):
            raise StreamError(f"{where}: {city!r} maps to {endpoint!r}, not \"IPv4:PORT\"")
        try:
            aggregators[city] = parse_endpoint(endpoint, f"{where}: {city!r} at")
        except ValueError as error:
            raise StreamError(str(error)) from None
        if aggregators[city][1] == 0:
            raise StreamError(f"{where}: {city!r} at {endpoint!r}: port 0 names no aggregator")
    ports = {port for _, port in aggregators.values()}
    if len(ports) > 1:
        raise StreamError(f"{where}: the aggregators listen on ports {', '.join(map(str, sorted(ports)))}; a "
                          f"partial names only the next aggregator's IPv4 address, so all must share one port "
                          f"(on one machine: 127.0.0.2, 127.0.0.3, ... on one port)")
    seen = {}
    for city, (address, _) in aggregators.items():
        if address in seen:
            raise StreamError(f"{where}: {seen[address]!r} and {city!r} are both at {address}; each city's "
                              f"aggregator needs its own address")
        seen[address] = city
    return aggregators


def load_plan(path):
    """The schedule file with its topology resolved, checked against what the stream can carry."""
    try:
        plan = load_schedule_file(path)
        topology_spec = schedule_topology(plan.topology, path)
    except ScheduleError as error:
        raise StreamError(str(error)) from None
    try:
        topology = load_topology(topology_spec)
    except (TopologyError, OSError, ValueError) as error:
        raise StreamError(f"{path}: {error}") from None
    for city in plan.islands + tuple(aggregator_cities(plan)):
        if city not in topology.cities:
            raise StreamError(f"{path}: {city!r} is not a city of topology {topology.name!r}")
    if len(plan.period) > 256 or max(len(cliques) for cliques in plan.period) > 256:
        raise StreamError(f"{path}: more than 256 rounds in a period or cliques in a round")
    for cliques in plan.period:
        for members, _ in cliques:
            if len(members) > MAX_FANIN:
                raise StreamError(f"{path}: a clique of {len(members)} islands exceeds fan-in {MAX_FANIN}")
    return plan.with_topology(topology)


def clique_trees(plan):
    """(period round, clique, members, aggregator, tree or None) for every clique of the period."""
    for p, cliques in enumerate(plan.period):
        trees = plan.trees[p] if plan.trees else (None,) * len(cliques)
        for c, ((members, aggregator), tree) in enumerate(zip(cliques, trees)):
            yield p, c, members, aggregator, tree


def aggregator_cities(plan):
    """Every city that sums for some clique of the schedule: roots and the values of their trees."""
    cities = set()
    for _, _, _, aggregator, tree in clique_trees(plan):
        if aggregator is not None:
            cities.add(aggregator)
            cities.update((tree or {}).values())
    return sorted(cities)


def has_trees(plan):
    return any(tree for *_, tree in clique_trees(plan))


def make_transport(target, plan, workload_slots, config):
    """The transport a parsed --target (`parse_target`) names, for `plan`'s islands; `workload_slots` and
    `config` size a capture's or co-simulation's aggregator."""
    if target.kind == "udp" and isinstance(target.value, dict):
        # Only the schedule's aggregator cities: the stats are asked of each (a map may name more).
        aggregators = {city: target.value[city] for city in aggregator_cities(plan)}
        first = next(iter(aggregators.values()))
        return UdpTransport({island: first for island in plan.islands}, window=config.window, chunk=config.chunk,
                            aggregators=aggregators)
    if target.kind == "udp":
        return UdpTransport({island: target.value for island in plan.islands}, window=config.window, chunk=config.chunk)
    if target.kind == "iface":
        from .iface import IfaceTransport

        return IfaceTransport(target.value, plan.islands)
    if target.kind == "sim":
        from inwire_hdl.cosim import CoSimulation

        simulator, width = target.value
        return CaptureTransport(None, plan.islands, workload_slots, config.chunk,
                                make_aggregator=lambda aggregator: CoSimulation(simulator, width, aggregator),
                                cities=aggregator_cities(plan) if has_trees(plan) else None)
    return CaptureTransport(target.value, plan.islands, workload_slots, config.chunk)


class DeepTreeError(StreamError):
    """A tree deeper than an unregistered (version 2) frame's route can name."""


def clique_routes(members, root, tree, address, where="schedule"):
    """`client.clique_routes`, a path too deep for a frame refused as a DeepTreeError."""
    try:
        return client.clique_routes(members, root, tree, address, where)
    except RouteError as error:
        raise DeepTreeError(str(error)) from None


@dataclass
class StreamConfig:
    rounds: int = 4
    elements: int = 1024
    seed: int = 0
    loss: float = 0.0
    window: int = DEFAULT_WINDOW
    timeout_ms: float = DEFAULT_TIMEOUT_MS
    chunk: int = DEFAULT_CHUNK
    retries: int = DEFAULT_RETRIES
    job: int = 1
    token: int = 0
    """A registered job's token (`control.new_job`): the islands send version 3 frames carrying it, to the job's
    group 0 (results as unicast copies), and take only results that carry it; 0: version 2, unregistered."""

    def __post_init__(self):
        if self.rounds <= 0:
            raise StreamError(f"--rounds must be positive, got {self.rounds}")
        if self.seed < 0:
            raise StreamError(f"--seed must be a non-negative integer, got {self.seed}")
        if self.rounds >= 2**32:
            raise StreamError(f"--rounds must fit the 32-bit round field, got {self.rounds}")
        if self.elements <= 0:
            raise StreamError(f"--elements must be positive, got {self.elements}")
        if self.elements > MAX_ELEMENTS:
            raise StreamError(f"--elements must be at most {MAX_ELEMENTS:,} (256 MiB of int32 per island), got "
                              f"{self.elements:,}")
        if not 0 <= self.loss < 1:
            raise StreamError(f"--loss must lie in [0, 1), got {self.loss}")
        if self.window <= 0:
            raise StreamError(f"--window must be positive, got {self.window}")
        if not 0 < self.timeout_ms <= MAX_TIMEOUT_MS:
            raise StreamError(f"--timeout-ms must lie in (0, {MAX_TIMEOUT_MS:,}] (a result a minute late is lost), "
                              f"got {self.timeout_ms:g}")
        if not 1 <= self.chunk <= JUMBO_ELEMENTS_PER_FRAME:
            raise StreamError(f"--chunk must lie in [1, {JUMBO_ELEMENTS_PER_FRAME}] elements (8 KiB, a jumbo frame; "
                              f"above {MAX_ELEMENTS_PER_FRAME} the path needs an MTU above {MTU_BYTES} bytes), "
                              f"got {self.chunk}")
        if self.retries <= 0:
            raise StreamError(f"--retries must be positive, got {self.retries}")
        if not 0 <= self.job < 2**32:
            raise StreamError(f"--job must fit 32 bits, got {self.job}")
        if not 0 <= self.token < 2**64:
            raise StreamError(f"a job's token must fit 64 bits, got {self.token}")
        if self.token and not self.job:
            raise StreamError(UNREGISTRABLE_JOB)


def stats_patience(config):
    """(first wait, budget) in seconds: how long the first request to the aggregator waits for its answer, and
    how long it is asked in all: as long as a round waits for a chunk's result (timeout times retries)."""
    return (max(config.timeout_ms / 1000, STATS_FIRST_WAIT_S),
            max(config.timeout_ms / 1000 * config.retries, STATS_MIN_BUDGET_S))


REGISTRATION_RETRIES = 100
"""The most retries `control.register` takes."""


def registration_patience(config):
    """(timeout_s, retries) of a registration (`control.JobLease`): asked as long as the counters are
    (`stats_patience`, up to REGISTRATION_RETRIES more tries), so that a stalled aggregator is waited for alike."""
    wait, budget = stats_patience(config)
    return wait, min(REGISTRATION_RETRIES, max(1, math.ceil(budget / wait) - 1))


def available_memory():
    """Bytes of memory available to a new process (MemAvailable), or None where the OS does not say."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


@dataclass(frozen=True)
class CliqueRound:
    round: int
    clique: int
    members: tuple
    aggregator: str
    group: int
    exponent: int
    routes: dict = None
    """member -> (aggregator city, tree fields or None for a registered run), with one aggregator per city; None
    with one aggregator."""


class Workload:
    """What every island can compute alone: cliques, exponents, seeded gradients and the sums to expect."""

    def __init__(self, plan, config, addresses=None, registered=None):
        self.plan, self.config = plan, config
        self.addresses = addresses
        """Aggregator city -> IPv4 address (int) when each city has its own; None for one aggregator."""
        self.registered = bool(config.token) if registered is None else registered
        """Whether the run is a registered job (before its token is drawn, the caller says so)."""
        self.routes = {}
        if addresses is not None and self.registered:
            try:
                tables_document(*schedule_rounds(plan), plan.islands, list(addresses))
            except TreeError as error:
                raise StreamError(str(error)) from None
            # The aggregators' tables hold the route (`plan.tables.job_entries`): a member only needs where it sends,
            # as `schedule_routes` places it, and a tree may have any depth.
            for p, c, members, aggregator, tree in clique_trees(plan):
                paths = member_paths_at(addresses, members, aggregator, tree)
                self.routes[p, c] = {member: (path[0], None) for member, path in paths.items()}
        elif addresses is not None:
            for p, c, members, aggregator, tree in clique_trees(plan):
                if aggregator is not None:
                    self.routes[p, c] = clique_routes(members, aggregator, tree, addresses.__getitem__,
                                                      f"rounds[{p}].cliques[{c}]")
        self.index = {name: i for i, name in enumerate(plan.islands)}
        self.max_cliques = max(len(cliques) for cliques in plan.period)
        self.chunks = -(-config.elements // config.chunk)
        self._cache = {}
        if self.slots_needed > 1 << 16:
            raise StreamError(f"--window {config.window} needs {self.slots_needed:,} slots (4 x {self.max_cliques} "
                              f"cliques x window), more than the 65,536 the slot field numbers")

    def frames(self):
        """Contributions the run sends without loss: every member's chunks in every round, counted per period
        (a loop over 2**31 rounds took hours)."""
        per_round = [sum(len(members) for members, _ in cliques) for cliques in self.plan.period]
        periods, rest = divmod(self.config.rounds, len(per_round))
        return (periods * sum(per_round) + sum(per_round[:rest])) * self.chunks

    def check_resources(self, target_kind):
        """Refuse up front a run that cannot fit this machine's memory or would keep an in-process
        aggregator busy for hours."""
        config = self.config
        needed = len(self.plan.islands) * config.elements * BYTES_PER_ELEMENT
        available = available_memory()
        if available is not None and needed > available:
            raise StreamError(f"--elements {config.elements:,} needs about {needed / 2**30:.1f} GiB for "
                              f"{len(self.plan.islands)} islands, more than the {available / 2**30:.1f} GiB "
                              f"available")
        limit = MAX_FRAMES.get(target_kind)
        if limit is not None and (frames := self.frames()) > limit:
            raise StreamError(f"--elements {config.elements:,} x --rounds {config.rounds:,} makes "
                              f"{frames:,} contributions, more than the {limit:,} a {target_kind}: target "
                              f"runs; lower --elements or --rounds, or raise --chunk")

    def stats_asker(self, city):
        """The island that asks `city`'s aggregator for its counters: the first that sends to it in some round, else
        the first island (a registered run makes it a member of that city's entry: an aggregator answers a job's
        stats request from its members alone)."""
        return next((island for island in self.plan.islands
                     if any(routes.get(island, (None,))[0] == city for routes in self.routes.values())),
                    self.plan.islands[0])

    @property
    def slots_needed(self):
        return client.slots_needed(self.max_cliques, self.config.window)

    def clique_of(self, island, round_):
        period_round = round_ % len(self.plan.period)
        for c, (members, aggregator) in enumerate(self.plan.period[period_round]):
            if island in members:
                # A registered job's results go to its group, 0: a unicast copy to each member.
                group = 0 if self.config.token else clique_group(period_round, c)
                return CliqueRound(round_, c, members, aggregator, group,
                                   choose_exponent(GRADIENT_BOUND, len(members)), self.routes.get((period_round, c)))
        return None

    def slot(self, round_, clique, chunk):
        return client.slot(round_, clique, chunk, self.config.window, self.max_cliques)

    def gradient(self, island, round_):
        rng = np.random.default_rng([self.config.seed, self.index[island], round_])
        return rng.uniform(-GRADIENT_BOUND, GRADIENT_BOUND, self.config.elements)

    def contribution(self, island, clique):
        key = (clique.round, "q", island)
        if key not in self._cache:
            self._cache[key] = quantize(self.gradient(island, clique.round), clique.exponent)
        return self._cache[key]

    def expected_sum(self, clique):
        key = (clique.round, "sum", clique.clique)
        if key not in self._cache:
            self._cache[key] = sum(self.contribution(m, clique).astype(np.int64) for m in clique.members)
        return self._cache[key]

    def forget_before(self, round_):
        self._cache = {key: value for key, value in self._cache.items() if key[0] >= round_}

    def key(self, clique):
        """What every member of `clique` agrees on for its sum."""
        return client.CliqueKey(self.config.job, clique.round, clique.clique, clique.group, len(clique.members),
                                clique.exponent, self.max_cliques, self.config.token)

    def payloads(self, island, clique):
        """UDP payloads of the island's contributions for the round, one per chunk, built in bulk."""
        return client.contributions(self.contribution(island, clique), clique.members.index(island), self.key(clique),
                                    self.config.chunk, self.config.window,
                                    clique.routes[island][1] if clique.routes else None)


@dataclass
class RoundTally:
    retransmits: int = 0
    dropped: int = 0
    wrong: int = 0
    checked: int = 0
    refused: int = 0
    failure: str = None
    failed_slot: int = None


class Island:
    """One island: its socket (through the transport), its round state (`client.member_sum`: a `MemberSum`,
    its results read by the compiled kernel where it is built) and its model.

    A result's elements are copied straight into the round's buffer and its header fields are checked on the
    spot (`MemberSum.on_result`); the elements are compared with the expected sum once per round, when every
    chunk is in (`finish_round`)."""

    def __init__(self, name, workload, transport, loss_rng):
        self.name, self.workload, self.transport = name, workload, transport
        self.loss_rng = loss_rng
        self.model = np.zeros(workload.config.elements, dtype=np.float32)
        self.sum = None
        self.prepared = None
        self.route = ()
        """(aggregator city,) this round's contributions go to, with one aggregator per city; else ()."""

    def transmit(self, payload, tally):
        loss = self.workload.config.loss
        if loss and self.loss_rng.random() < loss:
            tally.dropped += 1
            return
        self.transport.send(self.name, payload, *self.route)

    def prepare(self, round_):
        """Everything the round needs that does not depend on the network: the gradient, its payloads, the
        expected sum. Done before the round's clock starts."""
        workload = self.workload
        clique = workload.clique_of(self.name, round_)
        if clique is None:
            self.prepared = None
            return
        expected = workload.expected_sum(clique)
        # The bytes a right round receives, compared at once at the end (only sums that fit int32 can be right).
        fits = expected.size == 0 or (expected.min() >= INT32_MIN and expected.max() <= INT32_MAX)
        self.expected_bytes = expected.astype(ELEMENT_DTYPE).tobytes() if fits else None
        self.route = (clique.routes[self.name][0],) if clique.routes else ()
        if self.route and workload.registered:
            # A registered tree's results come from the aggregator the member sends to, this round's.
            self.transport.answer_from(self.name, self.route[0])
        self.prepared = (clique, workload.payloads(self.name, clique), expected)

    async def run_round(self, round_, tally):
        config = self.workload.config
        if self.prepared is None:
            return
        clique, payloads, expected = self.prepared
        self.prepared = None
        self.tally = tally
        member_sum = member_sum_of(payloads, self.workload.key(clique), config.elements, config.chunk, config.window,
                                   config.timeout_ms / 1000, config.retries)
        self.transport.subscribe(self.name, clique.group)
        self.finished = asyncio.Event()
        self.loop = loop = asyncio.get_running_loop()
        self.sum = member_sum
        timeout = config.timeout_ms / 1000
        for payload in member_sum.start(loop.time()):
            self.transmit(payload, tally)
        try:
            while not member_sum.done:
                try:
                    await asyncio.wait_for(self.finished.wait(), timeout / 4)
                except TimeoutError:
                    pass
                for payload in member_sum.due(loop.time()):
                    self.transmit(payload, tally)
                if member_sum.failed_chunk is not None:
                    chunk = member_sum.failed_chunk
                    tally.failure = (f"round {round_}: {self.name} got no result for chunk {chunk} after "
                                     f"{config.retries} retransmissions")
                    tally.failed_slot = self.workload.slot(round_, clique.clique, chunk)
                    return
        finally:
            self.sum = None
            tally.retransmits += member_sum.retransmits
            tally.checked += member_sum.checked
            tally.refused += member_sum.results_refused
            self.transport.unsubscribe(self.name, clique.group)
        sums = self.finish_round(member_sum, expected)
        average = dequantize(sums, clique.exponent, len(clique.members))
        self.model -= np.float32(LEARNING_RATE) * average

    def finish_round(self, member_sum, expected):
        """Compare the round's elements with the expected sum; count each wrong result once (a saturated
        one is wrong: the seeded gradients fit); the sums."""
        sums = member_sum.sums()
        wrong = member_sum.wrong_chunks | member_sum.overflowed_chunks
        # One comparison of the round's bytes; element by element only to find which chunks are wrong.
        if self.expected_bytes is None or member_sum.received != self.expected_bytes:
            differ = np.flatnonzero(sums.astype(np.int64) != expected)
            wrong.update((differ // self.workload.config.chunk).tolist())
        self.tally.wrong += len(wrong)
        return sums

    def on_result(self, payload):
        """A result payload (bytes or a view valid only during the call) for this island, or not."""
        member_sum = self.sum
        if member_sum is None:
            return
        for freed in member_sum.on_result(payload, self.loop.time()):
            self.transmit(freed, self.tally)
        if member_sum.done:
            self.finished.set()

    def on_results(self, buffer, sizes, slot):
        """`on_result` of a batch of datagrams, the i-th at buffer[i * slot:][:sizes[i]] (results or not),
        read in one call at one clock reading; the payloads they free go out in the same order."""
        member_sum = self.sum
        if member_sum is None:
            return
        for freed in member_sum.on_results(buffer, sizes, slot, self.loop.time()):
            self.transmit(freed, self.tally)
        if member_sum.done:
            self.finished.set()


async def stream_async(plan, config, transport, progress=lambda _round: None, target_kind=None):
    """`run_stream` inside a running event loop."""
    addresses = getattr(transport, "aggregator_addresses", None)
    workload = Workload(plan, config, addresses)
    islands = {name: Island(name, workload, transport, np.random.default_rng([config.seed, i, 0x10557]))
               for i, name in enumerate(plan.islands)}
    stats_future = None

    def take_stats(payload):
        """A stats reply's counters to the stats request awaiting them, if one is."""
        if stats_future is not None and not stats_future.done():
            counters = parse_stats_reply(bytes(payload))
            if counters is not None:
                stats_future.set_result(counters)

    def deliver(island, payload):
        opcode = payload[3] if len(payload) > 3 else None  # opcode_of, inline: once per datagram
        if opcode == Opcode.RESULT:
            islands[island].on_result(payload)
        elif opcode == Opcode.STATS_REPLY:
            take_stats(payload)

    def deliver_batch(island, buffer, sizes, slot):
        # Every datagram goes to the round's sum, which ignores what is not one of its results; stats replies
        # are looked for only while a request awaits one, so a batch of results costs no per-datagram Python.
        islands[island].on_results(buffer, sizes, slot)
        if stats_future is not None and not stats_future.done():
            view = memoryview(buffer)
            for index, size in enumerate(sizes):
                payload = view[index * slot:index * slot + size]
                if opcode_of(payload) == Opcode.STATS_REPLY:
                    take_stats(payload)

    async def ask_stats():
        """Counters of every aggregator (city -> counters; one aggregator: None -> counters), and what was seen
        of those that never answered (city -> `StatsSilence`)."""
        nonlocal stats_future
        first_wait, budget = stats_patience(config)
        # A registered job's aggregator answers its members alone: the first island's socket is one.
        request = (stats_request(job=config.job, version=JOB_VERSION, token=config.token) if config.token
                   else stats_request())
        counters, silent = {}, {}
        for city in (sorted(addresses) if addresses else [None]):
            asker = plan.islands[0]
            if city is not None and config.token:
                asker = workload.stats_asker(city)
                transport.answer_from(asker, city)
            stats_future = asyncio.get_running_loop().create_future()
            answer = await transport.stats(asker, stats_future, first_wait, budget,
                                           *(() if city is None else (city,)), request=request)
            if isinstance(answer, StatsSilence):
                silent[city], answer = answer, None
            counters[city] = answer
        return counters, silent

    await transport.start(deliver, deliver_batch)
    kernel_before = kernel_drops(transport)
    send_errors_before = transport.send_errors
    failed_slot = None
    try:
        before, silent = await ask_stats()
        if silent:
            seen = "; ".join(str(silence) if city is None else f"aggregator of {city}: {silence}"
                             for city, silence in silent.items())
            raise StreamError(f"no answer from the target: {seen} (inwire serve answers them only from its own "
                              f"machine and its --stats-from prefix, and a stopped or stalled one answers none)")
        reports = []
        for round_ in range(config.rounds):
            workload.forget_before(round_)
            tally = RoundTally()
            for island in islands.values():
                island.prepare(round_)
            begun = time.perf_counter()
            await asyncio.gather(*(island.run_round(round_, tally) for island in islands.values()))
            elapsed = time.perf_counter() - begun
            members = sum(len(m) for m, _ in plan.cliques(round_))
            gradient_bytes = members * config.elements * ELEMENT_BYTES
            reports.append({"round": round_, "cliques": len(plan.cliques(round_)), "time_ms": elapsed * 1e3,
                            "gradient_bytes": gradient_bytes, "goodput_bytes_per_s": gradient_bytes / elapsed,
                            "retransmits": tally.retransmits, "dropped": tally.dropped,
                            "results_checked": tally.checked, "results_refused": tally.refused, "wrong": tally.wrong,
                            "finished": tally.failure is None, **({"failure": tally.failure} if tally.failure else {})})
            progress(round_)
            if tally.failure:
                failed_slot = tally.failed_slot
                break
        # The rounds' clocks only: making gradients and datagrams between rounds is not the network's time.
        total_s = sum(r["time_ms"] for r in reports) / 1e3
        after, _ = await ask_stats()
        kernel_after = kernel_drops(transport)
        send_errors = transport.send_errors - send_errors_before
    finally:
        transport.close()
    moved = {city: None if after[city] is None else {k: after[city][k] - before[city].get(k, 0)
                                                     for k in after[city]} for city in after}
    # Several aggregators (a tree's cities): their counters added up; each city's under "aggregators".
    aggregator = None if None in moved.values() else {
        k: sum(counters[k] for counters in moved.values()) for k in next(iter(moved.values()))}
    finished = len(reports) == config.rounds and all(r["finished"] for r in reports)
    wrong = sum(r["wrong"] for r in reports)
    models = np.stack([island.model for island in islands.values()])
    kernel = {side: kernel_after[side] - kernel_before[side] for side in kernel_after
              if kernel_after[side] is not None and kernel_before.get(side) is not None}
    report = {
        "islands": list(plan.islands), "rounds": reports, "elements": config.elements, "chunk": config.chunk,
        "window": config.window, "loss": config.loss, "seed": config.seed, "job": config.job,
        "slots_needed": workload.slots_needed, "time_s": total_s,
        "gradient_bytes": sum(r["gradient_bytes"] for r in reports),
        "goodput_bytes_per_s": sum(r["gradient_bytes"] for r in reports) / total_s if total_s else 0.0,
        "retransmits": sum(r["retransmits"] for r in reports), "dropped": sum(r["dropped"] for r in reports),
        "results_checked": sum(r["results_checked"] for r in reports), "wrong_results": wrong,
        "results_refused": sum(r["results_refused"] for r in reports) + getattr(transport, "results_refused", 0),
        "results_from_elsewhere": getattr(transport, "results_refused", 0),
        "registered": config.token != 0,
        "finished": finished, "bit_exact": finished and wrong == 0,
        "model_spread": float(np.max(models.max(axis=0) - models.min(axis=0))),
        "aggregator": aggregator, "kernel_drops": kernel, "send_errors": send_errors,
    }
    if addresses:
        report["aggregators"] = moved
    largest = max(len(members) for cliques in plan.period for members, _ in cliques)
    report["diagnosis"] = diagnose(report, target_kind, largest, failed_slot, kernel)
    return report


def kernel_drops(transport):
    """{"aggregator": n, "islands": n}: datagrams the kernel has dropped at the sockets of each side so far,
    where the transport and the OS can say."""
    counts = getattr(transport, "kernel_drops", None)
    return counts() if counts else {}


def run_stream(plan, config, transport, progress=None, target_kind=None):
    """Run the islands over `transport` (of --target kind `target_kind`, for the diagnosis); returns the
    report dict (see docs/host.md)."""
    return asyncio.run(stream_async(plan, config, transport, progress or (lambda _round: None), target_kind))


def format_report(report, target_text):
    lines = [f"{'round':>5} {'cliques':>7} {'time ms':>9} {'goodput MB/s':>13} {'retransmits':>11} "
             f"{'dropped':>7} {'checked':>7} {'wrong':>5}"]
    for r in report["rounds"]:
        lines.append(f"{r['round']:>5} {r['cliques']:>7} {r['time_ms']:>9.2f} {r['goodput_bytes_per_s'] / 1e6:>13.2f} "
                     f"{r['retransmits']:>11} {r['dropped']:>7} {r['results_checked']:>7} {r['wrong']:>5}"
                     + ("" if r["finished"] else f"  UNFINISHED: {r['failure']}"))
    aggregator = report["aggregator"]
    # Drops that retransmissions cause on a healthy run are said apart, so that "aggregator drops" means trouble.
    drops = ("-" if aggregator is None else
             f"{sum(aggregator.get(name, 0) for name in FAULT_DROP_COUNTERS)} (not counting "
             f"{sum(aggregator.get(name, 0) for name in RETRANSMISSION_DROP_COUNTERS)} retransmission drops)")
    lines.append(f"target {target_text}: {len(report['islands'])} islands, {report['elements']} elements, "
                 f"{len(report['rounds'])} rounds in {report['time_s']:.3f} s, goodput "
                 f"{report['goodput_bytes_per_s'] / 1e6:.2f} MB/s, {report['retransmits']} retransmits, "
                 f"{report['dropped']} dropped on purpose, aggregator drops {drops}"
                 + (f", {report['send_errors']} sends the islands' sockets refused" if report["send_errors"] else ""))
    lines.append(f"bit_exact: {'true' if report['bit_exact'] else 'false'} ({report['results_checked']} results "
                 f"checked, {report['wrong_results']} wrong)")
    return "\n".join(lines)
