"""Islands as torchrun jobs averaging through an inwire aggregator on this machine (`make train-dist`).

Starts `inwire serve` processes (the fast path, the golden model with `--golden`, or the co-simulated
gateware with `--sim`), one per city the schedule sums at, unless `--server` names one already up, writes
the schedule, launches one `torchrun --standalone --nproc-per-node N`
per island (each its own rendezvous on a free port; gloo inside), waits with a deadline, and checks the
outcome: at every averaging, every rank of every member holds exactly the codec's quantized average of what
the members sent, which `codec_average.clique_average` computes independently of the aggregator. With
`--hook` the islands average every gradient bucket through the DDP hook instead (`inwire.train.ddp`), and
the same check holds for every bucket of every step. Prints JSON with `bit_exact` and each island's accuracy.
On any failure or timeout the islands' process groups are killed and the error names the island and the tail
of its log.

On several machines: inside an island, launch torchrun as usual (`--nnodes`, `--rdzv-endpoint` of the
island's own head node); between islands only inwire addresses are shared: every island's rank 0 gets the
aggregator's HOST:PORT (`--server`) and the same schedule file.
"""

import argparse
import contextlib
import dataclasses
import json
import os
import pathlib
import re
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np

from ..codec_average import clique_average
from ..errors import InwireError
from ..plan.cost import CostModel
from ..plan.schedule_file import schedule_document
from ..plan.search import Evaluator, plan_schedule
from ..plan.topology import load_topology


class DistributedRunError(InwireError, RuntimeError):
    """The distributed run failed or did not finish in time; the message says which island and why."""


STRATEGIES = ("schedule", "gossip", "tree")


def schedule_for(topology_name: str, islands: Sequence[str], strategy: str, model_bytes: int) -> dict[str, Any]:
    """A schedule document for the islands: the planner's choice, rotating pairs (`gossip`), or the global
    clique summed along a chain of aggregators (`tree`: the first island's contribution is summed at the
    second's city, which sends its partial on to the third's, and so on to the last, the root)."""
    from .training import gossip_rounds

    if strategy == "tree":
        chain = list(islands)
        tree = {chain[i]: chain[i + 1] for i in range(len(chain) - 1)}
        return {"islands": chain, "rounds": [{"cliques": [{"members": chain, "aggregator": chain[-1],
                                                             "tree": tree}], "time_ms": 1.0}]}
    topology = load_topology(topology_name)
    if strategy == "schedule":
        return schedule_document(plan_schedule(topology, list(islands), model_bytes=model_bytes))
    if strategy != "gossip":
        raise ValueError(f"strategy must be one of {', '.join(STRATEGIES)}, got {strategy!r}")
    schedule = Evaluator(CostModel(topology, islands, model_bytes), 1e-3).evaluate(gossip_rounds(list(islands)))
    rounds = [{"cliques": [{"members": list(c.members), "aggregator": c.aggregator, "exchange": c.exchange}
                           for c in cliques if len(c.members) > 1], "time_ms": duration}
              for cliques, duration in zip(schedule.rounds, schedule.round_times_ms)]
    return {"islands": list(islands), "rounds": rounds}


