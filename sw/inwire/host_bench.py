"""The `host` benchmark: software aggregator goodput against the machine's UDP ceiling, against gloo, and
the numpy packet path against scapy.

Every figure records the 1-minute load average before and after it, and the CPU that other programs used
meanwhile (`foreign_cpu_cores`: the machine's busy time less this benchmark's own processes', per second),
and is flagged `loaded` when other programs kept more than FOREIGN_LIMIT cores busy: a loaded machine
shrinks the ceiling (iperf3's single stream) and gloo more than inwire. The load average cannot tell: the
benchmark's own islands, service and references raise it above 1.5 on 2 cores, and it trails each figure
by a minute.

Goodput: k islands (one clique of k, k = 2, 3, 9) on loopback stream a vector through `inwire serve` (a
separate process, unicast results); gradient bytes contributed per second. Gradients and their datagrams
are made before each round's clock starts. Ceiling: iperf3 UDP on loopback, same datagram size, unlimited
rate; received payload bytes per second. The machine is shared and noisy, so each repetition measures the
ceiling and then every variant right after it, and the ratios are taken within the repetition; min and
median over the repetitions are reported. Variants: the fast path with its compiled kernel (when built)
and the golden model (`serve --golden`, fewer elements: it is two orders slower).
gloo: the same element count per process summed by `torch.distributed` gloo `all_reduce` among k
processes; `gloo_ratio` = inwire's time for a round / gloo's all_reduce time.
"""

import json
import multiprocessing
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

from .datagram import PAYLOAD_HEADER_BYTES
from .kernel import compiled
from .protocol import INWIRE_PORT, JUMBO_ELEMENTS_PER_FRAME, Opcode
from .stream import DEFAULT_CHUNK, StreamConfig, load_plan, run_stream
from .transport import UdpTransport

ELEMENTS = 1 << 19
"""Per island, per round: 2 MiB of gradient."""
GOLDEN_ELEMENTS = 1 << 15
ROUNDS = 2
WINDOW = 64
"""Chunks in flight per island: 4 x 64 = 256 slots, the service's default; measured better than 16, 32 and 128
at 2 islands."""
ISLANDS = (2, 3, 9)
REPETITIONS = 3
CITIES = ("LON", "FRA", "AMS", "NYC", "LAX", "SIN", "TYO", "SEO", "BAR")
IPERF_SECONDS = 2
GLOO_REPETITIONS = 5
NUMPY_FRAMES = 4096
SCAPY_FRAMES = 400
FOREIGN_LIMIT = 0.25
"""Above this many cores busy with other programs during a figure, it is flagged `loaded`."""


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _plan(islands):
    with tempfile.TemporaryDirectory() as scratch:
        path = os.path.join(scratch, "schedule.json")
        with open(path, "w") as handle:
            json.dump({"topology": "doublezero9", "islands": list(CITIES[:islands]),
                       "rounds": [{"cliques": [{"members": list(CITIES[:islands]), "aggregator": "AMS"}]}]}, handle)
        return load_plan(path)


def variants():
    """(name, `inwire serve` options, elements per island) of the aggregators measured: the fast path where
    the compiled kernel is built (the islands then use its batched I/O too), and the golden model."""
    chosen = [("fast_c", [], ELEMENTS)] if compiled is not None else []
    return chosen + [("golden", ["--golden"], GOLDEN_ELEMENTS)]


