"""Model averaging through an inwire aggregator, in rotating cliques (needs the `torch` extra).

`CliqueAverager` follows PyTorch's `PeriodicModelAverager` (torch.distributed.algorithms.model_averaging):
call `average_parameters(model.parameters())` after every optimizer step; every `period` steps the island
averages its parameters with the other members of its clique of the current schedule round. It opens no
torch.distributed process group, so an island's own (gloo) group keeps working beside it.

`UdpCliqueExchange` carries one averaging over UDP to a software aggregator or a board: the vector is
quantized with the codec at an exponent every member derives from the shared bound, cut into chunks, sent,
and the results are awaited with timeout and retransmission. If a result comes back with its overflow flag
set, every member of the clique sees the same flag and all of them send again at twice the bound. A
member whose values do not fit int32 at all at the agreed exponent says so in one extra element at the
end of the vector, the number of bound doublings it needs; the sum of these tells every member how far
to raise the bound for the next attempt.
"""

import ipaddress
import math
import select
import socket
import time

import numpy as np
import torch
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from .codec import choose_exponent, dequantize, quantize
from .datagram import parse_result, payload_of
from .packets import build_frames
from .protocol import INT32_MAX, MAX_FANIN

ATTEMPTS = 8
"""Re-sends at a doubled bound before giving up; also the stride of protocol round numbers per round."""
GROUP_BASE = int(ipaddress.IPv4Address("239.74.0.0"))


class AveragingError(RuntimeError):
    """An averaging round could not finish; the message says which and why."""


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
        values = np.asarray(vector, dtype=np.float32)
        peak = float(np.abs(values).max(initial=0.0))
        bound = self.bound
        for attempt in range(ATTEMPTS):
            exponent = choose_exponent(bound, fanin)
            limit = math.ldexp(INT32_MAX, exponent)
            need = 0 if peak <= limit else math.ceil(math.log2(peak / limit))
            clipped = np.clip(values.astype(np.float64), -limit, limit)
            elements = np.append(quantize(clipped, exponent), np.int32(need))
            sums, overflow = self._sum(round_index * ATTEMPTS + attempt, round_index % 2, clique_index, fanin,
                                       me, exponent, elements)
            doublings = int(sums[-1])
            if not doublings and not overflow:
                return dequantize(sums[:-1], exponent, fanin)
            bound *= 2 ** max(1, doublings)
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


class CliqueAverager:
    """Every `period` steps after `warmup_steps`, average parameters with this island's current clique."""

    def __init__(self, island, rounds, exchange, period, warmup_steps=0):
        named = {member for cliques in rounds for members, _ in cliques for member in members}
        if island not in named:
            raise ValueError(f"the schedule does not name island {island!r}; it names {', '.join(sorted(named))}")
        if period < 1 or warmup_steps < 0:
            raise ValueError(f"period must be at least 1 and warmup_steps not negative, got {period}, {warmup_steps}")
        self.island, self.rounds, self.exchange = island, rounds, exchange
        self.period, self.warmup_steps = period, warmup_steps
        self.step = 0
        self.rounds_done = 0

    def average_parameters(self, params):
        """Call after each optimizer step; returns the clique it averaged with, or None."""
        self.step += 1
        if self.step <= self.warmup_steps or (self.step - self.warmup_steps) % self.period:
            return None
        round_index = self.rounds_done
        self.rounds_done += 1
        cliques = self.rounds[round_index % len(self.rounds)]
        for clique_index, (members, _aggregator) in enumerate(cliques):
            if self.island in members and len(members) > 1:
                params = list(params)
                with torch.no_grad():
                    flat = parameters_to_vector(params).detach().to(torch.float32).numpy()
                    average = self.exchange.average(round_index, clique_index, list(members),
                                                    list(members).index(self.island), flat)
                    vector_to_parameters(torch.from_numpy(average).to(params[0].dtype), params)
                return members
        return None