def check_bit_exact(out_dir: str | os.PathLike[str], islands: Iterable[str], bound: float = 16.0,
                    plain: bool = True) -> tuple[bool, int, list[str]]:
    """Compare every rank's logged averages with clique_average of the members' sent vectors: rank 0's
    vectors directly, every rank's digests with rank 0's and with the expected average's (with the DDP
    hook only rank 0 logs what was sent; every rank what the bucket held after).

    Returns (bit_exact, averagings checked, list of mismatches)."""
    from .island import digest, load_log

    logs: dict[str, list[dict[str, Any]]] = {}
    for island in islands:
        files = sorted(pathlib.Path(out_dir).glob(f"{island}-rank*.npz"), key=lambda path: int(path.stem.rsplit(
            "rank", 1)[1]))
        if not files:
            return False, 0, [f"{island}: no log"]
        logs[island] = [load_log(path) for path in files]
    problems: list[str] = []
    checked = 0
    sent: dict[tuple[int, str], np.ndarray] = {}
    for island, ranks in logs.items():
        first = ranks[0]
        for rank, log in enumerate(ranks):
            for key in ("round", "members", "sent_sha", "average_sha", "after_sha"):
                # A missing key reads as None, which equals no logged array.
                if (key in log or key in ("round", "members", "after_sha")) and not np.array_equal(
                        log.get(key), first[key]):  # type: ignore[arg-type]
                    problems.append(f"{island} rank {rank}: {key.removesuffix('_sha')} differs from rank 0")
        for i, round_index in enumerate(first["round"]):
            if digest(first["sent"][i]) != first["sent_sha"][i]:
                problems.append(f"{island} round {round_index}: rank 0's sent vector does not match its digest")
            sent[(int(round_index), island)] = first["sent"][i]
    for island, ranks in logs.items():
        # The island mean rank 0 sent, from the ranks' own buckets where they logged them: exact for one or
        # two ranks (a + b rounds alike in any order; gloo's order for more ranks is its own).
        if len(ranks) <= 2 and all("gradient" in log for log in ranks):
            for i, round_index in enumerate(ranks[0]["round"]):
                own = np.stack([log["gradient"][i] for log in ranks]).astype(np.float32)
                if not np.array_equal(own.sum(axis=0, dtype=np.float32) / np.float32(len(ranks)),
                                      ranks[0]["sent"][i]):
                    problems.append(f"{island} round {round_index}: what rank 0 sent is not the mean of the "
                                    f"island's buckets")
        log = ranks[0]
        for i, round_index in enumerate(log["round"]):
            members = str(log["members"][i]).split(",")
            try:
                vectors = [sent[(int(round_index), member)] for member in members]
            except KeyError:
                problems.append(f"{island} round {round_index}: a member of {members} did not log the round")
                continue
            expected = clique_average(vectors, bound)
            checked += 1
            if log["average_sha"][i] != digest(expected) or ("average" in log and not np.array_equal(
                    log["average"][i], expected)):
                problems.append(f"{island} round {round_index}: average differs from the codec's")
            if plain and log["after_sha"][i] != digest(expected):
                problems.append(f"{island} round {round_index}: what it held after averaging is not the average")
    return not problems and checked > 0, checked, problems


CAUSE = re.compile(r"^(\[rank\d+\]: )?([\w.]+(Error|Exception|Interrupt)\b.*|terminate called.*|\s*what\(\):.*"
                   r"|Fatal Python error.*)$")
"""A rank's last word: an exception's message, a C++ terminate with its what(), or faulthandler's header."""


def _log_excerpt(path: str | os.PathLike[str], tail_lines: int = 12, causes: int = 10) -> str:
    """Why an island failed: each rank's error messages, then the log's tail (torchrun's summary, which names
    the rank and signal but not the cause)."""
    try:
        lines = pathlib.Path(path).read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    tail_start = max(0, len(lines) - tail_lines)
    found = list(dict.fromkeys(line for line in lines[:tail_start] if CAUSE.match(line)))[:causes]
    return "\n".join(found + (["..."] if found else []) + lines[tail_start:])


