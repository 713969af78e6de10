"""Measurements for the benchmark: throughput under saturation, cut-through latency, simulation speed.

Results go to the JSON file named by INWIRE_BENCH_OUT. Every run is also checked against the model, so a
figure is never reported for wrong output.
"""

import json
import os
import time

import cocotb
from cocotb.triggers import RisingEdge

from inwire.protocol import FRAME_HEADER_BYTES, Opcode

from .testbench import TB
from .traffic import ABOVE_IP, BELOW_IP, Traffic, below


class BeatMonitor:
    """Counts accepted input beats and output beats per cycle; notes when payload beats first pass."""

    def __init__(self, tb):
        self.tb = tb
        self.header_beats = FRAME_HEADER_BYTES // tb.width
        self.reset()
        cocotb.start_soon(self._run())

    def reset(self):
        self.in_beats = self.out_beats = 0
        self.first_in = self.last_in = None
        self.in_index = self.out_index = 0
        self.in_frames = 0
        self.payload_in = {}
        self.payload_out = []

    async def _run(self):
        dut = self.tb.dut
        while True:
            await RisingEdge(dut.clk)
            cycle = self.tb.cycles
            if dut.s_axis_tvalid.value == 1 and dut.s_axis_tready.value == 1:
                self.in_beats += 1
                self.first_in = cycle if self.first_in is None else self.first_in
                self.last_in = cycle
                if self.in_index == self.header_beats:
                    self.payload_in[self.in_frames] = cycle
                self.in_index += 1
                if dut.s_axis_tlast.value == 1:
                    self.in_index = 0
                    self.in_frames += 1
            if dut.m_axis_tvalid.value == 1 and dut.m_axis_tready.value == 1:
                self.out_beats += 1
                if self.out_index == self.header_beats:
                    self.payload_out.append(cycle)
                self.out_index = 0 if dut.m_axis_tlast.value == 1 else self.out_index + 1

    def accepted_per_cycle(self):
        return self.in_beats / (self.last_in - self.first_in + 1)


def scenarios(traffic, config):
    """Named frame streams, each sent back to back with an always-ready sink."""
    count = min(64, config.max_elements)
    fanin = config.max_fanin
    same_slot = [frame for round_ in range(4)
                 for frame in traffic.clique(16, fanin, slot=0, job=1, round=round_ + 1)]
    # Long enough that the trailer beats of the results overflow the beat FIFO's slack: the sustained cost.
    completing = [frame for index in range(64)
                  for frame in traffic.clique(count, 4, slot=index % config.slots, job=2, round=index + 1)]
    foreign = [frame for _ in range(20) for frame in traffic.foreign()]
    requests = traffic.clique(count, 2, slot=1, job=3, round=1)
    requests += [traffic.request(Opcode.RESULT_REQUEST, slot=1, job=3, round=1, fanin=2, count=count)] * 40
    shortest = [traffic.foreign()[0]] * 200
    return {"same_slot_back_to_back": same_slot, "completing_cliques": completing, "foreign": foreign,
            "shortest_frames": shortest, "result_requests": requests,
            "partials_completing_at_root": partial_sums(traffic, config, count, root=True),
            "partials_sent_up": partial_sums(traffic, config, count, root=False)}


def partial_sums(traffic, config, count, root, rounds=64):
    """Two-level trees of 4 members, back to back. `root`: the aggregator is the root and sums member 3's
    contribution and then the partial (trailer included) of the level below (members 0 to 2), which
    completes the result: the partial is as long as the result, so no beat is inserted. Otherwise it is the
    level below for members 0 and 1 and sends their partial up, a trailer beat longer than the completing
    contribution, as a result is."""
    frames = []
    for index in range(rounds):
        common = dict(fanin=4, slot=index % config.slots, job=4 + root, round=index + 1)
        vectors = [traffic.elements(count) for _ in range(4)]
        if root:
            leaves = [traffic.contribution(vectors[s], sender=s, ip_dst=BELOW_IP, expect=0b0111, hop1=config.ip,
                                           **common) for s in range(3)]
            frames += [traffic.contribution(vectors[3], sender=3, **common)] + below(config, BELOW_IP, leaves)
        else:
            frames += [traffic.contribution(vectors[s], sender=s, expect=0b0011, hop1=ABOVE_IP, **common)
                       for s in range(2)]
    return frames


@cocotb.test()
async def bench(dut):
    tb = TB(dut, seed=99)
    await tb.reset()
    traffic = Traffic(tb.config, seed=99)
    monitor = BeatMonitor(tb)
    report = {"throughput": {}}

    # Latency with nothing else in flight: the completing contribution's first payload beat in to the
    # result's first payload beat out.
    clique = traffic.clique(min(64, tb.config.max_elements), 3, slot=2, job=9, round=9)
    await tb.send(clique[:2])
    await tb.drain(quiet_cycles=50)
    monitor.reset()
    await tb.send(clique[2:])
    await tb.drain(quiet_cycles=50)
    report["latency_cycles"] = monitor.payload_out[0] - monitor.payload_in[0]

    total_cycles, wall = 0, 0.0
    for name, frames in scenarios(traffic, tb.config).items():
        monitor.reset()
        start_cycles, start_wall = tb.cycles, time.perf_counter()
        await tb.send(frames)
        await tb.source.wait()
        total_cycles += tb.cycles - start_cycles
        wall += time.perf_counter() - start_wall
        await tb.drain(quiet_cycles=50)
        report["throughput"][name] = {
            "accepted_beats_per_cycle": round(monitor.accepted_per_cycle(), 4),
            "beats_in": monitor.in_beats, "beats_out": monitor.out_beats,
            "cycles": monitor.last_in - monitor.first_in + 1,
        }
    await tb.check()
    report["cycles_per_second"] = round(total_cycles / wall)
    with open(os.environ["INWIRE_BENCH_OUT"], "w") as out:
        json.dump(report, out)
