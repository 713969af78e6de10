"""The `training` benchmark: averaging a model through inwire against gloo, on loopback, in one run.

- `averaging`: 3 islands, each its own process, average a 100 MB float32 vector (25 M elements) through
  `inwire serve` (its own process, the fast path, unicast, jumbo datagrams of 2048 elements, which loopback
  carries) with `InwireExchange`; against gloo `all_reduce` of the same float32 tensor among 3 processes,
  measured right after, repetition by repetition. Time of an averaging: from a barrier of the islands to the
  last island holding the average. The ratio is inwire's median over gloo's median.
- `loss`: the same averaging with 1 % of the islands' datagrams dropped on purpose; goodput relative to the
  lossless runs of the same benchmark.
- `ddp_hook`: one training step of a 25 M-parameter MLP on 3 islands of 2 ranks each, through `inwire_hook`
  (each island its own gloo DDP job, its buckets summed across islands through `inwire serve`) against
  plain DDP on one 6-rank gloo group of the same processes; medians of the slowest rank's step after a
  warm-up step.

- `cpu_by_part`: where the averaging's CPU goes, each part timed alone (`where_the_time_goes`).
- `memory`: the resident memory one model averaging takes per island, against the model's bytes
  (`averaging_memory`): 3 islands, each its own process, average a 50 M-parameter model (200 MB of float32)
  with `CliqueAverager` through `inwire serve`, twice (the second averaging also holds what the averager
  keeps from the first).

Each entry records the CPU seconds the islands spent in their averagings and the service from listening to
the islands' end, the 1-minute load average before and after, and the cores other programs kept busy
meanwhile (`host_bench.MachineLoad`): on a loaded machine the references (gloo, the kernel's UDP) are starved more
than inwire, so a ratio flagged `loaded` should not be quoted as the machine's.
"""

import multiprocessing
import os
import re
import statistics
import subprocess
import sys
import time
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Barrier
from typing import Any

import numpy as np

from ..host_bench import MachineLoad, free_port, gloo_all_reduce_spans
from ..protocol import JUMBO_ELEMENTS_PER_FRAME