def _stop(processes: Iterable[subprocess.Popen[bytes]]) -> None:
    """Terminate each island's process group (torchrun and its ranks), then kill what is left."""
    for process in processes:
        if process.poll() is None:
            try:
                os.killpg(process.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + 5
    for process in processes:
        try:
            process.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            process.wait(timeout=5)


def launch_islands(islands: Sequence[str], server: str, schedule_path: str | os.PathLike[str],
                   out_dir: str | os.PathLike[str], nproc: int, steps: int, period: int, seed: int, alpha: str,
                   timeout_s: float, outer_lr: float = 1.0, outer_momentum: float = 0.0, hidden: int = 32,
                   hook: bool = False, bucket_mb: float = 25.0, log_gradients: bool = False,
                   job: int | None = None, register: bool = True) -> None:
    """Run one torchrun per island and wait for all; raises DistributedRunError on failure or timeout. Every
    island gets the same `job` id, by default a random one drawn for this launch: two launches on one
    aggregator never share a job's slots. With `register` the launch is a registered job at its aggregator
    (`server` HOST:PORT) or at every one of a reduction tree's (`server` their map file) (`registration`;
    ControlError when an aggregator refuses it or never answers); `register` False: unregistered frames."""
    processes: list[subprocess.Popen[bytes]] = []
    logs: dict[str, pathlib.Path] = {}
    job = 1 + secrets.randbelow(2**32 - 1) if job is None else job
    environments, lease = (registration(islands, server, schedule_path, hook, job) if register
                           else (dict.fromkeys(islands, {}), contextlib.nullcontext()))
    # Registered for as long as the islands run: renewed meanwhile, torn down after.
    registered = contextlib.ExitStack()
    registered.enter_context(lease)
    try:
        for island in islands:
            logs[island] = pathlib.Path(out_dir) / f"{island}.log"
            command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
                       "-m", "inwire.train.island", "--island", island, "--schedule", str(schedule_path),
                       "--server", server, "--out-dir", str(out_dir), "--steps", str(steps),
                       "--period", str(period), "--seed", str(seed), "--alpha", alpha,
                       "--outer-lr", str(outer_lr), "--outer-momentum", str(outer_momentum), "--hidden", str(hidden),
                       "--timeout", str(max(5.0, timeout_s / 4)), "--job", str(job),
                       *(["--hook", "--bucket-mb", str(bucket_mb)] if hook else []),
                       *(["--log-gradients"] if hook and log_gradients else [])]
            with open(logs[island], "w") as log:
                # A session per island, so that its torchrun and every rank can be stopped together.
                processes.append(subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                                  start_new_session=True,
                                                  env={**os.environ, **environments[island], "OMP_NUM_THREADS": "1",
                                                       # a rank that aborts in C++ leaves its Python stack in the log
                                                       "PYTHONFAULTHANDLER": "1"}))
        deadline = time.monotonic() + timeout_s
        running = dict(zip(islands, processes))
        while running:
            for island, process in list(running.items()):
                code = process.poll()
                if code is None:
                    continue
                del running[island]
                if code != 0:
                    raise DistributedRunError(
                        f"island {island} exited with status {code}:\n{_log_excerpt(logs[island])}")
            if running and time.monotonic() > deadline:
                names = ", ".join(running)
                raise DistributedRunError(f"islands {names} did not finish in {timeout_s} s:\n"
                                          f"{_log_excerpt(logs[next(iter(running))])}")
            time.sleep(0.1)
    finally:
        _stop(processes)
        registered.close()


def registration(islands: Sequence[str], server: str, schedule_path: str | os.PathLike[str], hook: bool,
                 job: int) -> tuple[dict[str, dict[str, str]], contextlib.AbstractContextManager[Any]]:
    """What registers a launch as job `job` with its aggregators (`server`: HOST:PORT, or the map file of the
    per-city aggregators of a reduction tree): each island's environment and the `JobLease`s (a random token;
    the quota of the schedule's cliques, or of the hook's most buckets, and their roll calls for its largest
    clique). With per-city aggregators each city's aggregator holds the job with the islands that send to it
    and its routes along the schedule's trees (`averaging.tree_job_entries`: any depth; with the hook, every
    bucket's along the global clique's tree).

    An island's rank 0 binds a port of its own, so its address is known only once it runs: the launcher's
    leases name a place for each island instead, a socket of the local address towards the aggregators that
    the lease holds for the run (no other process can take its port), and each island registers its own
    socket beside its place, in each entry that holds the place, changed in nothing else, which the tables
    merge (`island.REGISTER_VARIABLE`). The environment also holds the job, with its token, in
    `island.JOB_VARIABLE`."""
    from ..client import local_address_towards
    from ..control import JobLease
    from .island import aggregators_of

    aggregator = aggregators_of(server)
    if isinstance(aggregator, dict):
        cities, towards = aggregator, next(iter(aggregator.values()))
    else:
        cities, towards = None, aggregator
    local = local_address_towards(towards)
    held = contextlib.ExitStack()
    try:
        binds = {island: held.enter_context(_place(local)).getsockname() for island in islands}
        environments, entries = _entries(binds, towards, cities, schedule_path, hook, job)
    except BaseException:
        held.close()
        raise

    @contextlib.contextmanager
    def leased() -> Iterator[None]:
        with held, contextlib.ExitStack() as leases:  # the places are closed once the leases have left
            for at, there in entries.items():
                leases.enter_context(JobLease(at, there))
            yield

    return environments, leased()


