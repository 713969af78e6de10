"""Model averaging through an inwire aggregator, in rotating cliques (needs the `torch` extra).

`CliqueAverager` goes where PyTorch users put `PeriodicModelAverager` or `HierarchicalModelAverager`
(torch.distributed.algorithms.model_averaging.averagers): the same constructor (`period`, `warmup_steps`,
`process_group`) plus where the island sits in the schedule, and `average_parameters(params)` after every
optimizer step. Every `period` steps after the warmup, the island averages with its clique of the current
schedule round. An island may be a torch.distributed job (a torchrun launch, gloo or NCCL): rank 0 of its
group exchanges with inwire and broadcasts the average inside the group; the group keeps its own
all-reduce for gradients. Optionally the average feeds a DiLoCo-style outer optimizer (`outer.py`).

`UdpCliqueExchange` carries one averaging over UDP to a software aggregator or a board: the vector is
quantized with the codec at an exponent every member derives from the shared bound, cut into chunks, sent,
and the results are awaited with timeout and retransmission. If a result comes back with its overflow flag
set, every member of the clique sees the same flag and all of them send again at twice the bound. A
member whose values do not fit int32 at all at the agreed exponent says so in one extra element at the
end of the vector, the number of bound doublings it needs; the sum of these tells every member how far
to raise the bound for the next attempt. `codec_average` holds that arithmetic, shared with the study.
"""

import ipaddress
import select
import socket
import time

import numpy as np
import torch
from torch.nn.utils import parameters_to_vector

from ..datagram import PAYLOAD_HEADER_BYTES, parse_result, payload_of, set_receive_buffer
from ..packets import build_frames
from ..protocol import MAX_FANIN
from .codec_average import ATTEMPTS, AveragingError, decode, encode
from .outer import OuterOptimizer

__all__ = ["AveragingError", "CliqueAverager", "OuterOptimizer", "UdpCliqueExchange"]
GROUP_BASE = int(ipaddress.IPv4Address("239.74.0.0"))