ELEMENTS = 25_000_000
ISLANDS = 3
REPETITIONS = 3
LOSS = 0.01
WINDOW = 32
CHUNK = JUMBO_ELEMENTS_PER_FRAME
DDP_HIDDEN = 333_333
"""Hidden units of the hook's MLP (64 -> hidden -> 10): 75 x hidden + 10 = 25 M parameters."""
MEMORY_WIDTH = 5000
"""The memory benchmark's model: two Linear(5000, 5000) layers, 50,010,000 float32 parameters (200 MB)."""
MEMORY_AVERAGINGS = 2
DDP_STEPS = 4
DDP_RANKS = 2
"""Ranks per island of the hook's run (ISLANDS x DDP_RANKS processes either way)."""


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far (Linux /proc)."""
    with open(f"/proc/{pid}/stat") as handle:
        fields = handle.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _island(index: int, address: tuple[str, int], barrier: Barrier, results: "Queue[tuple[int, float, int, float]]",
            loss: float, seed: int, elements: int) -> None:
    from .averaging import InwireExchange

    vector = np.random.default_rng([seed, index]).standard_normal(elements).astype(np.float32)
    exchange = InwireExchange(address, job=seed + 1, chunk=CHUNK, window=WINDOW, deadline_s=300, loss=loss,
                              seed=seed * 10 + index)
    try:
        barrier.wait(timeout=120)
        started, cpu = time.perf_counter(), time.process_time()
        exchange.average(0, 0, [f"i{k}" for k in range(ISLANDS)], index, vector)
        elapsed = time.perf_counter() - started
        # The averaging's CPU only: not the interpreter's start, torch's import or the vector's making.
        results.put((index, elapsed, exchange.client.retransmits, time.process_time() - cpu))
    finally:
        exchange.close()


def _serve(port: int) -> "subprocess.Popen[str]":
    environment = {**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))))}
    service = subprocess.Popen([sys.executable, "-m", "inwire", "serve", "--listen", f"127.0.0.1:{port}", "--unicast",
                                "--max-elements", str(CHUNK), "--receive-buffer", str(64 << 20), "--unregistered"],
                               stderr=subprocess.PIPE, text=True, env=environment)
    assert service.stderr is not None, "opened as a pipe"
    line = service.stderr.readline()
    if "listening on" not in line:
        service.kill()
        raise RuntimeError(f"inwire serve did not start: {line.strip()}")
    return service


def inwire_averaging(loss: float = 0.0, seed: int = 0, elements: int = ELEMENTS) -> dict[str, Any]:
    """One averaging of `elements` float32 per island through a fresh `inwire serve`: (seconds, retransmits,
    islands' CPU seconds, service's CPU seconds)."""
    context = multiprocessing.get_context("spawn")
    port = free_port()
    service = _serve(port)
    try:
        service_cpu = -_cpu_s(service.pid)  # from listening on: not the interpreter's start and imports
        barrier, results = context.Barrier(ISLANDS), context.Queue()
        workers = [context.Process(target=_island, args=(i, ("127.0.0.1", port), barrier, results, loss, seed,
                                                         elements)) for i in range(ISLANDS)]
        for worker in workers:
            worker.start()
        outcomes = [results.get(timeout=600) for _ in workers]
        for worker in workers:
            worker.join(timeout=60)
        service_cpu += _cpu_s(service.pid)
    finally:
        service.terminate()
        rest = service.communicate(timeout=30)[1]
    kernel = re.search(r"kernel_drops=(\d+)", rest)
    return {"seconds": max(o[1] for o in outcomes), "retransmits": sum(o[2] for o in outcomes),
            "islands_cpu_s": round(sum(o[3] for o in outcomes), 2), "service_cpu_s": round(service_cpu, 2),
            "service_kernel_drops": int(kernel.group(1)) if kernel else None}


def _resident_kib() -> tuple[int, int]:
    """(VmRSS, VmHWM) of this process in KiB (Linux /proc)."""
    with open("/proc/self/status") as handle:
        fields = dict(line.split(":", 1) for line in handle)
    return int(fields["VmRSS"].split()[0]), int(fields["VmHWM"].split()[0])


def _reset_peak() -> None:
    """Start VmHWM over from the current resident size (Linux 4.0 on: clear_refs 5)."""
    with open("/proc/self/clear_refs", "w") as handle:
        handle.write("5")


def _memory_island(index: int, address: tuple[str, int], barrier: Barrier,
                   results: "Queue[tuple[int, int, list[int]]]") -> None:
    """One island of `averaging_memory`: its model's bytes and each averaging's peak resident growth over
    the process before its first averaging (torch, the model, the exchange and the averager made)."""
    import torch

    from .averaging import CliqueAverager, InwireExchange

    torch.set_num_threads(1)
    torch.manual_seed(index)
    model = torch.nn.Sequential(*(torch.nn.Linear(MEMORY_WIDTH, MEMORY_WIDTH) for _ in range(2)))
    model_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    exchange = InwireExchange(address, job=9, chunk=CHUNK, window=WINDOW, deadline_s=300)
    averager = CliqueAverager(1, island=f"i{index}", schedule=[[([f"i{k}" for k in range(ISLANDS)], None)]],
                              exchange=exchange)
    try:
        baseline, _ = _resident_kib()
        peaks = []
        for _ in range(MEMORY_AVERAGINGS):
            barrier.wait(timeout=120)
            _reset_peak()
            averager.average_parameters(model.parameters())
            peaks.append(1024 * (_resident_kib()[1] - baseline))
        results.put((index, model_bytes, peaks))
    finally:
        exchange.close()


def _run_processes(context: Any, target: Any, arguments: list[tuple], results: Any) -> list[Any]:
    """Start one process of `target` per argument tuple; what each put on `results`, once all have."""
    workers = [context.Process(target=target, args=args) for args in arguments]
    for worker in workers:
        worker.start()
    outcomes = [results.get(timeout=900) for _ in workers]
    for worker in workers:
        worker.join(timeout=60)
    return outcomes


def averaging_memory() -> dict[str, Any]:
    """Peak resident memory of one model averaging per island, against the model's bytes.

    Each island is its own process, so that its resident size is its own: its baseline is the process just
    before its first averaging (torch imported, the model built, exchange and averager made), and each
    averaging's peak is VmHWM (/proc/self/status) after the averaging less that baseline, VmHWM having been
    reset (clear_refs) just before it. VmHWM rather than getrusage's ru_maxrss: ru_maxrss cannot be reset,
    so it would also hold the peaks of torch's import and the model's initialization. What the averager keeps
    between averagings (its anchor) counts, since it is memory the averaging costs the island; the second
    averaging's peak shows it."""
    context = multiprocessing.get_context("spawn")
    port = free_port()
    service = _serve(port)
    try:
        barrier, results = context.Barrier(ISLANDS), context.Queue()
        outcomes = sorted(_run_processes(context, _memory_island, [(i, ("127.0.0.1", port), barrier, results)
                                                                   for i in range(ISLANDS)], results))
    finally:
        service.terminate()
        service.communicate(timeout=30)
    model_bytes = outcomes[0][1]
    peak = max(max(peaks) for _, _, peaks in outcomes)
    return {"islands": ISLANDS, "parameters": model_bytes // 4, "model_bytes": model_bytes,
            "averagings": MEMORY_AVERAGINGS, "peak_bytes_by_island": [peaks for _, _, peaks in outcomes],
            "averaging_peak_bytes": peak, "averaging_peak_ratio": round(peak / model_bytes, 3)}