def _entries(binds: dict[str, tuple[str, int]], towards: tuple[str, int], cities: dict[str, tuple[str, int]] | None,
             schedule_path: str | os.PathLike[str], hook: bool, job: int
             ) -> tuple[dict[str, dict[str, str]], dict[tuple[str, int], Any]]:
    """`registration`'s islands' environments and {aggregator: the entry it holds}, for the places `binds`."""
    from types import SimpleNamespace

    from ..client import DEFAULT_WINDOW, job_slots
    from ..control import entry_to_json, new_job
    from ..datagram import ip_int
    from ..plan.schedule_file import load_schedule_file
    from .averaging import tree_job_entries
    from .ddp import default_buckets, global_clique
    from .island import JOB_VARIABLE, REGISTER_VARIABLE

    schedule = load_schedule_file(schedule_path)
    fanin = max(len(members) for cliques in schedule.period for members, _ in cliques)
    cliques = default_buckets(len(schedule.islands)) if hook else max(len(cliques) for cliques in schedule.period)
    entry = dataclasses.replace(new_job(binds.values(), job_slots(cliques, DEFAULT_WINDOW, fanin)), job=job)
    if cities is None:
        entries = {towards: entry}
    else:
        sums: Any = schedule
        if hook:
            # Bucket b of a step sums as clique b of the global clique, along its tree.
            members, city, tree = global_clique(schedule)
            sums = SimpleNamespace(period=[[(members, city)] * cliques], trees=[[tree] * cliques])
        entries = {cities[city]: held for city, held in tree_job_entries(entry, sums, binds, cities).items()}
    environments = {}
    for island, (host, port) in binds.items():
        place = (ip_int(host), port)
        joins = [[f"{aggregator[0]}:{aggregator[1]}", entry_to_json(dataclasses.replace(there, members=frozenset()))]
                 for aggregator, there in entries.items() if place in there.members]
        environments[island] = {JOB_VARIABLE: json.dumps(entry_to_json(entry)), REGISTER_VARIABLE: json.dumps(joins)}
    return environments, entries


@contextlib.contextmanager
def _place(host: str) -> Iterator[socket.socket]:
    """A UDP socket of `host` on a port of the system's choosing, held (never read) while the body runs."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as place:
        place.bind((host, 0))
        yield place


SERVE_START_S = 30.0
"""Seconds `inwire serve` may take to say it listens (with a co-simulated gateware, which builds first: the
run's timeout)."""


@contextlib.contextmanager
def serving(cities: Sequence[str | None], out_dir: str | os.PathLike[str], options: Sequence[str] = (),
            start_s: float = SERVE_START_S, unregistered: bool = False
            ) -> Iterator[tuple[dict[str | None, str], dict[str | None, dict[str, int]]]]:
    """One `inwire serve` process per city, each at its own loopback address (127.0.0.2, .3, ...) on one
    shared port, as a reduction tree needs, taking registered jobs (`unregistered`: unregistered frames too);
    yields {city: "HOST:PORT"}. The `counters` dict handed over with it is filled on exit with each service's
    final non-zero counters (from its log)."""
    from ..netns import package_environment

    processes: dict[str | None, subprocess.Popen[bytes]] = {}
    addresses: dict[str | None, str] = {}
    counters: dict[str | None, dict[str, int]] = {}
    port = 0
    logs = {city: pathlib.Path(out_dir) / f"serve-{city or 'all'}.log" for city in cities}
    try:
        for k, city in enumerate(cities):
            log_path = logs[city]
            with open(log_path, "w") as log:
                processes[city] = subprocess.Popen(
                    [sys.executable, "-m", "inwire", "serve", "--listen", f"127.0.0.{2 + k}:{port}", "--unicast",
                     *(["--unregistered"] if unregistered else []), *options],
                    stdout=log, stderr=subprocess.STDOUT, env=package_environment())
            deadline = time.monotonic() + start_s
            while not (listening := re.search(r"listening on udp://([\d.]+):(\d+)", log_path.read_text())):
                if processes[city].poll() is not None or time.monotonic() > deadline:
                    raise DistributedRunError(f"inwire serve for {city or 'every clique'} did not start: "
                                              f"{log_path.read_text().strip()[-500:] or 'no output'}")
                time.sleep(0.05)
            port = int(listening[2])
            addresses[city] = f"{listening[1]}:{port}"
        yield addresses, counters
    finally:
        for process in processes.values():
            process.terminate()
        for city, process in processes.items():
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=5)
            final = re.search(r"final counters (.*)", logs[city].read_text())
            counters[city] = {} if final is None else {name: int(value) for name, value in re.findall(
                r"(\w+)=(\d+)", final[1]) if int(value) and name != "drops"}


