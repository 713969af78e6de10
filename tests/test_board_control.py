"""The Versa's management port (inwire_hdl.board_control): control records as UART bits on the receive pin
in, the job tables' control writes out; the records come from `job_table.control_records`, as the host's."""

import pathlib
import re
from types import SimpleNamespace

import pytest
from amaranth.hdl import Elaboratable, Fragment, Module
from amaranth.lib import io, wiring
from amaranth.lib.wiring import In
from amaranth.sim import Simulator
from amaranth_boards.versa_ecp5 import VersaECP5Platform

from inwire_hdl.board import InwireBoard
from inwire_hdl.board_build import CORES
from inwire_hdl.board_control import BAUD, BOARD_CONFIG, ControlReceiver, bit_cycles
from inwire_hdl.job_table import (
    JOB_WORDS,
    RECORD_BYTES,
    RECORD_PREAMBLE,
    RECORD_SYNC,
    ControlMap,
    control_records,
)

CYCLES = 8
"""Clock cycles per bit in simulation: the receiver's timing at a tenth of the real 271."""
MAP = ControlMap(BOARD_CONFIG.limits.jobs, BOARD_CONFIG.limits.members)


def uart_bits(data, stop_bits=None):
    """Line levels, one per bit time, of `data` sent 8N1 (`stop_bits`: a level per byte, default high)."""
    levels = []
    for index, byte in enumerate(data):
        stop = 1 if stop_bits is None else stop_bits[index]
        levels += [0, *((byte >> bit) & 1 for bit in range(8)), stop]
    return levels


def received_writes(levels, *, address_bits=MAP.address_bits, skew=1.0, cycles=CYCLES):
    """The writes the receiver makes while the pin takes `levels` (each `skew` bit times of the receiver,
    whose bits last `cycles` clock cycles)."""
    dut = ControlReceiver(address_bits, BAUD * cycles)
    sim = Simulator(dut)
    sim.add_clock(1e-6)
    # Whole cycles per bit, rounded so that a skewed sender drifts as a real one does.
    ends = [round((index + 1) * cycles * skew) for index in range(len(levels))]
    writes = on_the_line(sim, dut.rx, levels, ends, cycles, (dut.ctl_we, dut.ctl_addr, dut.ctl_data))
    sim.run_until(1e-6 * (len(levels) * cycles * skew + 8 * cycles))
    return writes


def on_the_line(sim, pin, levels, ends, cycles, control):
    """Adds to `sim` a line that holds `pin` idle for 3 `cycles`, then level i until cycle `ends[i]` after that,
    then idle again; returns the list that collects the (address, word) of each write `control` (the we,
    address and data signals) makes."""
    writes = []

    async def line(ctx):
        ctx.set(pin, 1)
        await ctx.tick().repeat(3 * cycles)
        start = 0
        for level, end in zip(levels, ends, strict=True):
            ctx.set(pin, level)
            await ctx.tick().repeat(end - start)
            start = end
        ctx.set(pin, 1)
        await ctx.tick().repeat(3 * cycles)

    async def watch(ctx):
        async for _, _, we, address, word in ctx.tick().sample(*control):
            if we:
                writes.append((address, word))

    sim.add_testbench(line)
    sim.add_process(watch)
    return writes


def job_writes():
    return [(MAP.word(1, "valid"), 0), (MAP.word(1, "job"), 0xDEADBEEF), (MAP.word(1, "token_low"), 0x01234567),
            (MAP.member_words(1, 3)[1], 4791 | 1 << 16), (MAP.clear_address, 15)]


def test_records_become_the_control_writes():
    writes = job_writes()
    assert received_writes(uart_bits(control_records(writes))) == writes


def test_back_to_back_records_on_a_line_slightly_off_rate():
    # The host's clock 2.5 % slow or fast against the receiver's: sampling in the middle of each bit (32
    # cycles here, so that the synchronizer's 3 cycles of delay move the sample little) still finds them all.
    writes = job_writes()[:3]
    for skew in (0.975, 1.025):
        assert received_writes(uart_bits(control_records(writes)), skew=skew, cycles=32) == writes


def test_a_corrupted_record_is_dropped_and_the_next_one_taken():
    writes = job_writes()[:3]
    data = bytearray(control_records(writes))
    second = len(RECORD_PREAMBLE) + RECORD_BYTES
    data[second + 4] ^= 0x10  # a bit of its word
    assert received_writes(uart_bits(data)) == [writes[0], writes[2]]


def test_a_framing_error_drops_its_record():
    writes = job_writes()[:3]
    data = control_records(writes)
    stops = [1] * len(data)
    stops[len(RECORD_PREAMBLE) + RECORD_BYTES + 5] = 0  # a byte of the second record without its stop bit
    assert received_writes(uart_bits(data, stops)) == [writes[0], writes[2]]