def aggregator_goodput(islands=2, serve_options=(), elements=ELEMENTS, chunk=DEFAULT_CHUNK, window=WINDOW,
                       rounds=ROUNDS):
    """k islands through `inwire serve` in its own process: goodput, round time, retransmits."""
    port = free_port()
    environment = {**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(os.path.abspath(__file__)))}
    service = subprocess.Popen([sys.executable, "-m", "inwire", "serve", "--listen", f"127.0.0.1:{port}", "--unicast",
                                "--max-elements", str(chunk), "--unregistered", *serve_options],
                               stderr=subprocess.PIPE, text=True, env=environment)
    try:
        if "listening on" not in service.stderr.readline():
            raise RuntimeError("inwire serve did not start")
        plan = _plan(islands)
        config = StreamConfig(rounds=rounds, elements=elements, chunk=chunk, window=window, timeout_ms=500,
                              job=int.from_bytes(os.urandom(4), "big"))
        batch_io = compiled is not None and "--golden" not in serve_options
        report = run_stream(plan, config, UdpTransport({island: ("127.0.0.1", port) for island in plan.islands},
                                                       window=window, chunk=chunk, batch_io=batch_io))
    finally:
        service.terminate()
        service.communicate(timeout=10)
    if not report["bit_exact"]:
        raise RuntimeError("benchmark run was not bit-exact")
    return {"goodput_bytes_per_s": report["goodput_bytes_per_s"], "retransmits": report["retransmits"],
            "round_s": report["time_s"] / rounds}


