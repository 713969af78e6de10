"""One island as a torch.distributed job: run by `torchrun`, one process per rank.

    torchrun --standalone --nproc-per-node 2 -m inwire.train.island --island LON --schedule schedule.json \\
        --server 10.0.0.1:18775 --out-dir run/

Inside the island the ranks keep their usual data-parallel training (DistributedDataParallel: gloo on CPU,
NCCL where there are GPUs), each on its half of the island's data. After every optimizer step the
`CliqueAverager` counts; every `period` steps rank 0 averages with the island's clique through inwire and
broadcasts the result inside the island. With `--hook` there is no averager: DDP's gradient buckets go
through `inwire_hook` at every step instead (synchronous data parallelism across islands), summed across
islands in the schedule's clique of every island. Each rank writes what it sent and received at every
averaging or bucket (`<island>-rank<r>.npz`: digests, and on rank 0 the vectors sent), and rank 0 the
island's test accuracy and a digest of its final parameters (`<island>.json`), for the launcher to check.
With $INWIRE_JOB (a registered job, as the launcher registers it for one aggregator) rank 0 averages from
`--bind` as a member of that job: version 3 frames with its token (`InwireExchange.join`). With
$INWIRE_JOB_REGISTER too (as the launcher starts islands) rank 0 binds a port of its own and registers that
socket itself, in each entry the variable names, for as long as it runs.
"""

import argparse
import contextlib
import dataclasses
import datetime
import hashlib
import json
import os
import pathlib
import re
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    import torch

    from ..datagram import Address
    from ..jobs import JobEntry


JOB_VARIABLE = "INWIRE_JOB"
"""The registered job an island is a member of, as the control plane's JSON (`control.entry_to_json`, with the
token): from the environment, which other users cannot read, unlike the command line."""
REGISTER_VARIABLE = "INWIRE_JOB_REGISTER"
"""Where rank 0 registers its own socket, once bound: a JSON list of ["HOST:PORT" of an aggregator, the entry
(`control.entry_to_json`) that aggregator holds the job with], each entry registered with this socket as its
member (the tables merge it with the members held already: `dist.registration`)."""


def registered_job(parser: argparse.ArgumentParser, args: argparse.Namespace, text: str,
                   registrations: str | None = None) -> "JobEntry":
    """The job of ${JOB_VARIABLE}, checked against --job and --bind (one of its members); with
    `registrations` (${REGISTER_VARIABLE}) no --bind, and `args.registrations` the [(aggregator, entry)] that
    rank 0 registers its own socket in."""
    from ..control import RequestError, entry_from_json
    from ..datagram import ip_int, parse_endpoint

    try:
        body = json.loads(text)
        entry = entry_from_json(body if isinstance(body, dict) else {})
    except (ValueError, RequestError) as error:  # not JSON, or a field the control plane would refuse
        parser.error(f"${JOB_VARIABLE}: {str(error).splitlines()[0]}")
    if entry.job != args.job:
        parser.error(f"${JOB_VARIABLE} holds job {entry.job}, --job says {args.job}")
    if registrations is not None:
        args.registrations = job_registrations(parser, registrations, entry.job)
        if args.bind is not None:
            parser.error(f"--bind {args.bind}: with ${REGISTER_VARIABLE} the island binds a port of its own")
        return entry
    if args.bind is None:
        parser.error(f"${JOB_VARIABLE} needs --bind, the member address its registration names for this island")
    try:
        host, port = parse_endpoint(args.bind, "--bind")
    except ValueError as error:
        parser.error(str(error))
    if (ip_int(host), port) not in entry.members:
        parser.error(f"--bind {args.bind} is not a member of job {entry.job}")
    args.bind = (host, port)
    return entry