def _ddp_worker(process: int, port: int, folder: str, use_hook: bool, steps: int,
                results: "Queue[tuple[int, list[float]]]") -> None:
    """One of the ISLANDS x DDP_RANKS processes: with the hook, rank `process % DDP_RANKS` of island
    `process // DDP_RANKS` (its own gloo group; rank 0 talks to inwire); else rank `process` of one group."""
    import torch
    import torch.distributed as dist

    from .averaging import InwireExchange
    from .ddp import InwireHookState, inwire_hook

    torch.set_num_threads(1)
    island, rank = divmod(process, DDP_RANKS)
    if use_hook:
        store = dist.FileStore(os.path.join(folder, f"island{island}.store"), DDP_RANKS)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=DDP_RANKS)
    else:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=process,
                                world_size=ISLANDS * DDP_RANKS)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, DDP_HIDDEN), torch.nn.ReLU(), torch.nn.Linear(DDP_HIDDEN, 10))
    replica = torch.nn.parallel.DistributedDataParallel(model)
    exchange = None
    if use_hook:
        if rank == 0:
            # 4 pools x 8 buckets x a window of 8 = the service's 256 slots (DDP makes 5 buckets of this model).
            exchange = InwireExchange(("127.0.0.1", port), job=7, chunk=CHUNK, window=8, deadline_s=300)
        replica.register_comm_hook(InwireHookState(exchange, f"i{island}", [f"i{k}" for k in range(ISLANDS)],
                                                   buckets=8), inwire_hook)
    optimizer = torch.optim.SGD(replica.parameters(), lr=0.01)
    generator = torch.Generator().manual_seed(process)
    spans: list[float] = []
    for _ in range(steps + 1):
        inputs, labels = torch.randn(32, 64, generator=generator), torch.randint(10, (32,), generator=generator)
        started = time.perf_counter()
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(replica(inputs), labels).backward()
        optimizer.step()
        spans.append(time.perf_counter() - started)
    if exchange is not None:
        exchange.close()
    results.put((process, spans[1:]))
    dist.destroy_process_group()


def ddp_step_s(use_hook: bool, steps: int = DDP_STEPS) -> float:
    """Median step time (the slowest rank's) of the 25 M-parameter MLP on ISLANDS x DDP_RANKS processes,
    through the hook or plain gloo DDP."""
    import tempfile

    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    port = free_port()
    service = _serve(port) if use_hook else None
    try:
        with tempfile.TemporaryDirectory() as folder:
            spans = dict(_run_processes(context, _ddp_worker, [(process, port, folder, use_hook, steps, results)
                                                               for process in range(ISLANDS * DDP_RANKS)], results))
    finally:
        if service is not None:
            service.terminate()
            service.communicate(timeout=30)
    return statistics.median(max(spans[process][step] for process in spans) for step in range(steps))


