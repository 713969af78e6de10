"""One rank of the lab's gloo baseline, run in its city's namespace: `torch.distributed.all_reduce` over TCP
across the emulated network, what users pick instead of inwire.

`python -m inwire.lab.gloo --rank R --world N --master HOST:PORT --elements E --reps K --margin S` joins
the group (GLOO_SOCKET_IFNAME names the city's interface), sums a float32 vector of E elements once to
warm up, then K times: a barrier, rank 0 names a start time `margin` seconds ahead (broadcast), every rank
waits for it and runs one all_reduce. It prints one JSON line: each repetition's start and end times and
the largest difference of the sum from float64 numpy's.
"""

import argparse
import datetime
import json
import time

import numpy as np


def test_vector(seed, rank, elements):
    """The float32 vector of the TCP baselines' member `rank` (gloo's and the host tree's)."""
    return np.random.default_rng([seed, rank, 0x6100]).standard_normal(elements).astype(np.float32)


def main(argv=None):
    import torch
    import torch.distributed as dist

    parser = argparse.ArgumentParser(prog="python -m inwire.lab.gloo")
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world", type=int, required=True)
    parser.add_argument("--master", required=True)
    parser.add_argument("--elements", type=int, required=True)
    parser.add_argument("--reps", type=int, required=True)
    parser.add_argument("--margin", type=float, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=600.0)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://{args.master}", rank=args.rank, world_size=args.world,
                            timeout=datetime.timedelta(seconds=args.timeout))
    vector = torch.from_numpy(test_vector(args.seed, args.rank, args.elements))
    expected = sum(test_vector(args.seed, rank, args.elements).astype(np.float64) for rank in range(args.world))
    warm = vector.clone()
    dist.all_reduce(warm)
    error = float(np.max(np.abs(warm.numpy() - expected)))
    reps = []
    for _ in range(args.reps):
        dist.barrier()
        start = torch.tensor([time.time() + args.margin], dtype=torch.float64)
        dist.broadcast(start, 0)
        start = float(start.item())
        late = time.time() - start
        time.sleep(max(0.0, -late))
        total = vector.clone()
        began = time.time()
        dist.all_reduce(total)
        reps.append({"start": start, "began": began, "ended": time.time(), "late_s": max(0.0, late)})
    dist.destroy_process_group()
    print(json.dumps({"rank": args.rank, "reps": reps, "max_error": error}), flush=True)


if __name__ == "__main__":
    main()
