"""cocotb tests of one Ethernet port (RGMII <-> EthMac <-> AXI-Stream) against scapy frames.

Expected bytes come from scapy and FCS values from cocotbext-eth's frame builder (zlib.crc32); the gateware
only supplies what is checked. MAC_WIDTH and MAC_MAX_FRAME (environment) describe the harness that was built.
"""

import os
import random
import struct
import zlib

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles, RisingEdge, Timer, with_timeout
from cocotbext.axi import AxiStreamBus, AxiStreamFrame, AxiStreamSink, AxiStreamSource
from cocotbext.eth import GmiiFrame, RgmiiSink, RgmiiSource
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import ARP, Ether

WIDTH = int(os.environ.get("MAC_WIDTH", "1"))
MAX_FRAME = int(os.environ.get("MAC_MAX_FRAME", "9216"))
LINE_NS = 8
CORE_NS = 7 if WIDTH == 1 else 20


class Bench:
    def __init__(self, dut):
        self.dut = dut
        Clock(dut.rgmii_rx_clk, LINE_NS, unit="ns").start()
        Clock(dut.tx_clk, LINE_NS, unit="ns").start()
        Clock(dut.clk, CORE_NS, unit="ns").start()
        self.rx_source = RgmiiSource(dut.rgmii_rxd, dut.rgmii_rx_ctl, dut.rgmii_rx_clk, dut.rst)
        self.tx_sink = RgmiiSink(dut.rgmii_txd, dut.rgmii_tx_ctl, dut.rgmii_tx_clk, dut.rst)
        self.axis_out = AxiStreamSink(AxiStreamBus.from_prefix(dut, "m_axis"), dut.clk, dut.rst)
        self.axis_in = AxiStreamSource(AxiStreamBus.from_prefix(dut, "s_axis"), dut.clk, dut.rst)

    async def start(self):
        # The transmit clock is forwarded a quarter period late, as the board's PLL does.
        await Timer(LINE_NS / 4, unit="ns")
        Clock(self.dut.tx90_clk, LINE_NS, unit="ns").start()
        self.dut.rst.value = 1
        await ClockCycles(self.dut.clk, 10)
        self.dut.rst.value = 0
        await ClockCycles(self.dut.clk, 10)

    async def receive(self, count, timeout_us=400):
        frames = []
        for _ in range(count):
            frame = await with_timeout(self.axis_out.recv(), timeout_us, "us")
            frames.append(bytes(frame.tdata))
        return frames

    async def settle(self, cycles=300):
        await ClockCycles(self.dut.rgmii_rx_clk, cycles)

    def counter(self, name):
        return int(getattr(self.dut, name).value)


def udp_frame(size, seed):
    """An Ethernet/IPv4/UDP frame of exactly `size` bytes before FCS, payload from `seed`."""
    rng = random.Random(seed)
    header = Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:02") / IP(src="10.0.0.1", dst="10.0.0.2")
    header = header / UDP(sport=4000, dport=4001)
    payload = bytes(rng.getrandbits(8) for _ in range(size - len(header)))
    frame = bytes(header / payload)
    assert len(frame) == size
    return frame


def wire(frame, fcs=None):
    """Preamble, SFD, frame and its FCS (cocotbext-eth's, unpadded, unless a wrong `fcs` is given)."""
    if fcs is None:
        return GmiiFrame.from_payload(frame, min_len=0)
    return GmiiFrame.from_raw_payload(frame + struct.pack("<I", fcs))


@cocotb.test()
async def good_frames_are_received_without_fcs(dut):
    bench = Bench(dut)
    await bench.start()
    sizes = [60, 61, 64, 127, 128, 129, 333, 1514]
    frames = [udp_frame(size, seed) for seed, size in enumerate(sizes)]
    for frame in frames:
        await bench.rx_source.send(wire(frame))
    assert await bench.receive(len(frames)) == frames
    await bench.settle()
    assert bench.counter("rx_frames_ok") == len(frames)
    assert bench.counter("rx_bad_fcs") == 0


@cocotb.test()
async def bad_fcs_is_dropped_and_counted(dut):
    bench = Bench(dut)
    await bench.start()
    good = [udp_frame(100, 1), udp_frame(200, 2)]
    bad = udp_frame(150, 3)
    await bench.rx_source.send(wire(good[0]))
    await bench.rx_source.send(wire(bad, fcs=zlib.crc32(bad) ^ 0x00010000))
    corrupted = bytearray(bad)
    corrupted[40] ^= 0x80
    await bench.rx_source.send(wire(bytes(corrupted), fcs=zlib.crc32(bad)))
    await bench.rx_source.send(wire(good[1]))
    assert await bench.receive(2) == good
    await bench.settle()
    assert bench.axis_out.empty()
    assert bench.counter("rx_bad_fcs") == 2
    assert bench.counter("rx_frames_ok") == 2


