"""One city's host in the lab's host-side tree all-reduce: TCP to its parent and its children, no aggregator
(the planner's `host-tree` exchange, docs/schedule.md).

`python -m inwire.lab.hosttree --address A --port P --parent HOST:PORT --children N ...` accepts its N
children, connects to its parent (none at the root), then runs `--reps` repetitions, repetition k at the
wall-clock time `start + k * period` (every city shares this machine's clock). In each, the host adds its
own float32 vector and each child's partial chunk by chunk, and sends every summed chunk up as soon as all
its children's have arrived; the root's sums are the result, which comes back down the tree, each host
passing every result chunk on to its children as it arrives. It prints one JSON line: each repetition's
start, end and whether it began late, and the largest difference of its result from float64 numpy's.
"""

import argparse
import json
import queue
import socket
import threading
import time

import numpy as np

from .gloo import test_vector

CHUNK_ELEMENTS = 16384
"""64 KiB of float32 per step of the pipeline: large enough for TCP, small against the vectors."""
CONNECT_TIMEOUT_S = 60


def _receive_into(sock, view, progress, ready):
    """Fill `view` from `sock`, publishing the bytes received so far in progress[0]."""
    filled = 0
    while filled < len(view):
        got = sock.recv_into(view[filled:], len(view) - filled)
        if got == 0:
            raise ConnectionError("the peer closed its connection")
        filled += got
        with ready:
            progress[0] = filled
            ready.notify_all()


class _Sender(threading.Thread):
    """Sends what is queued to one socket, so that a slow child holds back nobody else."""

    def __init__(self, sock):
        super().__init__(daemon=True)
        self.sock, self.pending = sock, queue.Queue()

    def run(self):
        while (data := self.pending.get()) is not None:
            self.sock.sendall(data)
            self.pending.task_done()
        self.pending.task_done()


def all_reduce(own, parent, children, senders):
    """The tree's sum of every host's vector, as this host ends up holding it."""
    elements = len(own)
    partials = [np.empty(elements, dtype=np.float32) for _ in children]
    progress = [[0] for _ in children]
    ready = threading.Condition()
    readers = [threading.Thread(target=_receive_into, args=(sock, memoryview(buffer).cast("B"), done, ready),
                                daemon=True) for sock, buffer, done in zip(children, partials, progress)]
    for reader in readers:
        reader.start()
    total = own.copy()
    result = total if parent is None else np.empty(elements, dtype=np.float32)
    result_progress = [0]
    if parent is not None:
        down = threading.Thread(target=_receive_into, args=(parent, memoryview(result).cast("B"), result_progress,
                                                           ready), daemon=True)
        down.start()
    for first in range(0, elements, CHUNK_ELEMENTS):
        last = min(elements, first + CHUNK_ELEMENTS)
        with ready:
            ready.wait_for(lambda need=4 * last: all(done[0] >= need for done in progress))
        for partial in partials:
            total[first:last] += partial[first:last]
        if parent is not None:
            parent.sendall(total[first:last].tobytes())
        else:
            for sender in senders:
                sender.pending.put(total[first:last].tobytes())
    if parent is not None:
        sent = 0
        while sent < 4 * elements:
            with ready:
                ready.wait_for(lambda have=sent: result_progress[0] > have)
                available = result_progress[0]
            piece = result.view(np.uint8)[sent:available].tobytes()
            for sender in senders:
                sender.pending.put(piece)
            sent = available
        down.join()
    for reader in readers:
        reader.join()
    return result


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m inwire.lab.hosttree")
    parser.add_argument("--address", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--parent", default="", help="HOST:PORT of the parent's host; empty at the root")
    parser.add_argument("--children", type=int, required=True)
    parser.add_argument("--index", type=int, required=True, help="this host's place among the members")
    parser.add_argument("--members", type=int, required=True)
    parser.add_argument("--elements", type=int, required=True)
    parser.add_argument("--reps", type=int, required=True)
    parser.add_argument("--start", type=float, required=True)
    parser.add_argument("--period", type=float, required=True)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    listener = socket.create_server((args.address, args.port))
    listener.settimeout(CONNECT_TIMEOUT_S)
    parent = None
    if args.parent:
        host, port = args.parent.rsplit(":", 1)
        deadline = time.time() + CONNECT_TIMEOUT_S
        while parent is None:
            try:
                parent = socket.create_connection((host, int(port)), timeout=5, source_address=(args.address, 0))
            except OSError:
                if time.time() > deadline:
                    raise
                time.sleep(0.2)
        parent.settimeout(None)
    children = []
    for _ in range(args.children):
        child, _ = listener.accept()
        child.settimeout(None)
        children.append(child)
    senders = [_Sender(child) for child in children]
    for sender in senders:
        sender.start()
    expected = sum(test_vector(args.seed, i, args.elements).astype(np.float64) for i in range(args.members))
    reps, error = [], 0.0
    for k in range(args.reps):
        start = args.start + k * args.period
        late = time.time() - start
        time.sleep(max(0.0, -late))
        began = time.time()
        result = all_reduce(test_vector(args.seed, args.index, args.elements), parent, children, senders)
        ended = time.time()
        for sender in senders:
            sender.pending.join()
        error = max(error, float(np.max(np.abs(result - expected))))
        reps.append({"start": start, "began": began, "ended": ended, "late_s": max(0.0, late)})
    for sender in senders:
        sender.pending.put(None)
        sender.join()
    print(json.dumps({"reps": reps, "max_error": error}), flush=True)


if __name__ == "__main__":
    main()
