"""The lease timer's ticks from a board's clock."""


from amaranth.hdl import Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import Out

from inwire.model import LEASE_TICK_S


class LeaseTicker(wiring.Component):
    """One `tick` pulse every `cycles` clock cycles: the aggregator's `lease_tick` from the core clock."""

    def __init__(self, cycles):
        if cycles < 1:
            raise ValueError(f"a lease tick lasts at least one cycle, got {cycles}")
        self.cycles = cycles
        super().__init__({"tick": Out(1)})

    def elaborate(self, platform):
        m = Module()
        count = Signal(range(self.cycles))
        m.d.comb += self.tick.eq(count == self.cycles - 1)
        m.d.sync += count.eq(Mux(self.tick, 0, count + 1))
        return m


def drive_lease_ticks(m, core, clock_hz):
    """On a board top: the core's `lease_tick` once per `LEASE_TICK_S` of its `clock_hz` clock, the unit
    `inwire serve` counts in too. A core without leases (the pass-through) is left as it is."""
    if hasattr(core, "lease_tick"):
        m.submodules.lease_ticker = ticker = LeaseTicker(round(clock_hz * LEASE_TICK_S))
        m.d.comb += core.lease_tick.eq(ticker.tick)
