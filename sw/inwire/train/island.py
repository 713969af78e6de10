"""One island as a torch.distributed job: run by `torchrun`, one process per rank.

    torchrun --standalone --nproc-per-node 2 -m inwire.train.island --island LON --schedule schedule.json \\
        --server 10.0.0.1:18775 --out-dir run/

Inside the island the ranks keep their usual data-parallel training (DistributedDataParallel: gloo on CPU,
NCCL where there are GPUs), each on its half of the island's data. After every optimizer step the
`CliqueAverager` counts; every `period` steps rank 0 averages with the island's clique through inwire and
broadcasts the result inside the island. Each rank writes what it sent and received at every averaging
(`<island>-rank<r>.npz`: digests, and on rank 0 the vectors), and rank 0 the island's test accuracy
(`<island>.json`), for the launcher to check.
"""

import argparse
import datetime
import hashlib
import json
import os
import pathlib
import sys

import numpy as np


def parse_arguments(argv):
    parser = argparse.ArgumentParser(prog="python -m inwire.train.island", description=__doc__.split("\n")[0])
    parser.add_argument("--island", required=True, help="this island's name in the schedule")
    parser.add_argument("--schedule", required=True, help="schedule file (inwire schedule --out)")
    parser.add_argument("--server", required=True,
                        help="the aggregator, HOST:PORT, or a JSON file mapping each aggregator city to "
                             "\"IPv4:PORT\" (as inwire stream --target udp:FILE) for per-city aggregators and trees")
    parser.add_argument("--out-dir", required=True)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--period", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--alpha", default="0.3", help="Dirichlet concentration of the class split, or iid")
    parser.add_argument("--hidden", type=int, default=32)
    parser.add_argument("--batch", type=int, default=32, help="samples per rank and step")
    parser.add_argument("--learning-rate", type=float, default=0.2)
    parser.add_argument("--outer-lr", type=float, default=1.0)
    parser.add_argument("--outer-momentum", type=float, default=0.0)
    parser.add_argument("--job", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds any collective or averaging may take")
    parser.add_argument("--backend", default="", help="gloo or nccl (default: nccl with CUDA, else gloo)")
    return parser.parse_args(argv)


def digest(vector):
    """SHA-256 of a float32 vector's bytes: what every rank logs of each averaging."""
    return hashlib.sha256(np.ascontiguousarray(vector, dtype=np.float32).tobytes()).hexdigest()


def aggregators_of(server):
    """--server: HOST:PORT, or an aggregator map file ({city: "IPv4:PORT"})."""
    from ..datagram import parse_endpoint
    from ..stream import load_aggregator_map

    if pathlib.Path(server).is_file():
        return load_aggregator_map(server)
    return parse_endpoint(server, "--server")


def main(argv=None):
    args = parse_arguments(argv)
    import torch
    import torch.distributed as dist

    from ..plan.schedule_file import load_schedule_file
    from .averaging import CliqueAverager, InwireExchange, OuterOptimizer
    from .training import split_data

    torch.set_num_threads(1)
    backend = args.backend or ("nccl" if torch.cuda.is_available() else "gloo")
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=args.timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}" if backend == "nccl" else "cpu")
    exchange = None
    try:
        schedule = load_schedule_file(args.schedule)
        islands = list(schedule.islands)
        alpha = None if args.alpha == "iid" else float(args.alpha)
        shards, (test_x, test_y) = split_data(alpha, args.seed, len(islands))
        train_x, train_y = shards[islands.index(args.island)]
        # Each rank trains on its half of the island's share; DDP averages their gradients.
        train_x = torch.from_numpy(train_x[rank::world]).to(device)
        train_y = torch.from_numpy(train_y[rank::world]).to(device)
        torch.manual_seed(args.seed)
        model = torch.nn.Sequential(torch.nn.Linear(64, args.hidden), torch.nn.ReLU(),
                                    torch.nn.Linear(args.hidden, 10)).to(device)
        replica = torch.nn.parallel.DistributedDataParallel(model)
        optimizer = torch.optim.SGD(replica.parameters(), lr=args.learning_rate)
        loss_function = torch.nn.CrossEntropyLoss()
        generator = torch.Generator().manual_seed(args.seed * 1000 + rank)
        if rank == 0:
            # Half the group's timeout: rank 0 gives up on inwire while the other ranks still wait in the
            # status broadcast, so that they hear why instead of timing out on their own.
            exchange = InwireExchange(aggregators_of(args.server), job=args.job, deadline_s=args.timeout / 2)
        averager = CliqueAverager(args.period, island=args.island, schedule=schedule, exchange=exchange,
                                  outer=OuterOptimizer(args.outer_lr, args.outer_momentum))
        # Every rank logs digests; rank 0 also the vectors, from which the launcher recomputes the average.
        log = {"round": [], "members": [], "sent_sha": [], "average_sha": [], "after_sha": [],
               **({"sent": [], "average": []} if rank == 0 else {})}
        for _step in range(args.steps):
            batch = torch.randint(max(1, len(train_y)), (args.batch,), generator=generator).to(device)
            optimizer.zero_grad()
            if len(train_y):
                loss = loss_function(replica(train_x[batch]), train_y[batch])
            else:  # a rank without data still joins the gradient all-reduce, with zero gradients
                loss = 0.0 * sum(p.sum() for p in replica.parameters())
            loss.backward()
            optimizer.step()
            members = averager.average_parameters(model.parameters())
            if members:
                round_index, _, sent, average = averager.last
                after = torch.nn.utils.parameters_to_vector(model.parameters()).detach().cpu().numpy()
                log["round"].append(round_index)
                log["members"].append(",".join(members))
                for key, vector in (("sent", sent), ("average", average), ("after", after)):
                    log[f"{key}_sha"].append(digest(vector))
                    if key in log:
                        log[key].append(vector)
        out = pathlib.Path(args.out_dir)
        np.savez(out / f"{args.island}-rank{rank}.npz", **{key: np.array(value) for key, value in log.items()})
        with torch.no_grad():
            logits = model(torch.from_numpy(test_x).to(device)).cpu()
            accuracy = float((logits.argmax(1) == torch.from_numpy(test_y)).float().mean())
        if rank == 0:
            (out / f"{args.island}.json").write_text(json.dumps(
                {"island": args.island, "ranks": world, "backend": backend, "accuracy": accuracy,
                 "averagings": len(log["round"]), "steps": args.steps}) + "\n")
        dist.barrier()
    finally:
        if exchange is not None:
            exchange.close()
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