def job_registrations(parser: argparse.ArgumentParser, text: str, job: int) -> list[tuple[str, "JobEntry"]]:
    """The [(aggregator "HOST:PORT", entry)] of ${REGISTER_VARIABLE}, each entry of job `job`."""
    from ..control import RequestError, entry_from_json

    try:
        body = json.loads(text)
        if not isinstance(body, list) or not all(isinstance(item, list) and len(item) == 2 and isinstance(item[0], str)
                                                 and isinstance(item[1], dict) for item in body):
            raise ValueError("not a list of [\"HOST:PORT\", entry]")
        registrations = [(aggregator, entry_from_json(fields)) for aggregator, fields in body]
    except (ValueError, RequestError) as error:  # not JSON, or a field the control plane would refuse
        parser.error(f"${REGISTER_VARIABLE}: {str(error).splitlines()[0]}")
    other = next((entry.job for _, entry in registrations if entry.job != job), None)
    if other is not None:
        parser.error(f"${REGISTER_VARIABLE} holds job {other}, ${JOB_VARIABLE} job {job}")
    return registrations


def parse_arguments(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m inwire.train.island", description=__doc__.split("\n")[0])
    parser.add_argument("--island", required=True, help="this island's name in the schedule")
    parser.add_argument("--schedule", required=True, help="schedule file (inwire schedule --out)")
    parser.add_argument("--server", required=True,
                        help="the aggregator, HOST:PORT, or a JSON file mapping each aggregator city to "
                             "\"IPv4:PORT\" (as inwire stream --target udp:FILE) for per-city aggregators and trees")
    parser.add_argument("--out-dir", required=True, help="folder of the logs (made if missing)")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--period", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--alpha", default="0.3", help="Dirichlet concentration of the class split, or iid")
    parser.add_argument("--hidden", type=int, default=32)
    parser.add_argument("--batch", type=int, default=32, help="samples per rank and step")
    parser.add_argument("--learning-rate", type=float, default=0.2)
    parser.add_argument("--outer-lr", type=float, default=1.0)
    parser.add_argument("--outer-momentum", type=float, default=0.0)
    parser.add_argument("--job", type=int, required=True,
                        help="the training's job id, the same on every island (the launcher draws a random one): "
                             "trainings that share an aggregator need ids of their own")
    parser.add_argument("--bind", default=None, metavar="HOST:PORT",
                        help=f"rank 0's socket towards the aggregator: with ${JOB_VARIABLE}, the member address the "
                             f"job's registration names")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds any collective or averaging may take")
    parser.add_argument("--backend", default="", help="gloo or nccl (default: nccl with CUDA, else gloo)")
    parser.add_argument("--hook", action="store_true",
                        help="sum every gradient bucket across islands with the DDP hook instead of averaging models")
    parser.add_argument("--bucket-mb", type=float, default=25.0, help="DDP's bucket_cap_mb (with --hook)")
    parser.add_argument("--log-gradients", action="store_true",
                        help="with --hook, every rank also logs its own bucket before the hook (a model's worth "
                             "per step and rank), so that the launcher checks the island means too")
    args = parser.parse_args(argv)
    args.entry, args.registrations = None, []
    text = os.environ.get(JOB_VARIABLE)
    if text is not None:
        args.entry = registered_job(parser, args, text, os.environ.get(REGISTER_VARIABLE))
    # Made before any training: a folder that cannot be written would otherwise lose the whole run's log at the end.
    try:
        pathlib.Path(args.out_dir).mkdir(parents=True, exist_ok=True)
    except OSError as error:
        parser.error(f"--out-dir {args.out_dir}: cannot make the folder: {error.strerror}")
    return args


def digest(vector: npt.ArrayLike) -> str:
    """SHA-256 of a float32 vector's bytes: what every rank logs of each averaging."""
    return hashlib.sha256(np.ascontiguousarray(vector, dtype=np.float32).tobytes()).hexdigest()


VECTORS = ("sent", "average", "gradient")
"""Logged per averaging as whole vectors (their lengths differ between a hook's buckets), the rest as arrays."""