def run_dist(islands: Sequence[str] = ("LON", "NYC", "SIN"), nproc: int = 2, steps: int = 40, period: int = 10,
             seed: int = 0, alpha: str = "0.3", strategy: str = "schedule", topology: str = "doublezero9",
             model_mb: float = 100.0, server: str | None = None, sim: tuple[str, int] | tuple[()] = (),
             out_dir: str | os.PathLike[str] | None = None, timeout_s: float = 300.0, outer_lr: float = 1.0,
             outer_momentum: float = 0.0, hidden: int = 32, golden: bool = False, hook: bool = False,
             bucket_mb: float = 25.0, log_gradients: bool = False) -> dict[str, Any]:
    """The whole run; returns the report (also when averages are not bit-exact: `bit_exact` says so).

    Without `server`, one `inwire serve` per city the schedule sums at (only the root without trees), each at
    its own loopback address on one shared port, as a reduction tree needs (`--server` then names the city
    map file the islands read). With `hook`, the islands train synchronously through the DDP hook in the
    schedule's clique of every island, and must also end with the same parameters; with `log_gradients`
    too, every rank logs its own buckets, and each island mean rank 0 sent is checked against them."""
    out_dir = pathlib.Path(out_dir or tempfile.mkdtemp(prefix="inwire-dist-"))
    out_dir.mkdir(parents=True, exist_ok=True)
    document = schedule_for(topology, islands, strategy, round(model_mb * 1e6))
    schedule_path = out_dir / "schedule.json"
    schedule_path.write_text(json.dumps(document, indent=1) + "\n")
    if hook:
        from ..plan.schedule_file import load_schedule_file
        from .ddp import global_clique

        global_clique(load_schedule_file(schedule_path))  # ValueError when the schedule has no such clique
    started = time.monotonic()
    arguments = (schedule_path, out_dir, nproc, steps, period, seed, alpha, timeout_s, outer_lr, outer_momentum,
                 hidden, hook, bucket_mb, log_gradients)
    # Each service's final counters by city, or the one service's own.
    counters: dict[Any, Any] | None = None
    if server:
        launch_islands(islands, server, *arguments)
    else:
        options = ["--sim", f"{sim[0]}:{sim[1]}"] if sim else ["--golden"] if golden else []
        cities = sorted({city for entry in document["rounds"] for clique in entry["cliques"]
                         for city in (clique.get("aggregator"), *clique.get("tree", {}).values()) if city}) or [None]
        # The co-simulated gateware's tables hold no routes: its trees take unregistered frames.
        unregistered = bool(sim) and len(cities) > 1
        with serving(cities, out_dir, options, timeout_s if sim else SERVE_START_S, unregistered) as (addresses,
                                                                                                     counters):
            target: pathlib.Path | str
            if any("tree" in clique for entry in document["rounds"] for clique in entry["cliques"]):
                target = out_dir / "aggregators.json"
                target.write_text(json.dumps(addresses))
            else:
                # One aggregator for every clique (all-to-all ones too): the islands need no map.
                target = next(iter(addresses.values()))
            launch_islands(islands, str(target), *arguments, register=not unregistered)
        if None in counters:
            counters = counters[None]
    bit_exact, checked, problems = check_bit_exact(out_dir, islands, plain=outer_lr == 1.0 and outer_momentum == 0.0)
    results = {island: json.loads((out_dir / f"{island}.json").read_text()) for island in islands}
    if hook and len({result["parameters_sha"] for result in results.values()}) != 1:
        bit_exact = False
        problems.append("the islands end with different parameters")
    return {"bit_exact": bit_exact, "averagings_checked": checked, "problems": problems[:10],
            "islands": {island: {"accuracy": r["accuracy"], "ranks": r["ranks"], "backend": r["backend"],
                                 "averagings": r["averagings"]} for island, r in results.items()},
            "schedule_rounds": [[c["members"] for c in r["cliques"]] for r in document["rounds"]],
            "steps": steps, "period": None if hook else period, "mode": "ddp hook" if hook else "averager",
            "aggregator": f"{sim[0]} co-simulation" if sim else "golden model" if golden else "fast path",
            "aggregator_counters": counters, "out_dir": str(out_dir), "wall_s": round(time.monotonic() - started, 1)}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m inwire.train.dist", description=__doc__.split("\n")[0])
    parser.add_argument("--islands", default="LON,NYC,SIN", help="comma-separated cities of the topology")
    parser.add_argument("--nproc-per-node", type=int, default=2, help="ranks per island")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--period", type=int, default=10, help="local steps between averagings")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--alpha", default="0.3", help="Dirichlet concentration of the class split, or iid")
    parser.add_argument("--strategy", default="schedule", choices=STRATEGIES,
                        help="schedule (the planner's), gossip (rotating pairs) or tree (the global clique along a "
                             "chain of aggregators, one service per summing city)")
    parser.add_argument("--golden", action="store_true",
                        help="answer with the golden model itself instead of the fast path (bit-exact with it)")
    parser.add_argument("--hidden", type=int, default=32,
                        help="hidden units of the islands' MLP: 75 x hidden + 10 parameters (333,333: 25 million)")
    parser.add_argument("--model-mb", type=float, default=100.0, help="model size the schedule is planned for")
    parser.add_argument("--server", default="", help="an aggregator already up (HOST:PORT); default: start one")
    parser.add_argument("--sim", default="", metavar="SIMULATOR[:WIDTH]",
                        help="start the co-simulated gateware (icarus or verilator) instead of the golden model")
    parser.add_argument("--hook", action="store_true",
                        help="train synchronously: every gradient bucket summed across islands by the DDP hook "
                             "(inwire.train.ddp) in the schedule's clique of every island, instead of averaging "
                             "models every --period steps")
    parser.add_argument("--bucket-mb", type=float, default=25.0, help="DDP's bucket_cap_mb with --hook")
    parser.add_argument("--log-gradients", action="store_true",
                        help="with --hook, check each island mean against its ranks' own buckets (one or two "
                             "ranks), which every rank then logs: a model's worth per step and rank")
    parser.add_argument("--outer-lr", type=float, default=1.0)
    parser.add_argument("--outer-momentum", type=float, default=0.0)
    parser.add_argument("--out-dir", default="", help="logs and per-rank records (default: a new temporary folder)")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds for the whole run")
    args = parser.parse_args(argv)
    sim: tuple[str, int] | tuple[()] = ()
    if args.sim:
        from ..simulators import parse_simulator

        sim = parse_simulator(args.sim)
    try:
        report = run_dist(tuple(filter(None, args.islands.split(","))), args.nproc_per_node, args.steps, args.period,
                          args.seed, args.alpha, args.strategy, model_mb=args.model_mb, server=args.server or None,
                          sim=sim, out_dir=args.out_dir or None, timeout_s=args.timeout, outer_lr=args.outer_lr,
                          outer_momentum=args.outer_momentum, hidden=args.hidden, golden=args.golden,
                          hook=args.hook, bucket_mb=args.bucket_mb, log_gradients=args.log_gradients)
    except (DistributedRunError, ValueError, OSError) as error:
        print(f"inwire train-dist: {error}", file=sys.stderr)
        return 2
    print(json.dumps(report, indent=1))
    return 0 if report["bit_exact"] else 1


if __name__ == "__main__":
    sys.exit(main())
