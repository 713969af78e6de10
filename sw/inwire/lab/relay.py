"""The lab's link process: every emulated link's delay (and optional loss), in user space.

This kernel has no `netem`, so the delay of a link cannot be a qdisc. Each direction of a link is a pair of
TUN devices: the sending city's (its qdisc, `tbf`, sets the rate in the kernel) and the receiving city's.
This process holds both ends' file descriptors, reads every IP packet the sending city's kernel dequeues and
writes it into the receiving city's device `delay` seconds later, in order. TCP and UDP cross unmodified.

Run as `python -m inwire.lab.relay`, with the descriptors inherited and one JSON line on stdin:
`{"directions": [[read_fd, write_fd, delay_s, loss], ...], "seed": N}`. It prints `ready` once it
listens; each further line on stdin asks for its counters, which it prints as one JSON line; it ends on
SIGTERM or when stdin closes, printing its counters once more.

The counters: packets `carried` (written into the receiving device), `dropped_on_purpose` (the link's loss),
`write_errors` (the receiving device refused one), `late_max_ms` (the most a packet left after its due
time), and per direction, in the order given, the IP packets carried and their bytes (`packets`, `bytes`:
IP header and everything after it, as the sending city's kernel handed it over).
"""

import collections
import contextlib
import ctypes
import json
import os
import random
import select
import signal
import sys
import time

PACKET_BYTES = 65536
PR_SET_TIMERSLACK = 29
REALTIME_PRIORITY = 10
BURST = 64
"""Packets read from one device before looking at the others: a busy link cannot starve the rest."""


def relay(directions, control, counters, seed=0, report=lambda counters: None):
    """Carry packets until `control` (a readable descriptor) reports end of file, counting in `counters`;
    `report(counters)` for each line read from `control`."""
    rng = random.Random(seed)
    queues = {read_fd: collections.deque() for read_fd, *_ in directions}
    by_fd = {read_fd: (write_fd, delay_s, loss) for read_fd, write_fd, delay_s, loss in directions}
    for read_fd in by_fd:
        os.set_blocking(read_fd, False)
    counters.update(carried=0, dropped_on_purpose=0, write_errors=0, late_max_ms=0.0,
                    packets=[0] * len(directions), bytes=[0] * len(directions))
    direction_of = {read_fd: index for index, (read_fd, *_) in enumerate(directions)}
    watched = [*by_fd, control]
    while True:
        now = time.monotonic()
        heads = [queue[0][0] for queue in queues.values() if queue]
        timeout = max(0.0, min(heads) - now) if heads else None
        ready = select.select(watched, [], [], timeout)[0]
        now = time.monotonic()
        for fd in ready:
            if fd == control:
                requests = os.read(control, 4096)
                if not requests:
                    return
                for _ in range(requests.count(b"\n")):
                    report(counters)
                continue
            write_fd, delay_s, loss = by_fd[fd]
            queue = queues[fd]
            for _ in range(BURST):
                try:
                    packet = os.read(fd, PACKET_BYTES)
                except BlockingIOError:
                    break
                if loss and rng.random() < loss:
                    counters["dropped_on_purpose"] += 1
                    continue
                queue.append((now + delay_s, packet))
        now = time.monotonic()
        for fd, queue in queues.items():
            write_fd, direction = by_fd[fd][0], direction_of[fd]
            while queue and queue[0][0] <= now:
                due, packet = queue.popleft()
                counters["late_max_ms"] = max(counters["late_max_ms"], 1e3 * (now - due))
                try:
                    os.write(write_fd, packet)
                    counters["carried"] += 1
                    counters["packets"][direction] += 1
                    counters["bytes"][direction] += len(packet)
                except OSError:
                    # The receiving device's queue is full or the city is being torn down: a lost packet,
                    # as on a real link.
                    counters["write_errors"] += 1


def main():
    # The kernel may defer a timer by its slack (50 us by default); a link's delay should not. Real-time
    # priority keeps the machine's other programs (the islands, aggregators and gloo among them) from
    # holding packets back: the process sleeps in select between packets, so it takes only what it uses.
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_TIMERSLACK, 1, 0, 0, 0)
    with contextlib.suppress(OSError, AttributeError):
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(REALTIME_PRIORITY))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the lab's owner stops it, after its own Ctrl-C
    config = json.loads(sys.stdin.readline())
    directions = [(int(r), int(w), float(d), float(p)) for r, w, d, p in config["directions"]]
    print("ready", flush=True)
    counters = {}

    def report(counters):
        print(json.dumps(counters), flush=True)

    try:
        relay(directions, sys.stdin.fileno(), counters, config.get("seed", 0), report)
    finally:
        print(json.dumps(counters), flush=True)


if __name__ == "__main__":
    main()