def save_log(path: str | os.PathLike[str], log: dict[str, Any]) -> None:
    """One rank's log as .npz: each vector of VECTORS under its own key (`sent_0`, ...)."""
    arrays: dict[str, np.ndarray] = {key: np.array(value) for key, value in log.items() if key not in VECTORS}
    for key in VECTORS:
        arrays.update({f"{key}_{i}": vector for i, vector in enumerate(log.get(key, ()))})
    np.savez(path, **arrays)  # type: ignore[arg-type]  # numpy's stub matches **kwds against allow_pickle too


def load_log(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A log `save_log` wrote, with VECTORS back as lists (absent when the rank logged none)."""
    log: dict[str, Any] = {}
    vectors: dict[str, dict[int, np.ndarray]] = {}
    with np.load(path) as stored:
        for name in stored.files:
            numbered = re.fullmatch(rf"({'|'.join(VECTORS)})_(\d+)", name)
            if numbered:
                vectors.setdefault(numbered[1], {})[int(numbered[2])] = stored[name]
            else:
                log[name] = stored[name]
    log.update({key: [by_index[i] for i in sorted(by_index)] for key, by_index in vectors.items()})
    return log


def parameters_of(model: "torch.nn.Module") -> np.ndarray:
    """The model's parameters as one float32 numpy vector on the host."""
    import torch

    return torch.nn.utils.parameters_to_vector(model.parameters()).detach().cpu().numpy()


def aggregators_of(server: str) -> "Address | dict[str, Address]":
    """--server: HOST:PORT, or an aggregator map file ({city: "IPv4:PORT"})."""
    from ..datagram import parse_endpoint
    from ..stream import load_aggregator_map

    if pathlib.Path(server).is_file():
        return load_aggregator_map(server)
    return parse_endpoint(server, "--server")


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_arguments(argv)
    import torch
    import torch.distributed as dist

    from ..control import JobLease
    from ..datagram import ip_int
    from ..plan.schedule_file import load_schedule_file
    from .averaging import CliqueAverager, InwireExchange, OuterOptimizer
    from .ddp import InwireHookState, global_clique, inwire_hook
    from .training import split_data

    torch.set_num_threads(1)
    backend = args.backend or ("nccl" if torch.cuda.is_available() else "gloo")
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=args.timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}" if backend == "nccl" else "cpu")
    exchange = None
    leases = contextlib.ExitStack()
    try:
        schedule = load_schedule_file(args.schedule)
        islands = list(schedule.islands)
        alpha = None if args.alpha == "iid" else float(args.alpha)
        shards, (test_x, test_y) = split_data(alpha, args.seed, len(islands))
        share_x, share_y = shards[islands.index(args.island)]
        # Each rank trains on its half of the island's share; DDP averages their gradients.
        train_x = torch.from_numpy(share_x[rank::world]).to(device)
        train_y = torch.from_numpy(share_y[rank::world]).to(device)
        torch.manual_seed(args.seed)
        model = torch.nn.Sequential(torch.nn.Linear(64, args.hidden), torch.nn.ReLU(),
                                    torch.nn.Linear(args.hidden, 10)).to(device)
        if rank == 0:
            # Half the group's timeout: rank 0 gives up on inwire while the other ranks still wait in the
            # status broadcast, so that they hear why instead of timing out on their own.
            exchange = InwireExchange(aggregators_of(args.server), job=args.job, deadline_s=args.timeout / 2,
                                      bind=args.bind, entry=None if args.registrations else args.entry)
            if args.registrations:
                # This socket's port is known now: registered beside the place the launcher holds for it.
                own = (ip_int(exchange.address[0]), exchange.address[1])
                for aggregator, entry in args.registrations:
                    leases.enter_context(JobLease(aggregator, dataclasses.replace(entry, members=frozenset({own}))))
                exchange.join(dataclasses.replace(args.entry, members=args.entry.members | {own}))
        # Every rank logs digests; rank 0 also the vectors sent, from which the launcher recomputes the average.
        # With the hook only rank 0 sees the island's mean and the average before they reach the bucket.
        digests = ("sent_sha", "average_sha", "after_sha") if rank == 0 or not args.hook else ("after_sha",)
        vectors = ("sent",) if args.hook else ("sent", "average")
        log: dict[str, list[Any]] = {"round": [], "members": [], **{key: [] for key in digests},
               **({key: [] for key in vectors} if rank == 0 else {}),
               **({"gradient": []} if args.hook and args.log_gradients else {})}

        def record(round_index: int, members: Sequence[str], sent: np.ndarray | None, average: np.ndarray | None,
                   after: np.ndarray) -> None:
            log["round"].append(round_index)
            log["members"].append(",".join(members))
            for key, vector in (("sent", sent), ("average", average), ("after", after)):
                if vector is None:  # what the hook sent and received: seen on rank 0 alone, which logs it
                    continue
                if f"{key}_sha" in log:
                    log[f"{key}_sha"].append(digest(vector))
                if key in log:
                    log[key].append(np.array(vector, dtype=np.float32))  # a copy: the hook's buffer is reused

        if args.hook:
            clique, aggregator, tree = global_clique(schedule)
            replica = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=args.bucket_mb)
            state = InwireHookState(exchange, args.island, clique, aggregator=aggregator, tree=tree)

            def recording_hook(state: InwireHookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
                step, index = state.step, bucket.index()
                if "gradient" in log:
                    log["gradient"].append(bucket.buffer().detach().cpu().numpy().copy())
                def record_sum(future: torch.futures.Future[torch.Tensor]) -> torch.Tensor:
                    # On the hook's worker, which sets state.last before it completes the future and takes the
                    # next bucket only after this returns.
                    sent, average = state.last[2:] if rank == 0 and state.last is not None else (None, None)
                    record(step * state.buckets + index, clique, sent, average, future.value().cpu().numpy())
                    return future.value()

                return inwire_hook(state, bucket).then(record_sum)

            replica.register_comm_hook(state, recording_hook)
        else:
            replica = torch.nn.parallel.DistributedDataParallel(model)
            averager = CliqueAverager(args.period, island=args.island, schedule=schedule, exchange=exchange,
                                      outer=OuterOptimizer(args.outer_lr, args.outer_momentum))
            averager.keep_vectors = True  # the log records what each averaging sent and received
        optimizer = torch.optim.SGD(replica.parameters(), lr=args.learning_rate)
        loss_function = torch.nn.CrossEntropyLoss()
        generator = torch.Generator().manual_seed(args.seed * 1000 + rank)
        for _step in range(args.steps):
            batch = torch.randint(max(1, len(train_y)), (args.batch,), generator=generator).to(device)
            optimizer.zero_grad()
            if len(train_y):
                loss = loss_function(replica(train_x[batch]), train_y[batch])
            else:  # a rank without data still joins the gradient all-reduce, with zero gradients
                loss = 0.0 * sum(p.sum() for p in replica.parameters())
            loss.backward()
            optimizer.step()
            if not args.hook and (members := averager.average_parameters(model.named_parameters())):
                assert averager.last is not None, "set by the averaging that returned the members"
                round_index, _, sent, average = averager.last
                record(round_index, members, sent, average, parameters_of(model))
        out = pathlib.Path(args.out_dir)
        save_log(out / f"{args.island}-rank{rank}.npz", log)
        with torch.no_grad():
            logits = model(torch.from_numpy(test_x).to(device)).cpu()
            accuracy = float((logits.argmax(1) == torch.from_numpy(test_y)).float().mean())
        if rank == 0:
            (out / f"{args.island}.json").write_text(json.dumps(
                {"island": args.island, "ranks": world, "backend": backend, "accuracy": accuracy,
                 "averagings": len(log["round"]), "steps": args.steps,
                 "parameters_sha": digest(parameters_of(model))}) + "\n")
        dist.barrier()
    finally:
        leases.close()
        if exchange is not None:
            exchange.close()
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    status = main()
    # Every file is written and the process group destroyed: leave without the interpreter's finalization, in
    # which a gloo thread still holding a tensor can abort a finished rank ("terminate called without an
    # active exception", SIGABRT; seen once in CI, on a rank that had written everything). An error above
    # still ends through the interpreter, as raised.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