class UdpCliqueExchange:
    """One island's link to an aggregator at `target` (host, port); it receives results on its own socket."""

    def __init__(self, target, job=1, bound=16.0, chunk=256, slots=256, timeout_s=0.2, deadline_s=30.0,
                 bind=("127.0.0.1", 0)):
        if chunk < 1 or bound <= 0 or timeout_s <= 0 or deadline_s <= 0:
            raise ValueError("chunk, bound, timeout_s and deadline_s must be positive")
        self.target, self.job, self.bound, self.chunk, self.slots = target, job, bound, chunk, slots
        self.timeout_s, self.deadline_s = timeout_s, deadline_s
        self.socket = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.socket.bind(bind)
        # Every chunk is sent at once, so up to slots / 2 results come back in a burst: room for all of them
        # (about 1.3 KiB of kernel overhead each), or the ones beyond the default buffer wait for a resend.
        set_receive_buffer(self.socket, max(1 << 18, (slots // 2) * (PAYLOAD_HEADER_BYTES + 4 * chunk + 4 + 1280)))

    def close(self):
        self.socket.close()

    def average(self, round_index, clique_index, members, me, vector):
        """The clique's average of `vector` (float32), `me` being this island's index in `members`."""
        fanin = len(members)
        if not 1 <= fanin <= MAX_FANIN or not 0 <= me < fanin:
            raise ValueError(f"member {me} of a clique of {fanin} is not a valid clique position")
        chunks = -(-(len(vector) + 1) // self.chunk)
        if 2 * (clique_index + 1) * chunks > self.slots:
            raise AveragingError(f"{chunks} chunks of clique {clique_index} need more than the aggregator's "
                                 f"{self.slots} slots; raise the chunk size")
        bound = self.bound
        for attempt in range(ATTEMPTS):
            exponent, elements = encode(vector, bound, fanin)
            sums, overflow = self._sum(round_index * ATTEMPTS + attempt, round_index % 2, clique_index, fanin,
                                       me, exponent, elements)
            average, bound = decode(sums, overflow, exponent, fanin, bound)
            if average is not None:
                return average
        raise AveragingError(f"round {round_index}: sums still overflow at a bound of {bound}")

    def _sum(self, protocol_round, pool, clique_index, fanin, me, exponent, elements):
        chunks = -(-len(elements) // self.chunk)
        base = (pool * (self.slots // 2)) + clique_index * chunks
        group = GROUP_BASE | (protocol_round % 256) << 8 | clique_index % 256
        payloads = {}
        for index in range(chunks):
            piece = elements[index * self.chunk:(index + 1) * self.chunk]
            frame = build_frames(piece, job=self.job, round=protocol_round, clique=clique_index, slot=base + index,
                                 chunk=index * self.chunk, sender=me, fanin=fanin, exponent=exponent, group=group)
            payloads[index * self.chunk] = payload_of(frame[0])
        sums = np.zeros(len(elements), dtype=np.int64)
        overflow = False
        deadline = time.monotonic() + self.deadline_s
        while payloads:
            if time.monotonic() > deadline:
                raise AveragingError(f"round {protocol_round // ATTEMPTS}, clique {clique_index}: "
                                     f"{len(payloads)} chunks unanswered after {self.deadline_s} s")
            for payload in payloads.values():
                self.socket.sendto(payload, self.target)
            resend_at = time.monotonic() + self.timeout_s
            while payloads and (wait := resend_at - time.monotonic()) > 0:
                if not select.select([self.socket], [], [], wait)[0]:
                    break
                result = parse_result(self.socket.recv(65535))
                if result is None:
                    continue
                header = result.header
                if (header["job"] != self.job or header["round"] != protocol_round
                        or header["clique"] != clique_index or int(header["chunk"]) not in payloads):
                    continue
                offset = int(header["chunk"])
                sums[offset:offset + len(result.elements)] = result.elements
                overflow |= result.overflow
                del payloads[offset]
        return sums, overflow


def _flat_parameters(params):
    """Parameters given as tensors or as optimizer parameter groups (dicts with "params"), as a list."""
    params = list(params)
    if params and isinstance(params[0], dict):
        params = [p for group in params for p in group["params"]]
    return params


def _load(params, vector):
    """Copy a flat vector into the parameters in place, so optimizers and DDP keep their references."""
    offset = 0
    for p in params:
        p.copy_(torch.from_numpy(vector[offset:offset + p.numel()]).view_as(p).to(p.dtype))
        offset += p.numel()


class CliqueAverager:
    """Every `period` steps after `warmup_steps`, average parameters with this island's current clique.

    Same call shape as PyTorch's `PeriodicModelAverager(period, warmup_steps, process_group)`, plus keywords:
    `island` (its name in the schedule), `rounds` (the schedule's rounds of (members, aggregator)),
    `exchange` (a `UdpCliqueExchange`; needed on the group's rank 0 only) and `outer` (an `OuterOptimizer`;
    the default is plain averaging). One difference: PyTorch averages at the first call after the warmup;
    this averager after `period` steps, so a sync never comes before any local step.
    `process_group`: the island's own group; None means the default group if torch.distributed is
    initialized, else a single-process island. Its rank 0 exchanges and broadcasts the average.
    """

    def __init__(self, period, warmup_steps=0, process_group=None, *, island, rounds, exchange=None, outer=None):
        named = {member for cliques in rounds for members, _ in cliques for member in members}
        if island not in named:
            raise ValueError(f"the schedule does not name island {island!r}; it names {', '.join(sorted(named))}")
        if period < 1 or warmup_steps < 0:
            raise ValueError(f"period must be at least 1 and warmup_steps not negative, got {period}, {warmup_steps}")
        self.island, self.rounds, self.exchange = island, rounds, exchange
        self.period, self.warmup_steps = period, warmup_steps
        self.outer = outer or OuterOptimizer()
        self.group = process_group
        distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
        self.distributed = distributed
        self.rank = torch.distributed.get_rank(process_group) if distributed else 0
        self.source = torch.distributed.get_global_rank(process_group or torch.distributed.group.WORLD, 0) \
            if distributed else 0
        if self.rank == 0 and exchange is None:
            raise ValueError("the island's rank 0 needs an exchange to reach inwire")
        self.step = 0
        self.rounds_done = 0
        self.anchor = self.buffer = None
        self.last = None
        """(round index, members, vector sent, average received) of the latest averaging, for logs and checks."""

    def set_anchor(self, params):
        """Start the outer optimizer from these parameters (else from those at the first call)."""
        with torch.no_grad():
            self.anchor = parameters_to_vector(_flat_parameters(params)).detach().to(torch.float32).numpy().copy()

    def average_parameters(self, params):
        """Call after each optimizer step; returns the clique it averaged with, or None."""
        params = _flat_parameters(params)
        if self.anchor is None:
            self.set_anchor(params)
        self.step += 1
        if self.step <= self.warmup_steps or (self.step - self.warmup_steps) % self.period:
            return None
        round_index = self.rounds_done
        self.rounds_done += 1
        cliques = self.rounds[round_index % len(self.rounds)]
        for clique_index, (members, _aggregator) in enumerate(cliques):
            if self.island in members and len(members) > 1:
                members = list(members)
                with torch.no_grad():
                    flat = parameters_to_vector(params).detach().to(torch.float32).numpy().copy()
                    average = self._average(round_index, clique_index, members, flat)
                    self.last = (round_index, members, flat, average)
                    updated, self.buffer = self.outer.step(self.anchor, self.buffer, average)
                    self.anchor = updated
                    _load(params, updated)
                return members
        return None

    def _average(self, round_index, clique_index, members, flat):
        """Rank 0 asks inwire; with a process group it broadcasts the average (or its failure) to the others."""
        error = average = None
        if self.rank == 0:
            try:
                average = self.exchange.average(round_index, clique_index, members, members.index(self.island),
                                                flat)
            except (AveragingError, OSError, ValueError) as failure:
                error = failure
        if not self.distributed:
            if error is not None:
                raise error
            return average
        # A status first, so that the other ranks raise instead of waiting for a vector that never comes.
        status = torch.tensor([0 if error is None else 1], dtype=torch.int32)
        torch.distributed.broadcast(status, src=self.source, group=self.group)
        if int(status) != 0:
            raise error if error is not None else AveragingError(
                f"round {round_index}: rank 0 of island {self.island} could not average with its clique")
        carrier = torch.from_numpy(average.copy()) if average is not None else torch.empty(len(flat))
        torch.distributed.broadcast(carrier, src=self.source, group=self.group)
        return carrier.numpy()
