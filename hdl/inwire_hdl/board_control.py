"""The Versa's management port: control records over the board's USB UART to the job tables' `ctl_*` ports.

The host (`inwire job board`, `inwire.board_serial`) sends `job_table.control_records`: per control write a
sync byte, the 16-bit address, the 32-bit word (big endian) and a CRC-8 check byte. `ControlReceiver`
takes them off the UART's receive pin in the core clock domain and writes each good record's word for one
cycle; a record with a bad check byte, an address the tables do not have or a framing error in any of its
bytes is dropped, and the receiver hunts for the next sync byte. The UART is the board's serial console
(FT2232H channel B on the Versa): only who holds that USB cable writes the tables, nothing that arrives on
the Ethernet ports reaches it (docs/board.md, Management port).

The UART receiver is written here: amaranth-stdio, where one would be, is an empty placeholder on PyPI.
"""

from amaranth.hdl import Cat, Module, Signal
from amaranth.lib import wiring
from amaranth.lib.cdc import FFSynchronizer
from amaranth.lib.wiring import In, Out

from inwire.model import AggregatorConfig

from .job_table import GATEWARE_LIMITS, RECORD_BYTES, RECORD_CHECK, RECORD_SYNC

BAUD = 115200
"""The rate every terminal program and the Versa's FT2232H offer without configuration; at it a job of
8 members and 16 slots (40 records) takes 28 ms, and at the 31.25 MHz core clock one bit lasts 271 cycles
(0.1 % off 115200)."""

MAX_BAUD_ERROR = 0.02
"""Sampling mid-bit, a receiver whose bit time is 2 % off is still 40 % of a bit from the edges at the
stop bit."""

BOARD_CONFIG = AggregatorConfig(registered=True, unregistered=True, limits=GATEWARE_LIMITS)
"""The aggregator the Versa build holds: job tables of `GATEWARE_LIMITS`, and version 1 and 2 frames
taken as before (for the lab and captures)."""


def bit_cycles(clock_hz, baud=BAUD):
    """Clock cycles per UART bit; ValueError when the clock cannot time `baud` closely enough."""
    cycles = round(clock_hz / baud)
    if cycles < 4 or abs(clock_hz / cycles / baud - 1) > MAX_BAUD_ERROR:
        raise ValueError(f"a {clock_hz / 1e6:g} MHz clock cannot time {baud} baud within {MAX_BAUD_ERROR:.0%}")
    return cycles


