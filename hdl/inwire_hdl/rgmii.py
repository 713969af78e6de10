"""RGMII as a thin layer over DDR I/O: GMII bytes <-> nibble pairs.

RGMII carries the low nibble and RX_DV/TX_EN on the rising edge, the high nibble and DV xor ER on the
falling edge. `RgmiiGmii` does only that mapping on "pairs" (rising, falling) of 5 bits
{ctl, d[3:0]}; where the pairs come from is the DDR layer:

* `RgmiiPlatformDDR` uses the platform's DDR buffers (`amaranth.lib.io.DDRBuffer`: IDDRX1F/ODDRX1F on
  ECP5) and forwards the transmit clock from a 90-degree-shifted domain `tx90`, which centres it on
  the data as RGMII without PHY-side delay requires;
* `RgmiiSimDDR` models the same behaviour with a falling-edge register and a clock-selected mux, for
  simulators that lack the vendor primitives (Icarus, Verilator). It is never used in a bitstream.
"""

from amaranth.hdl import Cat, ClockDomain, ClockSignal, Elaboratable, Module, Mux, Signal
from amaranth.lib import io, wiring
from amaranth.lib.wiring import In, Out

from .mac import gmii_rx_signature, gmii_tx_signature


def ddr_signature():
    """Nibble pairs as the MAC side of a DDR layer sees them: rx in domain `rx`, tx in domain `tx`."""
    return wiring.Signature({
        "rx_rise": Out(5), "rx_fall": Out(5),
        "tx_rise": In(5), "tx_fall": In(5),
    })


class RgmiiGmii(wiring.Component):
    """GMII <-> RGMII nibble pairs; purely combinational, so GMII timing is the DDR layer's."""

    def __init__(self):
        super().__init__({
            "ddr": In(ddr_signature()),
            "gmii_rx": Out(gmii_rx_signature()),
            "gmii_tx": In(gmii_tx_signature()),
        })

    def elaborate(self, platform):
        m = Module()
        rise, fall = self.ddr.rx_rise, self.ddr.rx_fall
        m.d.comb += [
            self.gmii_rx.rx_dv.eq(rise[4]),
            self.gmii_rx.rx_er.eq(rise[4] ^ fall[4]),
            self.gmii_rx.rxd.eq(Cat(rise[:4], fall[:4])),
            self.ddr.tx_rise.eq(Cat(self.gmii_tx.txd[:4], self.gmii_tx.tx_en)),
            self.ddr.tx_fall.eq(Cat(self.gmii_tx.txd[4:], self.gmii_tx.tx_en ^ self.gmii_tx.tx_er)),
        ]
        return m


def _subsignal(resource, *names):
    """amaranth-boards names the control pins tx_ctl/rx_ctl on some ports and tx_ctrl/rx_ctrl on others."""
    for name in names:
        if hasattr(resource, name):
            return getattr(resource, name)
    raise AttributeError(f"RGMII resource has none of {names}")


class RgmiiPlatformDDR(wiring.Component):
    """DDR layer on real I/O: `pins` is an RGMII resource requested with dir="-".

    Drives the clock of domain `rx_domain` from the PHY's 125 MHz receive clock; the caller defines that
    domain (and resets it and constrains its frequency: constraints/<board>.lpf), and `tx` and `tx90`.
    """

    def __init__(self, pins, rx_domain="rx"):
        self.pins = pins
        self.rx_domain = rx_domain
        super().__init__({"ddr": Out(ddr_signature())})

    def elaborate(self, platform):
        m = Module()
        pins = self.pins
        rx_ctl = _subsignal(pins, "rx_ctl", "rx_ctrl")
        tx_ctl = _subsignal(pins, "tx_ctl", "tx_ctrl")

        rx = self.rx_domain
        m.submodules.rx_clk = rx_clk = io.Buffer("i", pins.rx_clk)
        m.d.comb += ClockSignal(rx).eq(rx_clk.i)

        m.submodules.rx_data = rx_data = io.DDRBuffer("i", pins.rx_data, i_domain=rx)
        m.submodules.rx_ctl = rx_ctl_buf = io.DDRBuffer("i", rx_ctl, i_domain=rx)
        m.d.comb += [
            self.ddr.rx_rise.eq(Cat(rx_data.i[0], rx_ctl_buf.i[0])),
            self.ddr.rx_fall.eq(Cat(rx_data.i[1], rx_ctl_buf.i[1])),
        ]

        m.submodules.tx_data = tx_data = io.DDRBuffer("o", pins.tx_data, o_domain="tx")
        m.submodules.tx_ctl = tx_ctl_buf = io.DDRBuffer("o", tx_ctl, o_domain="tx")
        m.d.comb += [
            tx_data.o[0].eq(self.ddr.tx_rise[:4]), tx_data.o[1].eq(self.ddr.tx_fall[:4]),
            tx_ctl_buf.o[0].eq(self.ddr.tx_rise[4]), tx_ctl_buf.o[1].eq(self.ddr.tx_fall[4]),
        ]
        m.submodules.tx_clk = tx_clk = io.DDRBuffer("o", pins.tx_clk, o_domain="tx90")
        m.d.comb += [tx_clk.o[0].eq(1), tx_clk.o[1].eq(0)]
        return m


class RgmiiSimDDR(Elaboratable):
    """Simulation model of the DDR layer on plain signals (the RGMII pins of a test harness).

    Receive: the rising-edge sample and the following falling-edge sample form one pair at the next
    rising edge. Transmit: the pair registered at a rising edge of `tx` drives the pins for the high
    and then the low half of that cycle; `tx_clk` is domain `tx90`'s clock, as on the board.
    """

    def __init__(self):
        self.ddr = ddr_signature().create()
        self.rx_data = Signal(4)
        self.rx_ctl = Signal()
        self.tx_data = Signal(4)
        self.tx_ctl = Signal()
        self.tx_clk = Signal()

    def elaborate(self, platform):
        m = Module()
        m.domains.rx_fall = ClockDomain("rx_fall", clk_edge="neg", reset_less=True)
        m.d.comb += ClockSignal("rx_fall").eq(ClockSignal("rx"))
        rise = Signal(5)
        fall = Signal(5)
        m.d.rx += rise.eq(Cat(self.rx_data, self.rx_ctl))
        m.d.rx_fall += fall.eq(Cat(self.rx_data, self.rx_ctl))
        m.d.comb += [self.ddr.rx_rise.eq(rise), self.ddr.rx_fall.eq(fall)]

        tx_rise = Signal(5)
        tx_fall = Signal(5)
        m.d.tx += [tx_rise.eq(self.ddr.tx_rise), tx_fall.eq(self.ddr.tx_fall)]
        pins = Mux(ClockSignal("tx"), tx_rise, tx_fall)
        m.d.comb += [
            Cat(self.tx_data, self.tx_ctl).eq(pins),
            self.tx_clk.eq(ClockSignal("tx90")),
        ]
        return m