def udp_ceiling(datagram_bytes, seconds=IPERF_SECONDS):
    """iperf3 UDP on loopback at unlimited rate: payload bytes per second that arrived."""
    if shutil.which("iperf3") is None:
        return None
    port = str(free_port())
    server = subprocess.Popen(["iperf3", "-s", "-1", "-p", port], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        time.sleep(0.5)
        client = subprocess.run(["iperf3", "-c", "127.0.0.1", "-p", port, "-u", "-b", "0", "-l", str(datagram_bytes),
                                 "-t", str(seconds), "-J"], capture_output=True, text=True, timeout=seconds + 30)
        result = json.loads(client.stdout)["end"]["sum"]
    finally:
        server.kill()
        server.wait()
    return result["bits_per_second"] / 8 * (1 - result["lost_percent"] / 100)


def packet_rates(chunk=DEFAULT_CHUNK):
    from scapy.config import conf
    from scapy.layers.inet import IP, UDP
    from scapy.layers.l2 import Ether

    from .layers import Inwire
    from .packets import build_frames, parse_frames

    rng = np.random.default_rng(0)
    values = rng.integers(-2**20, 2**20, (NUMPY_FRAMES, chunk), dtype=np.int32)
    fields = dict(opcode=Opcode.CONTRIBUTION, fanin=4, sender=1, job=1, round=2, clique=0, group=0xEF490001,
                  slot=np.arange(NUMPY_FRAMES) % 64, chunk=np.arange(NUMPY_FRAMES) * chunk)
    started = time.perf_counter()
    frames = build_frames(values, **fields)
    numpy_build = NUMPY_FRAMES / (time.perf_counter() - started)
    started = time.perf_counter()
    headers, elements = parse_frames(frames)
    numpy_parse = NUMPY_FRAMES / (time.perf_counter() - started)
    assert np.array_equal(elements, values) and headers["chunk"][-1] == (NUMPY_FRAMES - 1) * chunk

    started = time.perf_counter()
    udp = UDP(sport=INWIRE_PORT, dport=INWIRE_PORT)
    built = [bytes(Ether(dst="02:49:57:00:00:01") / IP(dst="10.73.87.1", flags="DF") / udp /
                   Inwire(opcode="contribution", fanin=4, sender=1, job=1, round=2, slot=i % 64, chunk=i * chunk,
                          group="239.73.0.1", elements=values[i].tolist())) for i in range(SCAPY_FRAMES)]
    scapy_build = SCAPY_FRAMES / (time.perf_counter() - started)
    # scapy refuses lists longer than conf.max_list_count (100) while dissecting, unless told otherwise.
    conf.max_list_count = max(conf.max_list_count, chunk)
    started = time.perf_counter()
    parsed = [Ether(frame)[Inwire] for frame in built]
    checks = [(packet.chunk, packet.elements[-1]) for packet in parsed]
    scapy_parse = SCAPY_FRAMES / (time.perf_counter() - started)
    assert checks[-1] == ((SCAPY_FRAMES - 1) * chunk, int(values[SCAPY_FRAMES - 1, -1]))
    return {"elements_per_frame": chunk,
            "numpy_build_per_s": numpy_build, "scapy_build_per_s": scapy_build,
            "build_ratio": numpy_build / scapy_build,
            "numpy_parse_per_s": numpy_parse, "scapy_parse_per_s": scapy_parse,
            "parse_ratio": numpy_parse / scapy_parse}


def _gloo_worker(rank, world, port, elements, repetitions, times, dtype):
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    rng = np.random.default_rng(rank)
    values = (rng.integers(-2**20, 2**20, elements, dtype=np.int32) if dtype == "int32"
              else rng.standard_normal(elements).astype(np.float32))
    tensor = torch.from_numpy(values)
    dist.all_reduce(tensor.clone())  # warm-up: connections and buffers
    spans = []
    for _ in range(repetitions):
        work = tensor.clone()
        dist.barrier()
        started = time.perf_counter()
        dist.all_reduce(work)
        if dtype == "float32":
            work.div_(world)  # an average, as islands end an averaging with
        spans.append(time.perf_counter() - started)
    dist.barrier()
    if rank == 0:
        times.put(spans)
    dist.destroy_process_group()


def gloo_all_reduce_s(islands, elements=ELEMENTS, repetitions=GLOO_REPETITIONS):
    """Median time of a gloo all_reduce of `elements` int32 among `islands` processes; None without torch."""
    spans = gloo_all_reduce_spans(islands, elements, repetitions)
    return None if spans is None else statistics.median(spans)


def gloo_all_reduce_spans(islands, elements, repetitions, dtype="int32"):
    """Times of `repetitions` gloo all_reduce calls of `elements` values (int32 sums, or float32 averages)
    among `islands` processes, after a warm-up; None without torch."""
    try:
        import torch.distributed as dist
    except ImportError:
        return None
    if not dist.is_available() or not dist.is_gloo_available():
        return None
    context = multiprocessing.get_context("spawn")
    times, port = context.Queue(), free_port()
    workers = [context.Process(target=_gloo_worker, args=(rank, islands, port, elements, repetitions, times, dtype))
               for rank in range(islands)]
    for worker in workers:
        worker.start()
    try:
        return times.get(timeout=600)
    finally:
        for worker in workers:
            worker.join(timeout=60)


def _summary(values):
    return {"min": min(values), "median": statistics.median(values), "max": max(values)}


def load_average():
    return round(os.getloadavg()[0], 2)


def _machine_busy_s():
    """CPU seconds every core spent busy since boot (/proc/stat: all but idle and iowait)."""
    with open("/proc/stat") as handle:
        jiffies = [int(field) for field in handle.readline().split()[1:9]]
    return (sum(jiffies) - jiffies[3] - jiffies[4]) / os.sysconf("SC_CLK_TCK")


def _own_cpu_s():
    """CPU seconds of this process and of its children that have been waited for (the islands, the
    service, iperf3 and gloo's ranks all are before a figure ends); loopback's kernel work is charged to
    the processes that cause it."""
    times = os.times()
    return times.user + times.system + times.children_user + times.children_system


class MachineLoad:
    """What else the machine did while a figure was measured: `with MachineLoad() as load: ...`, then
    `load.record(entry)` adds the load averages, the cores other programs kept busy, and the `loaded`
    flag."""

    def __enter__(self):
        self.load_before = load_average()
        self.busy, self.own, self.started = _machine_busy_s(), _own_cpu_s(), time.monotonic()
        return self

    def __exit__(self, *exc):
        elapsed = max(time.monotonic() - self.started, 1e-9)
        foreign = (_machine_busy_s() - self.busy) - (_own_cpu_s() - self.own)
        self.foreign_cores = round(max(foreign, 0.0) / elapsed, 3)
        self.load_after = load_average()

    def record(self, entry):
        entry["load_average_1min"] = {"before": self.load_before, "after": self.load_after}
        entry["foreign_cpu_cores"] = self.foreign_cores
        entry["loaded"] = self.foreign_cores > FOREIGN_LIMIT
        return entry


def clique_figures(islands, repetitions=REPETITIONS):
    """Interleaved ceiling and goodput of every variant for one clique size."""
    with MachineLoad() as load:
        figures = _clique_figures(islands, repetitions)
    return load.record(figures)


def _clique_figures(islands, repetitions):
    chunk = DEFAULT_CHUNK
    datagram = PAYLOAD_HEADER_BYTES + 4 * chunk
    measured = {name: [] for name, _, _ in variants()}
    ceilings = []
    for _ in range(repetitions):
        ceiling = udp_ceiling(datagram)
        ceilings.append(ceiling)
        for name, options, elements in variants():
            run = aggregator_goodput(islands, options, elements, chunk)
            run["ratio"] = None if ceiling is None else run["goodput_bytes_per_s"] / ceiling
            measured[name].append(run)
    figures = {"islands": islands, "datagram_bytes": datagram, "udp_ceiling_bytes_per_s": ceilings}
    for name, runs in measured.items():
        figures[name] = {
            "elements": dict((n, e) for n, _, e in variants())[name],
            "goodput_bytes_per_s": [run["goodput_bytes_per_s"] for run in runs],
            "retransmits": [run["retransmits"] for run in runs],
            "round_s": [run["round_s"] for run in runs],
            **({"ratio": _summary([run["ratio"] for run in runs])} if ceilings[0] is not None else {}),
        }
    fastest = variants()[0][0]
    gloo = gloo_all_reduce_s(islands)
    inwire_round = statistics.median(figures[fastest]["round_s"])
    figures["gloo"] = {"all_reduce_s": gloo, "inwire_round_s": inwire_round, "inwire_variant": fastest,
                       "elements": ELEMENTS}
    figures["gloo_ratio"] = None if gloo is None else inwire_round / gloo
    return figures


def jumbo_figures(islands=2, chunk=JUMBO_ELEMENTS_PER_FRAME, repetitions=REPETITIONS):
    """The fastest variant with 8 KiB of elements per datagram (loopback takes them; a network needs jumbo
    frames), against iperf3 at the same datagram size."""
    with MachineLoad() as load:
        figures = _jumbo_figures(islands, chunk, repetitions)
    return load.record(figures)


def _jumbo_figures(islands, chunk, repetitions):
    datagram = PAYLOAD_HEADER_BYTES + 4 * chunk
    name, options, elements = variants()[0]
    ratios, goodputs, retransmits = [], [], []
    for _ in range(repetitions):
        ceiling = udp_ceiling(datagram)
        run = aggregator_goodput(islands, options, elements, chunk)
        goodputs.append(run["goodput_bytes_per_s"])
        retransmits.append(run["retransmits"])
        if ceiling is not None:
            ratios.append(run["goodput_bytes_per_s"] / ceiling)
    return {"islands": islands, "chunk": chunk, "datagram_bytes": datagram, "variant": name,
            "goodput_bytes_per_s": goodputs, "retransmits": retransmits,
            **({"ratio": _summary(ratios)} if ratios else {})}


def run():
    """The `host` key of bench/results.json."""
    return {
        "software_aggregator": {
            "ceiling_tool": "iperf3 -u -b 0 on loopback" if shutil.which("iperf3") else "iperf3 not installed",
            "chunk": DEFAULT_CHUNK, "window": WINDOW, "rounds": ROUNDS, "repetitions": REPETITIONS,
            "compiled_kernel": compiled is not None,
            "cliques": {str(k): clique_figures(k) for k in ISLANDS},
            "jumbo": jumbo_figures(),
        },
        "packets": packet_rates(),
    }


if __name__ == "__main__":
    print(json.dumps(run(), indent=1))
