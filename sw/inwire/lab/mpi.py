"""One rank of the lab's MPI baseline, started by `mpirun` in its city's namespace: `MPI_Allreduce` of Open MPI
(Debian's, through mpi4py) over TCP across the emulated network, with its algorithm chosen by the MCA
parameters the lab passes (`ALGORITHMS`).

`python -m inwire.lab.mpi --elements E --reps K --margin S` sums a float32 vector of E elements once to warm
up, then K times: a barrier, rank 0 names a start time `margin` seconds ahead (broadcast), every rank waits
for it and runs one all-reduce. Each rank prints one JSON line: its repetitions' start and end times and
the largest difference of the sum from float64 numpy's. The vectors are the gloo baseline's.
"""

import argparse
import json
import time

import numpy as np

from .gloo import test_vector

SEGMENT_BYTES = 64 << 10
"""The tree's reduce and broadcast move 64 KiB segments, as the lab's host tree forwards 64 KiB chunks."""
ALGORITHMS = {
    "ring": {"coll_tuned_allreduce_algorithm": "4"},
    "tree": {"coll_tuned_allreduce_algorithm": "2",
             "coll_tuned_reduce_algorithm": "4", "coll_tuned_reduce_algorithm_segmentsize": str(SEGMENT_BYTES),
             "coll_tuned_bcast_algorithm": "5", "coll_tuned_bcast_algorithm_segmentsize": str(SEGMENT_BYTES)},
}
"""Open MPI's tuned all-reduce, locked to one algorithm (`coll_tuned_use_dynamic_rules`): `ring` its ring
(reduce-scatter then all-gather around the ranks), `tree` a reduce to rank 0 then a broadcast from it, each
along a binary tree of the ranks in 64 KiB segments."""


def main(argv=None):
    from mpi4py import MPI

    parser = argparse.ArgumentParser(prog="python -m inwire.lab.mpi")
    parser.add_argument("--elements", type=int, required=True)
    parser.add_argument("--reps", type=int, required=True)
    parser.add_argument("--margin", type=float, required=True)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    world = MPI.COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()
    vector = test_vector(args.seed, rank, args.elements)
    expected = sum(test_vector(args.seed, r, args.elements).astype(np.float64) for r in range(size))
    total = np.empty_like(vector)
    world.Allreduce(vector, total)
    error = float(np.max(np.abs(total - expected)))
    reps = []
    for _ in range(args.reps):
        world.Barrier()
        start = world.bcast(time.time() + args.margin, root=0)
        late = time.time() - start
        time.sleep(max(0.0, -late))
        began = time.time()
        world.Allreduce(vector, total)
        reps.append({"start": start, "began": began, "ended": time.time(), "late_s": max(0.0, late)})
    error = max(error, float(np.max(np.abs(total - expected))))
    print(json.dumps({"rank": rank, "reps": reps, "max_error": error}), flush=True)


if __name__ == "__main__":
    main()
