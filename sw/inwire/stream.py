"""Islands training through an aggregator, round by round along a schedule (`inwire stream`).

Every island of the schedule runs as an asyncio task with its own socket. In round r (schedule round
r mod period) each clique member quantizes its seeded gradient at the clique's shared exponent, packetizes
it with the numpy builder and sends the chunks to the aggregator, keeping at most `window` chunks in
flight. Each result is checked bit for bit against the sum the island computes itself from every
member's seeded gradient, then the average is applied to the island's model. Lost datagrams are
recovered by timeout and retransmission (contributions are idempotent; a completed slot answers with its
stored result). Rounds run in lock step: round r+1 starts when every island has finished round r.

Slots: chunk j of clique c in round r uses slot ((r mod 2) * 2 + (j // W) mod 2) * C * W + c * W + j mod W
(C cliques at most per round, window W). A member sends chunk j only after it holds the result of chunk
j - W, so a slot is claimed again (by chunk j + 2W) only once every member holds its previous result; and
the two round pools keep the last round's results for late retransmissions (SwitchML's shadow copy).
"""

import asyncio
import json
import os
import socket
import sys
import time
from dataclasses import dataclass

import numpy as np

from .codec import choose_exponent, dequantize, quantize
from .model import Aggregator, AggregatorConfig
from .packets import build_frames, parse_header
from .pcap import write_frames
from .plan.cost import ScheduleError
from .plan.schedule_file import load_schedule_file
from .plan.topology import TopologyError, load_topology
from .protocol import (
    ELEMENT_BYTES,
    ELEMENT_DTYPE,
    FRAME_HEADER_BYTES,
    INWIRE_PORT,
    MAX_FANIN,
    RESULT_TRAILER_BYTES,
    STATUS_OVERFLOW,
    Opcode,
)
from .serve import PAYLOAD_OFFSET, ip_int, ip_str, parse_endpoint, parse_stats_reply, stats_request, wrap_datagram

GRADIENT_BOUND = 1.0
"""Seeded gradients lie in [-1, 1): every member knows this bound, so all pick the same exponent."""
LEARNING_RATE = 0.1
GROUP_PREFIX = ip_int("239.73.0.0")
"""Clique c of schedule round p multicasts to 239.73.p.c."""
DEFAULT_CHUNK = 256
DEFAULT_WINDOW = 4
DEFAULT_TIMEOUT_MS = 200
DEFAULT_RETRIES = 25
PROBE_TRIES = 3
PCAP_AGGREGATOR = AggregatorConfig()
"""A pcap capture is addressed to an aggregator with the gateware's default addresses."""


SIMULATORS = ("icarus", "verilator")
SIM_WIDTHS = ("8", "16", "32", "64")
SIM_DEFAULT_WIDTH = 64
"""The widest beat takes the fewest simulated cycles per frame."""


class StreamError(Exception):
    """The run cannot start; the message is one line for the user."""


@dataclass(frozen=True)
class Target:
    kind: str
    """'udp', 'pcap', 'sim' or 'iface'."""
    value: object
    text: str


def parse_simulator(text):
    """'SIMULATOR[:WIDTH]' as (simulator, data width in bytes)."""
    simulator, _, width = text.partition(":")
    if simulator not in SIMULATORS or (width and width not in SIM_WIDTHS):
        raise ValueError(f"sim:SIMULATOR[:WIDTH] takes a simulator among {', '.join(SIMULATORS)} and a width "
                         f"among {', '.join(SIM_WIDTHS)}")
    return simulator, int(width or SIM_DEFAULT_WIDTH)


def parse_target(text):
    kind, sep, rest = str(text).partition(":")
    if kind == "udp" and rest.startswith("//"):
        return Target("udp", parse_endpoint(rest[2:], "target"), text)
    if kind == "pcap" and sep and rest:
        return Target("pcap", rest, text)
    if kind == "sim" and sep:
        try:
            return Target("sim", parse_simulator(rest), text)
        except ValueError as error:
            raise StreamError(f"target {text!r}: {error}") from None
    if kind == "iface" and sep and rest:
        return Target("iface", rest, text)
    raise StreamError(f"target {text!r} is not one of udp://HOST:PORT, pcap:FILE, sim:icarus, sim:verilator, "
                      f"iface:NAME")