@cocotb.test()
async def runts_are_dropped_and_counted(dut):
    bench = Bench(dut)
    await bench.start()
    # Good FCS but shorter than the 64-byte minimum: 59 + 4 bytes, 20 + 4, and a 3-byte fragment.
    runts = [bytes(Ether(dst="02:00:00:00:00:02") / ARP())[:59], bytes(range(20)), bytes(range(3))]
    for runt in runts:
        await bench.rx_source.send(wire(runt))
    minimum = udp_frame(60, 7)
    await bench.rx_source.send(wire(minimum))
    assert await bench.receive(1) == [minimum]
    await bench.settle()
    assert bench.axis_out.empty()
    assert bench.counter("rx_runts") == len(runts)
    assert bench.counter("rx_frames_ok") == 1


@cocotb.test()
async def back_to_back_at_minimum_gap(dut):
    bench = Bench(dut)
    await bench.start()
    assert bench.rx_source.ifg == 12
    frames = [udp_frame(60 if index % 2 else 1514 if index % 5 == 0 else 64, 100 + index) for index in range(24)]
    for frame in frames:
        await bench.rx_source.send(wire(frame))
    assert await bench.receive(len(frames)) == frames
    await bench.settle()
    assert bench.counter("rx_frames_ok") == len(frames)
    assert bench.counter("rx_overflows") == 0


@cocotb.test()
async def jumbo_up_to_maximum(dut):
    bench = Bench(dut)
    await bench.start()
    largest = udp_frame(MAX_FRAME - 4, 11)
    too_large = udp_frame(MAX_FRAME - 3, 12)
    after = udp_frame(70, 13)
    for frame in (largest, too_large, after):
        await bench.rx_source.send(wire(frame))
    assert await bench.receive(2, timeout_us=2000) == [largest, after]
    await bench.settle()
    assert bench.counter("rx_oversize") == 1

    for frame in (largest, after):
        await bench.axis_in.send(AxiStreamFrame(frame))
    for frame in (largest, after):
        sent = await with_timeout(bench.tx_sink.recv(), 2000, "us")
        assert sent.get_payload() == frame
        assert sent.check_fcs()


@cocotb.test()
async def transmit_adds_preamble_padding_fcs_and_gap(dut):
    bench = Bench(dut)
    await bench.start()
    arp = bytes(Ether(src="02:00:00:00:00:01", dst="ff:ff:ff:ff:ff:ff") / ARP(pdst="10.0.0.9"))
    frames = [arp, bytes(range(1)), udp_frame(59, 21), udp_frame(60, 22), udp_frame(61, 23)]
    frames += [udp_frame(60 + (17 * index) % 1455, 30 + index) for index in range(16)]

    gaps = []

    async def measure_gaps():
        # Idle byte times between the end of one frame and the start of the next (TX_EN at rising edges).
        idle = None
        while True:
            await RisingEdge(dut.rgmii_tx_clk)
            if int(dut.rgmii_tx_ctl.value):
                if idle:
                    gaps.append(idle)
                idle = 0
            elif idle is not None:
                idle += 1

    cocotb.start_soon(measure_gaps())
    for frame in frames:
        await bench.axis_in.send(AxiStreamFrame(frame))
    for frame in frames:
        sent = await with_timeout(bench.tx_sink.recv(), 400, "us")
        assert sent.get_preamble() == b"\x55" * 7 + b"\xd5"
        padded = frame + bytes(max(0, 60 - len(frame)))
        assert bytes(sent.data[8:]) == padded + struct.pack("<I", zlib.crc32(padded))
        assert sent.error is None or not any(sent.error)
    await bench.settle()
    assert len(gaps) == len(frames) - 1
    # Frames queued back to back leave at exactly the minimum gap.
    assert min(gaps) == 12 and max(gaps) == 12, gaps
    assert bench.counter("tx_frames_sent") == len(frames)
    assert bench.counter("tx_underruns") == 0


@cocotb.test()
async def transmit_drops_aborted_frames(dut):
    bench = Bench(dut)
    await bench.start()
    kept = [udp_frame(90, 41), udp_frame(300, 43)]
    aborted = udp_frame(200, 42)
    await bench.axis_in.send(AxiStreamFrame(kept[0]))
    await bench.axis_in.send(AxiStreamFrame(aborted, tuser=1))
    await bench.axis_in.send(AxiStreamFrame(kept[1]))
    for frame in kept:
        sent = await with_timeout(bench.tx_sink.recv(), 400, "us")
        assert sent.get_payload() == frame
    await bench.settle(1000)
    assert bench.tx_sink.empty()
    assert bench.counter("tx_aborted") == 1
    assert bench.counter("tx_frames_sent") == 2