class UartReceiver(wiring.Component):
    """8N1 receiver sampling each bit in its middle: `valid` for one cycle with `data` once a byte's stop
    bit is high, `framing_error` for one cycle when it is low (then it waits for the line to go idle).
    `rx` must already be in this domain."""

    rx: In(1, init=1)
    data: Out(8)
    valid: Out(1)
    framing_error: Out(1)

    def __init__(self, cycles):
        self.cycles = cycles
        super().__init__()

    def elaborate(self, platform):
        m = Module()
        timer = Signal(range(self.cycles))
        bits = Signal(range(8))
        shift = Signal(8)
        m.d.sync += [self.valid.eq(0), self.framing_error.eq(0)]
        with m.If(timer != 0):
            m.d.sync += timer.eq(timer - 1)
        with m.FSM():
            with m.State("idle"):
                with m.If(~self.rx):
                    m.d.sync += timer.eq(self.cycles // 2 - 1)
                    m.next = "start"
            with m.State("start"):
                with m.If(timer == 0):
                    # High again in the middle of the start bit: a glitch, not a byte.
                    with m.If(self.rx):
                        m.next = "idle"
                    with m.Else():
                        m.d.sync += [timer.eq(self.cycles - 1), bits.eq(0)]
                        m.next = "data"
            with m.State("data"):
                with m.If(timer == 0):
                    m.d.sync += [shift.eq(Cat(shift[1:], self.rx)), timer.eq(self.cycles - 1), bits.eq(bits + 1)]
                    with m.If(bits == 7):
                        m.next = "stop"
            with m.State("stop"):
                with m.If(timer == 0):
                    with m.If(self.rx):
                        m.d.sync += [self.data.eq(shift), self.valid.eq(1)]
                        m.next = "idle"
                    with m.Else():
                        m.d.sync += self.framing_error.eq(1)
                        m.next = "break"
            with m.State("break"):
                with m.If(self.rx):
                    m.next = "idle"
        return m


class ControlReceiver(wiring.Component):
    """Control records from the UART pin `rx` (asynchronous: synchronized here) to `ctl_we` (one cycle per
    good record), `ctl_addr` and `ctl_data`, for tables of `address_bits` address bits in a `clock_hz`
    domain (see the module's docstring)."""

    def __init__(self, address_bits, clock_hz, baud=BAUD):
        if not 1 <= address_bits <= 16:
            raise ValueError(f"a control record carries a 16-bit address, the tables take {address_bits} bits")
        self.address_bits = address_bits
        self.cycles = bit_cycles(clock_hz, baud)
        super().__init__({"rx": In(1, init=1), "ctl_we": Out(1), "ctl_addr": Out(address_bits),
                          "ctl_data": Out(32)})

    def elaborate(self, platform):
        m = Module()
        rx = Signal(init=1)
        m.submodules.rx_sync = FFSynchronizer(self.rx, rx, init=1)
        m.submodules.uart = uart = UartReceiver(self.cycles)
        m.submodules.check = check = RECORD_CHECK.create()
        m.d.comb += [uart.rx.eq(rx), check.data.eq(uart.data)]
        payload_bytes = RECORD_BYTES - 2
        payload = Signal(8 * payload_bytes)
        received = Signal(range(payload_bytes))
        address, word = payload[32:], payload[:32]
        m.d.sync += self.ctl_we.eq(0)
        with m.FSM():
            with m.State("hunt"):
                with m.If(uart.valid & (uart.data == RECORD_SYNC)):
                    m.d.comb += check.start.eq(1)
                    m.d.sync += received.eq(0)
                    m.next = "payload"
            with m.State("payload"):
                with m.If(uart.framing_error):
                    m.next = "hunt"
                with m.Elif(uart.valid):
                    m.d.comb += check.valid.eq(1)
                    m.d.sync += [payload.eq(Cat(uart.data, payload[:-8])), received.eq(received + 1)]
                    with m.If(received == payload_bytes - 1):
                        m.next = "check"
            with m.State("check"):
                with m.If(uart.framing_error):
                    m.next = "hunt"
                with m.Elif(uart.valid):
                    with m.If((uart.data == check.crc) & (address >> self.address_bits == 0)):
                        m.d.sync += [self.ctl_we.eq(1), self.ctl_addr.eq(address), self.ctl_data.eq(word)]
                    m.next = "hunt"
        return m


def board_writes(entries):
    """The control writes that make a board built with `BOARD_CONFIG` hold exactly the jobs `entries`
    (JobEntry, in entry order), whatever it held before: every entry invalidated and every slot emptied,
    then each job installed; and [(job, entry index, first slot, slots)]. A job the tables cannot hold raises
    `JobTableError` before any write is made."""
    from inwire.model import Aggregator

    from .job_table import GatewareJobs

    seen = set()
    for entry in entries:
        if entry.job in seen:
            raise ValueError(f"job {entry.job} is given twice: the board's tables hold a job once")
        seen.add(entry.job)
    jobs = GatewareJobs(Aggregator(BOARD_CONFIG))
    writes = [(jobs.map.word(index, "valid"), 0) for index in range(jobs.map.jobs)]
    writes += [(jobs.map.clear_address, slot) for slot in range(BOARD_CONFIG.slots)]
    placed = []
    for entry in entries:
        writes += jobs.install(entry)
        placed.append((entry.job, jobs.index[entry.job], jobs.model.jobs.bases[entry.job], entry.slots))
    return writes, placed