def load_plan(path):
    """The schedule file with its topology resolved, checked against what the stream can carry."""
    try:
        plan = load_schedule_file(path)
    except ScheduleError as error:
        raise StreamError(str(error)) from None
    name = plan.topology
    if not isinstance(name, str):
        raise StreamError(f"{path}: 'topology' must name the topology the schedule was made for")
    try:
        topology = load_topology(name)
    except (TopologyError, OSError, ValueError) as error:
        raise StreamError(f"{path}: {error}") from None
    for city in plan.islands + tuple(agg for cliques in plan.period for _, agg in cliques if agg is not None):
        if city not in topology.cities:
            raise StreamError(f"{path}: {city!r} is not a city of topology {topology.name!r}")
    if len(plan.period) > 256 or max(len(cliques) for cliques in plan.period) > 256:
        raise StreamError(f"{path}: more than 256 rounds in a period or cliques in a round")
    for cliques in plan.period:
        for members, _ in cliques:
            if len(members) > MAX_FANIN:
                raise StreamError(f"{path}: a clique of {len(members)} islands exceeds fan-in {MAX_FANIN}")
    return plan.with_topology(topology)


def clique_group(period_round, clique):
    return GROUP_PREFIX | (period_round << 8) | clique


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

    def __post_init__(self):
        if self.rounds <= 0:
            raise StreamError(f"--rounds must be positive, got {self.rounds}")
        if self.elements <= 0:
            raise StreamError(f"--elements must be positive, got {self.elements}")
        if not 0 <= self.loss < 1:
            raise StreamError(f"--loss must lie in [0, 1), got {self.loss}")
        if self.window <= 0:
            raise StreamError(f"--window must be positive, got {self.window}")
        if not self.timeout_ms > 0:
            raise StreamError(f"--timeout-ms must be positive, got {self.timeout_ms}")
        if not 1 <= self.chunk <= 482:
            raise StreamError(f"--chunk must lie in [1, 482] elements (a 2048-byte MTU), got {self.chunk}")
        if self.retries <= 0:
            raise StreamError(f"--retries must be positive, got {self.retries}")
        if not 0 <= self.job < 2**32:
            raise StreamError(f"--job must fit 32 bits, got {self.job}")


@dataclass(frozen=True)
class CliqueRound:
    round: int
    clique: int
    members: tuple
    aggregator: str
    group: int
    exponent: int