def where_the_time_goes(elements: int = ELEMENTS, sample: int = ELEMENTS // 8) -> dict[str, Any]:
    """CPU seconds of one averaging's parts, each measured alone in this process (no sockets): a member's
    encode and decode of `elements` float32 (`codec_average`, with the compiled kernel where built); a member's
    handling of one result (`on_result` of the sum `client.member_sum` makes, as `UdpMember` does: the compiled
    lane where built; with the refill it sends) and the service's decision on one contribution
    (`SoftwareAggregator.handle_batch` on recvmmsg-sized batches, as `inwire serve` runs it; unicast copies),
    per datagram, measured on `sample` elements. What the averaging's measured CPU holds beyond these is the
    sockets' system calls and the loops around them."""
    from ..client import CliqueKey, Contributions, member_sum
    from ..codec_average import decode, encode
    from ..serve import BATCH, SoftwareAggregator

    vector = np.random.default_rng(0).standard_normal(elements).astype(np.float32)
    started = time.process_time()
    exponent, wire = encode(vector, 16.0, ISLANDS, ">i4")
    encoded = time.process_time()
    decode(wire, False, exponent, ISLANDS, 16.0, out=wire.view(np.float32)[:-1])
    decoded = time.process_time()

    key = CliqueKey(1, 0, 0, 0xEF4A0000, ISLANDS, exponent, 1)
    members = [Contributions(encode(vector[m::ISLANDS][:sample], 16.0, ISLANDS, ">i4")[1], m, key, CHUNK, WINDOW)
               for m in range(ISLANDS)]
    service = SoftwareAggregator(("127.0.0.1", 0), unicast=True, max_elements=CHUNK, receive_buffer=None)
    try:
        peers = [("127.0.0.1", 40000 + m) for m in range(ISLANDS)]
        arrivals = [(bytes(members[m][c]), peers[m]) for c in range(len(members[0])) for m in range(ISLANDS)]
        # As `inwire serve` reads them: recvmmsg batches of BATCH datagrams, each at a slot of its buffer.
        slot = max(len(datagram) for datagram, _ in arrivals)
        batches = []
        for first in range(0, len(arrivals), BATCH):
            part = arrivals[first:first + BATCH]
            batches.append((bytearray(b"".join(datagram.ljust(slot, b"\0") for datagram, _ in part)),
                            [(len(datagram), peer) for datagram, peer in part]))
        deciding = time.process_time()
        results = [bytes(payload) for buffer, batch in batches
                   for payload, destination in service.handle_batch(buffer, batch, slot, 0) if destination == peers[0]]
        decided = time.process_time()
    finally:
        service.close()
    run = member_sum(members[0], key, len(members[0].wire) // 4, CHUNK, WINDOW, 1.0, None, 0.002)
    run.start(0.0)
    reading = time.process_time()
    for index, result in enumerate(results):
        run.on_result(result, 1e-4 * index)
    read = time.process_time()
    if not run.done:
        raise RuntimeError("the member's sum did not finish on the service's results")
    return {"elements": elements, "encode_s": round(encoded - started, 4), "decode_s": round(decoded - encoded, 4),
            "member_us_per_result": round(1e6 * (read - reading) / len(results), 2),
            "service_us_per_contribution": round(1e6 * (decided - deciding) / len(arrivals), 2),
            "results_per_member": -(-elements // CHUNK), "contributions_at_service": ISLANDS * -(-elements // CHUNK)}


def run() -> dict[str, Any]:
    """The `training` key of bench/results.json."""
    inwire: list[dict[str, Any]] = []
    gloo: list[float] = []
    lossy: list[dict[str, Any]] = []
    with MachineLoad() as load:
        for repetition in range(REPETITIONS):
            inwire.append(inwire_averaging(seed=repetition))
            gloo += gloo_all_reduce_spans(ISLANDS, ELEMENTS, 1, "float32")
            lossy.append(inwire_averaging(loss=LOSS, seed=repetition))
    inwire_s = statistics.median(r["seconds"] for r in inwire)
    gloo_s = statistics.median(gloo)
    lossy_s = statistics.median(r["seconds"] for r in lossy)
    averaging = load.record({
        "islands": ISLANDS, "elements": ELEMENTS, "bytes_per_island": 4 * ELEMENTS,
        "chunk": CHUNK, "window": WINDOW, "repetitions": REPETITIONS,
        "inwire_s": [r["seconds"] for r in inwire], "gloo_all_reduce_s": gloo,
        "inwire_median_s": inwire_s, "gloo_median_s": gloo_s, "ratio_to_gloo": inwire_s / gloo_s,
        "retransmits": [r["retransmits"] for r in inwire],
        "islands_cpu_s": [r["islands_cpu_s"] for r in inwire], "service_cpu_s": [r["service_cpu_s"] for r in inwire],
        "service_kernel_drops": [r["service_kernel_drops"] for r in inwire]})
    loss = load.record({
        "loss": LOSS, "seconds": [r["seconds"] for r in lossy], "median_s": lossy_s,
        "retransmits": [r["retransmits"] for r in lossy],
        "goodput_relative_to_lossless": inwire_s / lossy_s})
    with MachineLoad() as load:
        hook_s, plain_s = ddp_step_s(True), ddp_step_s(False)
    ddp = load.record({"parameters": 75 * DDP_HIDDEN + 10, "islands": ISLANDS, "ranks_per_island": DDP_RANKS,
                       "steps": DDP_STEPS, "hook_step_s": hook_s, "gloo_ddp_step_s": plain_s,
                       "ratio": hook_s / plain_s})
    with MachineLoad() as load:
        parts = where_the_time_goes()
    with MachineLoad() as load:
        memory = averaging_memory()
    return {"averaging": averaging, "loss": loss, "ddp_hook": ddp, "cpu_by_part": load.record(parts),
            "memory": load.record(memory)}


if __name__ == "__main__":
    import json

    print(json.dumps(run(), indent=1))