def test_resynchronizes_after_garbage_that_holds_sync_bytes():
    writes = job_writes()[:2]
    garbage = bytes([RECORD_SYNC, 0x00, 0x12, RECORD_SYNC, RECORD_SYNC, 0xFF, 0x3C, 0x00, RECORD_SYNC, 0x01])
    cut_short = control_records(writes)[len(RECORD_PREAMBLE):][:5]
    assert received_writes(uart_bits(garbage + cut_short + control_records(writes))) == writes


def test_an_address_beyond_the_tables_is_dropped_not_aliased():
    beyond = (1 << MAP.address_bits) | MAP.word(0, "valid")
    writes = [(beyond, 1), (MAP.word(0, "valid"), 1)]
    assert received_writes(uart_bits(control_records(writes))) == [writes[1]]


def test_control_records_refuse_what_a_record_cannot_carry():
    with pytest.raises(ValueError, match="address 65536: a record carries 16 bits"):
        control_records([(1 << 16, 0)])
    with pytest.raises(ValueError, match="word 4294967296 at address 3: a record carries 32 bits"):
        control_records([(3, 1 << 32)])


def test_the_core_clock_times_the_baud_rate():
    assert bit_cycles(31.25e6) == 271
    with pytest.raises(ValueError, match="cannot time 115200 baud"):
        bit_cycles(300e3)


def test_the_register_map_in_docs_is_the_control_maps():
    doc = (pathlib.Path(__file__).resolve().parents[1] / "docs" / "board.md").read_text()
    assert MAP.markdown() in doc
    # The table's addresses, read back as a board's management side would, are ControlMap's (the Versa's
    # table comes before the one of a core with routes).
    doc = doc.split("A core built with clique routes")[0]
    rows = {name: (int(stride), int(offset)) for stride, offset, name in
            re.findall(r"^\| (\d+)·e \+ (\d+) \| `(\w+)` \|", doc, re.MULTILINE)}
    assert set(rows) == set(JOB_WORDS)
    for index in range(MAP.jobs):
        for name, (stride, offset) in rows.items():
            assert stride * index + offset == MAP.word(index, name)
        (stride, address_first), = re.findall(r"^\| (\d+)·e \+ (\d+) \+ 2·m \| member m address", doc, re.MULTILINE)
        (_, port_first), = re.findall(r"^\| (\d+)·e \+ (\d+) \+ 2·m \| member m port", doc, re.MULTILINE)
        for member in range(MAP.members):
            assert MAP.member_words(index, member) == (int(stride) * index + int(address_first) + 2 * member,
                                                       int(stride) * index + int(port_first) + 2 * member)
    assert re.search(rf"^\| {MAP.clear_address} \| clear \|", doc, re.MULTILINE)


class ControlPortsOnly(wiring.Component):
    """A core as the management port sees it: the job tables' control ports."""

    ctl_we: In(1)
    ctl_addr: In(MAP.address_bits)
    ctl_data: In(32)

    def elaborate(self, platform):
        return Module()


class UartPlatform:
    """A platform whose only resource is the UART, its receive pin a simulation port."""

    def __init__(self):
        self.rx = io.SimulationPort("i", 1)
        self.requested = []

    def request(self, name, number, dir):
        self.requested.append((name, number, dir))
        return SimpleNamespace(rx=self.rx)


def test_the_board_top_wires_its_uart_to_the_cores_control_ports():
    # The slowest core clock the PLL gives (500 MHz / 128), so that a bit is 34 cycles.
    board, platform, core = InwireBoard(core_div=128), UartPlatform(), ControlPortsOnly()

    class Top(Elaboratable):
        def elaborate(self, _):
            m = Module()
            m.submodules.core = core
            board._management_port(m, platform, core)
            return m

    cycles = round(board.core_hz / BAUD)
    writes = job_writes()[:2]
    levels = uart_bits(control_records(writes))
    sim = Simulator(Top())
    sim.add_clock(1 / board.core_hz)
    received = on_the_line(sim, platform.rx.i, levels, [(index + 1) * cycles for index in range(len(levels))],
                           cycles, (core.ctl_we, core.ctl_addr, core.ctl_data))
    sim.run_until((len(levels) + 6) * cycles / board.core_hz)
    assert platform.requested == [("uart", 0, "-")]
    assert received == writes


def test_the_versa_build_with_job_tables_gets_its_management_port_and_the_others_none():
    core = CORES["aggregator-jobs"]()(8)
    assert core.config == BOARD_CONFIG and BOARD_CONFIG.registered and BOARD_CONFIG.unregistered
    assert core.job_tables.map == MAP and len(core.ctl_addr) == MAP.address_bits
    with_tables = Fragment.get(InwireBoard(CORES["aggregator-jobs"]()), VersaECP5Platform())
    assert {"management", "uart_rx"} <= {name for _, name, *_ in with_tables.subfragments}
    for other in ("aggregator", "passthrough"):
        top = Fragment.get(InwireBoard(CORES[other]()), VersaECP5Platform())
        names = [name for _, name, *_ in top.subfragments]
        assert "core" in names and "management" not in names and "uart_rx" not in names, other