class Workload:
    """What every island can compute alone: cliques, exponents, seeded gradients and the sums to expect."""

    def __init__(self, plan, config):
        self.plan, self.config = plan, config
        self.index = {name: i for i, name in enumerate(plan.islands)}
        self.max_cliques = max(len(cliques) for cliques in plan.period)
        self.chunks = -(-config.elements // config.chunk)
        self._cache = {}

    @property
    def slots_needed(self):
        return 4 * self.max_cliques * self.config.window

    def clique_of(self, island, round_):
        period_round = round_ % len(self.plan.period)
        for c, (members, aggregator) in enumerate(self.plan.period[period_round]):
            if island in members:
                return CliqueRound(round_, c, members, aggregator, clique_group(period_round, c),
                                   choose_exponent(GRADIENT_BOUND, len(members)))
        return None

    def slot(self, round_, clique, chunk):
        window = self.config.window
        pool = (round_ % 2) * 2 + (chunk // window) % 2
        return pool * self.max_cliques * window + clique * window + chunk % window

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

    def payloads(self, island, clique):
        """UDP payloads of the island's contributions for the round, one per chunk, built in bulk."""
        config, q = self.config, self.contribution(island, clique)
        full = config.elements // config.chunk
        common = dict(opcode=Opcode.CONTRIBUTION, sender=clique.members.index(island), fanin=len(clique.members),
                      exponent=clique.exponent, job=config.job, round=clique.round, clique=clique.clique,
                      group=clique.group)
        payloads = []
        for first, count, rows in ((0, config.chunk, full), (full, config.elements - full * config.chunk, 1)):
            if rows == 0 or count == 0:
                continue
            chunks = np.arange(first, first + rows)
            frames = build_frames(q[first * config.chunk:(first + rows) * config.chunk].reshape(rows, count),
                                  chunk=chunks * config.chunk,
                                  slot=[self.slot(clique.round, clique.clique, int(j)) for j in chunks], **common)
            payloads.extend(bytes(row) for row in frames[:, PAYLOAD_OFFSET:])
        return payloads


@dataclass
class RoundTally:
    retransmits: int = 0
    dropped: int = 0
    wrong: int = 0
    checked: int = 0
    failure: str = None


class Island:
    """One island: its socket (through the transport), its round state and its model."""

    def __init__(self, name, workload, transport, loss_rng):
        self.name, self.workload, self.transport = name, workload, transport
        self.loss_rng = loss_rng
        self.model = np.zeros(workload.config.elements, dtype=np.float32)
        self.clique = None

    def transmit(self, payload, tally):
        if self.loss_rng.random() < self.workload.config.loss:
            tally.dropped += 1
            return
        self.transport.send(self.name, payload)

    async def run_round(self, round_, tally):
        config, workload = self.workload.config, self.workload
        clique = workload.clique_of(self.name, round_)
        if clique is None:
            return
        self.clique, self.tally = clique, tally
        self.transport.subscribe(self.name, clique.group)
        self.payloads = workload.payloads(self.name, clique)
        self.expected = workload.expected_sum(clique)
        self.sums = np.zeros(config.elements, dtype=np.int64)
        self.done = np.zeros(len(self.payloads), dtype=bool)
        self.deadline, self.tries, self.next = {}, {}, 0
        self.finished = asyncio.Event()
        loop = asyncio.get_running_loop()
        timeout = config.timeout_ms / 1000
        self._send_window(loop)
        try:
            while not self.done.all():
                try:
                    await asyncio.wait_for(self.finished.wait(), timeout / 4)
                except TimeoutError:
                    pass
                now = loop.time()
                for chunk, deadline in list(self.deadline.items()):
                    if now < deadline:
                        continue
                    if self.tries[chunk] > config.retries:
                        tally.failure = (f"round {round_}: {self.name} got no result for chunk {chunk} after "
                                         f"{config.retries} retransmissions")
                        return
                    self.tries[chunk] += 1
                    tally.retransmits += 1
                    self.deadline[chunk] = now + timeout
                    self.transmit(self.payloads[chunk], tally)
        finally:
            self.clique = None
            self.transport.unsubscribe(self.name, clique.group)
        average = dequantize(self.sums, clique.exponent, len(clique.members))
        self.model -= np.float32(LEARNING_RATE) * average

    def _send_window(self, loop):
        window = self.workload.config.window
        while self.next < len(self.payloads) and (self.next < window or self.done[self.next - window]):
            chunk = self.next
            self.next += 1
            self.tries[chunk] = 0
            self.deadline[chunk] = loop.time() + self.workload.config.timeout_ms / 1000
            self.transmit(self.payloads[chunk], self.tally)

    def on_result(self, payload):
        clique, config = self.clique, self.workload.config
        if clique is None or len(payload) < FRAME_HEADER_BYTES - PAYLOAD_OFFSET:
            return
        header = parse_header(bytes(PAYLOAD_OFFSET) + payload[:FRAME_HEADER_BYTES - PAYLOAD_OFFSET])
        if (int(header["job"]), int(header["round"]), int(header["clique"])) != (config.job, clique.round,
                                                                                  clique.clique):
            return
        offset, count = int(header["chunk"]), int(header["count"])
        chunk = offset // config.chunk
        if offset % config.chunk or chunk not in self.deadline:
            return
        body = FRAME_HEADER_BYTES - PAYLOAD_OFFSET
        if len(payload) != body + ELEMENT_BYTES * count + RESULT_TRAILER_BYTES:
            return
        elements = np.frombuffer(payload, dtype=ELEMENT_DTYPE, count=count, offset=body).astype(np.int64)
        status = int.from_bytes(payload[-RESULT_TRAILER_BYTES:], "big")
        fanin = len(clique.members)
        expected = self.expected[offset:offset + config.chunk]
        right = (count == len(expected) and int(header["exponent"]) == clique.exponent
                 and int(header["fanin"]) == fanin and int(header["bitmap"]) == (1 << fanin) - 1
                 and int(header["contributors"]) == fanin and not status & STATUS_OVERFLOW
                 and np.array_equal(elements, expected))
        self.tally.checked += 1
        if not right:
            self.tally.wrong += 1
        self.sums[offset:offset + len(elements[:len(expected)])] = elements[:len(expected)]
        del self.deadline[chunk]
        self.done[chunk] = True
        self._send_window(asyncio.get_running_loop())
        if self.done.all():
            self.finished.set()


class UdpTransport:
    """One UDP socket per island, each talking to its target address (a software aggregator, a board or
    a relay). With `multicast_iface`, each island also receives its clique's group on that interface."""

    def __init__(self, targets, sockets=None, multicast_iface=None, multicast_port=INWIRE_PORT):
        self.targets = dict(targets)
        self.sockets = dict(sockets or {})
        self.multicast_iface, self.multicast_port = multicast_iface, multicast_port
        self.endpoints, self.listeners = {}, {}
        self.send_errors = 0

    async def start(self, deliver):
        loop = asyncio.get_running_loop()
        for island in self.targets:
            sock = self.sockets.get(island)
            if sock is None:
                sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                sock.bind(("0.0.0.0", 0))
            sock.setblocking(False)
            self.endpoints[island], _ = await loop.create_datagram_endpoint(
                lambda island=island: _Receiver(island, deliver), sock=sock)
            if self.multicast_iface:
                listener = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                listener.bind(("0.0.0.0", self.multicast_port))
                listener.setblocking(False)
                self.listeners[island], _ = await loop.create_datagram_endpoint(
                    lambda island=island: _Receiver(island, deliver), sock=listener)

    def send(self, island, payload):
        try:
            self.endpoints[island].sendto(payload, self.targets[island])
        except OSError:
            self.send_errors += 1

    def _membership(self, island, group, option):
        listener = self.listeners.get(island)
        if listener is not None:
            request = socket.inet_aton(ip_str(group)) + socket.inet_aton(self.multicast_iface)
            listener.get_extra_info("socket").setsockopt(socket.IPPROTO_IP, option, request)

    def subscribe(self, island, group):
        self._membership(island, group, socket.IP_ADD_MEMBERSHIP)

    def unsubscribe(self, island, group):
        self._membership(island, group, socket.IP_DROP_MEMBERSHIP)

    async def stats(self, island, stats_future, timeout):
        return await probe_stats(self, island, stats_future, timeout)

    def close(self):
        for endpoint in (*self.endpoints.values(), *self.listeners.values()):
            endpoint.close()


async def probe_stats(transport, island, stats_future, timeout):
    """Counters of the target, asked from `island`; None when it never answers."""
    for _ in range(PROBE_TRIES):
        transport.send(island, stats_request())
        try:
            return await asyncio.wait_for(asyncio.shield(stats_future), timeout)
        except TimeoutError:
            continue
    return None


class _Receiver(asyncio.DatagramProtocol):
    def __init__(self, island, deliver):
        self.island, self.deliver = island, deliver

    def datagram_received(self, data, addr):
        self.deliver(self.island, data)

    def error_received(self, exc):
        """ICMP errors (port unreachable) on a UDP socket: the timeouts deal with the silence."""


class CaptureTransport:
    """`pcap:FILE` and `sim:SIMULATOR`: the frames the islands send, with the gateware's default addresses,
    go to an in-process aggregator whose results come back to the islands, so the run makes the same checks.

    For `pcap:` the aggregator is the golden model and the frames are also written to a capture, which
    replays on any aggregator with those addresses and enough slots. For `sim:` it is the gateware itself,
    in co-simulation (`inwire_hdl.cosim`), built with the slots the run needs."""

    def __init__(self, path, islands, slots, max_elements, make_aggregator=Aggregator):
        self.path = path
        self.addresses = {island: (ip_str(ip_int("10.73.1.0") + i + 1), INWIRE_PORT)
                          for i, island in enumerate(islands)}
        self.config = AggregatorConfig(mac=PCAP_AGGREGATOR.mac, ip=PCAP_AGGREGATOR.ip,
                                       slots=max(PCAP_AGGREGATOR.slots, slots),
                                       max_elements=max(PCAP_AGGREGATOR.max_elements, max_elements))
        self.model = make_aggregator(self.config)
        self.frames = []
        self.send_errors = 0

    async def start(self, deliver):
        self.deliver, self.loop = deliver, asyncio.get_running_loop()

    def send(self, island, payload):
        index = list(self.addresses).index(island)
        frame = wrap_datagram(payload, self.addresses[island], (ip_str(self.config.ip), self.config.port),
                              self.config.mac.to_bytes(6, "big"), (0x02_49_57_01_00_00 + index).to_bytes(6, "big"))
        self.frames.append(frame)
        for output in self.model.process(frame):
            # The result is multicast: every island sees it and keeps what belongs to its clique.
            for receiver in self.addresses:
                self.loop.call_soon(self.deliver, receiver, output[PAYLOAD_OFFSET:])

    def subscribe(self, island, group):
        """Delivery reaches every island already."""

    unsubscribe = subscribe

    async def stats(self, island, stats_future, timeout):
        return self.model.stats()

    def close(self):
        if hasattr(self.model, "close"):
            self.model.close()
        if self.path is not None:
            write_frames(self.path, self.frames)


async def stream_async(plan, config, transport, progress=lambda _round: None):
    """`run_stream` inside a running event loop."""
    workload = Workload(plan, config)
    islands = {name: Island(name, workload, transport, np.random.default_rng([config.seed, i, 0x10557]))
               for i, name in enumerate(plan.islands)}
    stats_future = None

    def deliver(island, payload):
        nonlocal stats_future
        if len(payload) < 4:
            return
        opcode = payload[3]
        if opcode == Opcode.RESULT:
            islands[island].on_result(payload)
        elif opcode == Opcode.STATS_REPLY and stats_future is not None and not stats_future.done():
            counters = parse_stats_reply(payload)
            if counters is not None:
                stats_future.set_result(counters)

    async def ask_stats():
        nonlocal stats_future
        stats_future = asyncio.get_running_loop().create_future()
        probe_timeout = max(config.timeout_ms / 1000, 0.3)
        return await transport.stats(plan.islands[0], stats_future, probe_timeout)

    await transport.start(deliver)
    try:
        before = await ask_stats()
        if before is None:
            raise StreamError("no answer from the target: it did not reply to a stats request")
        reports, start = [], time.perf_counter()
        for round_ in range(config.rounds):
            workload.forget_before(round_)
            tally = RoundTally()
            begun = time.perf_counter()
            await asyncio.gather(*(island.run_round(round_, tally) for island in islands.values()))
            elapsed = time.perf_counter() - begun
            members = sum(len(m) for m, _ in plan.cliques(round_))
            gradient_bytes = members * config.elements * ELEMENT_BYTES
            reports.append({"round": round_, "cliques": len(plan.cliques(round_)), "time_ms": elapsed * 1e3,
                            "gradient_bytes": gradient_bytes, "goodput_bytes_per_s": gradient_bytes / elapsed,
                            "retransmits": tally.retransmits, "dropped": tally.dropped,
                            "results_checked": tally.checked, "wrong": tally.wrong,
                            "finished": tally.failure is None, **({"failure": tally.failure} if tally.failure else {})})
            progress(round_)
            if tally.failure:
                break
        total_s = time.perf_counter() - start
        after = await ask_stats()
    finally:
        transport.close()
    aggregator = None if after is None else {k: after[k] - before.get(k, 0) for k in after}
    finished = len(reports) == config.rounds and all(r["finished"] for r in reports)
    wrong = sum(r["wrong"] for r in reports)
    models = np.stack([island.model for island in islands.values()])
    return {
        "islands": list(plan.islands), "rounds": reports, "elements": config.elements, "chunk": config.chunk,
        "window": config.window, "loss": config.loss, "seed": config.seed, "job": config.job,
        "slots_needed": workload.slots_needed, "time_s": total_s,
        "gradient_bytes": sum(r["gradient_bytes"] for r in reports),
        "goodput_bytes_per_s": sum(r["gradient_bytes"] for r in reports) / total_s if total_s else 0.0,
        "retransmits": sum(r["retransmits"] for r in reports), "dropped": sum(r["dropped"] for r in reports),
        "results_checked": sum(r["results_checked"] for r in reports), "wrong_results": wrong,
        "finished": finished, "bit_exact": finished and wrong == 0,
        "model_spread": float(np.max(models.max(axis=0) - models.min(axis=0))),
        "aggregator": aggregator,
    }


def run_stream(plan, config, transport, progress=None):
    """Run the islands over `transport`; returns the report dict (see docs/host.md)."""
    return asyncio.run(stream_async(plan, config, transport, progress or (lambda _round: None)))


def make_transport(target, plan, workload_slots, config):
    if target.kind == "udp":
        return UdpTransport({island: target.value for island in plan.islands})
    if target.kind == "iface":
        from .iface import IfaceTransport

        return IfaceTransport(target.value, plan.islands)
    if target.kind == "sim":
        from inwire_hdl.cosim import CoSimulation

        simulator, width = target.value
        return CaptureTransport(None, plan.islands, workload_slots, config.chunk,
                                make_aggregator=lambda aggregator: CoSimulation(simulator, width, aggregator))
    return CaptureTransport(target.value, plan.islands, workload_slots, config.chunk)


def format_report(report, target_text):
    lines = [f"{'round':>5} {'cliques':>7} {'time ms':>9} {'goodput MB/s':>13} {'retransmits':>11} "
             f"{'dropped':>7} {'checked':>7} {'wrong':>5}"]
    for r in report["rounds"]:
        lines.append(f"{r['round']:>5} {r['cliques']:>7} {r['time_ms']:>9.2f} {r['goodput_bytes_per_s'] / 1e6:>13.2f} "
                     f"{r['retransmits']:>11} {r['dropped']:>7} {r['results_checked']:>7} {r['wrong']:>5}"
                     + ("" if r["finished"] else f"  UNFINISHED: {r['failure']}"))
    aggregator = report["aggregator"]
    drops = "-" if aggregator is None else sum(v for k, v in aggregator.items() if k.startswith("drop_"))
    lines.append(f"target {target_text}: {len(report['islands'])} islands, {report['elements']} elements, "
                 f"{len(report['rounds'])} rounds in {report['time_s']:.3f} s, goodput "
                 f"{report['goodput_bytes_per_s'] / 1e6:.2f} MB/s, {report['retransmits']} retransmits, "
                 f"{report['dropped']} dropped on purpose, aggregator drops {drops}")
    lines.append(f"bit_exact: {'true' if report['bit_exact'] else 'false'} ({report['results_checked']} results "
                 f"checked, {report['wrong_results']} wrong)")
    return "\n".join(lines)


def _progress_bar(total):
    """A progress bar on a terminal; nothing otherwise."""
    if not sys.stderr.isatty():
        return (lambda _round: None), (lambda: None)
    from tqdm import tqdm
    bar = tqdm(total=total, unit="round", file=sys.stderr, leave=False)
    return (lambda _round: bar.update(1)), bar.close


def run(args):
    """`inwire stream`: exit 0 when every round finished bit-exact, 1 otherwise."""
    target = parse_target(args.target)
    plan = load_plan(args.schedule)
    reproducible = target.kind in ("pcap", "sim")
    job = args.job if args.job is not None else (1 if reproducible else int.from_bytes(os.urandom(4), "big"))
    config = StreamConfig(rounds=args.rounds, elements=args.elements, seed=args.seed, loss=args.loss,
                          window=args.window, timeout_ms=args.timeout_ms, chunk=args.chunk, retries=args.retries,
                          job=job)
    workload = Workload(plan, config)
    transport = make_transport(target, plan, workload.slots_needed, config)
    update, close = _progress_bar(config.rounds)
    try:
        report = run_stream(plan, config, transport, update)
    finally:
        close()
    report["target"] = target.text
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        print(format_report(report, target.text))
    if not report["finished"]:
        failure = next(r["failure"] for r in report["rounds"] if not r["finished"]) if any(
            not r["finished"] for r in report["rounds"]) else "not every round ran"
        print(f"inwire stream: {failure}", file=sys.stderr)
    return 0 if report["bit_exact"] else 1
