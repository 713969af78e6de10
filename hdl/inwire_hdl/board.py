"""A bump-in-the-wire board design: two RGMII Ethernet ports with the aggregator between them.

Port A's received frames go through the core and leave on port B; port B's received frames are passed
to port A unchanged. Each port is an `EthMac` (MAC, packet buffers, width converters, async FIFOs); the
core runs in its own clock domain `sync` from the PLL. Any component with the aggregator's flat ports
(`s_axis_t{data,keep,last,valid,ready}`, `m_axis_t{data,keep,last,valid,ready,user}`, `stat_*`) can be
plugged in through `core_factory`; `PassThrough` is the trivial one. A core with the job tables' control
ports (`ctl_we`, `ctl_addr`, `ctl_data`) has them written from the board's UART (`board_control`).
"""

from amaranth.hdl import Cat, ClockDomain, ClockSignal, Const, DomainRenamer, Elaboratable, Instance, Module, Signal
from amaranth.lib import io, wiring
from amaranth.lib.cdc import FFSynchronizer, ResetSynchronizer
from amaranth.lib.wiring import In, Out

from .board_control import ControlReceiver
from .mac import DEFAULT_MAX_FRAME, EthMac
from .rgmii import RgmiiGmii, RgmiiPlatformDDR
from .width import connect_core

PLL_VCO_HZ = 500e6
"""VCO of the ECP5 PLL: 125 MHz for the MACs is VCO/4, and one VCO cycle is exactly 90 degrees of it."""


class PassThrough(wiring.Component):
    """A core that forwards every frame unchanged, with the aggregator's port names."""

    def __init__(self, data_width):
        self.data_width = data_width
        super().__init__({
            "s_axis_tdata": In(8 * data_width), "s_axis_tkeep": In(data_width), "s_axis_tlast": In(1),
            "s_axis_tvalid": In(1), "s_axis_tready": Out(1),
            "m_axis_tdata": Out(8 * data_width), "m_axis_tkeep": Out(data_width), "m_axis_tlast": Out(1),
            "m_axis_tvalid": Out(1), "m_axis_tready": In(1), "m_axis_tuser": Out(1),
            "stat_frames_in": Out(32),
        })

    def elaborate(self, platform):
        m = Module()
        m.d.comb += [
            self.m_axis_tdata.eq(self.s_axis_tdata), self.m_axis_tkeep.eq(self.s_axis_tkeep),
            self.m_axis_tlast.eq(self.s_axis_tlast), self.m_axis_tvalid.eq(self.s_axis_tvalid),
            self.s_axis_tready.eq(self.m_axis_tready),
        ]
        with m.If(self.s_axis_tvalid & self.s_axis_tready & self.s_axis_tlast):
            m.d.sync += self.stat_frames_in.eq(self.stat_frames_in + 1)
        return m


def aggregator_factory(config=None):
    """`core_factory` for the real aggregator with `config` (an `inwire.model.AggregatorConfig`)."""
    from .aggregator import Aggregator

    return lambda data_width: Aggregator(config, data_width)


def passthrough_factory():
    return PassThrough


class EcpPll(Elaboratable):
    """EHXPLLL from a 100 MHz input: CLKOP = 125 MHz (`tx`), CLKOS = 125 MHz at +90 degrees (`tx90`),
    CLKOS2 = VCO / `core_div` (`sync`)."""

    def __init__(self, clk_in, core_div):
        if not 4 <= core_div <= 128:
            raise ValueError(f"core clock divider must lie in [4, 128], got {core_div}")
        self.clk_in = clk_in
        self.core_div = core_div
        self.tx = Signal()
        self.tx90 = Signal()
        self.core = Signal()
        self.locked = Signal()

    def elaborate(self, platform):
        m = Module()
        m.submodules.pll = Instance(
            "EHXPLLL",
            a_FREQUENCY_PIN_CLKI="100", a_FREQUENCY_PIN_CLKOP="125", a_FREQUENCY_PIN_CLKOS="125",
            a_FREQUENCY_PIN_CLKOS2=f"{PLL_VCO_HZ / self.core_div / 1e6:g}",
            a_ICP_CURRENT="12", a_LPF_RESISTOR="8", a_MFG_ENABLE_FILTEROPAMP="1", a_MFG_GMCREF_SEL="2",
            p_PLLRST_ENA="DISABLED", p_INTFB_WAKE="DISABLED", p_STDBY_ENABLE="DISABLED",
            p_DPHASE_SOURCE="DISABLED", p_OUTDIVIDER_MUXA="DIVA", p_OUTDIVIDER_MUXB="DIVB",
            p_OUTDIVIDER_MUXC="DIVC", p_OUTDIVIDER_MUXD="DIVD",
            p_CLKI_DIV=4, p_CLKFB_DIV=5, p_FEEDBK_PATH="CLKOP",
            p_CLKOP_ENABLE="ENABLED", p_CLKOP_DIV=4, p_CLKOP_CPHASE=3, p_CLKOP_FPHASE=0,
            p_CLKOS_ENABLE="ENABLED", p_CLKOS_DIV=4, p_CLKOS_CPHASE=4, p_CLKOS_FPHASE=0,
            p_CLKOS2_ENABLE="ENABLED", p_CLKOS2_DIV=self.core_div, p_CLKOS2_CPHASE=self.core_div - 1,
            p_CLKOS2_FPHASE=0,
            i_RST=0, i_STDBY=0, i_CLKI=self.clk_in, i_CLKFB=self.tx,
            i_PHASESEL0=0, i_PHASESEL1=0, i_PHASEDIR=1, i_PHASESTEP=1, i_PHASELOADREG=1,
            i_PLLWAKESYNC=0, i_ENCLKOP=0,
            o_CLKOP=self.tx, o_CLKOS=self.tx90, o_CLKOS2=self.core, o_LOCK=self.locked,
        )
        return m


class ActivityLed(Elaboratable):
    """Lights for ~50 ms whenever bit 0 of a counter in another domain changes."""

    def __init__(self, counter, hold_cycles):
        self.counter = counter
        self.hold_cycles = hold_cycles
        self.led = Signal()

    def elaborate(self, platform):
        m = Module()
        bit = Signal()
        last = Signal()
        timer = Signal(range(self.hold_cycles + 1))
        m.submodules.sync = FFSynchronizer(self.counter[0], bit)
        m.d.sync += last.eq(bit)
        with m.If(bit != last):
            m.d.sync += timer.eq(self.hold_cycles)
        with m.Elif(timer != 0):
            m.d.sync += timer.eq(timer - 1)
        m.d.comb += self.led.eq(timer != 0)
        return m


class InwireBoard(Elaboratable):
    """The board design. `core_factory(data_width)` builds the core between port A (in) and B (out); by
    default the aggregator of the default configuration. A core with job tables (`board_control.BOARD_CONFIG`,
    `board_build.CORES["aggregator-jobs"]`) gets them written through the UART.

    LEDs: 0 PLL locked, 1 heartbeat of the core clock, 2/3 frames received on port A/B, 4 frames dropped
    by a MAC (bad FCS, runt, oversize, overflow; either port), 5 core input frames, 6 results emitted,
    7 frames the core dropped as malformed or rejected.
    """

    def __init__(self, core_factory=None, *, data_width=8, core_div=16, max_frame=DEFAULT_MAX_FRAME,
                 port_a=0, port_b=1):
        self.core_factory = core_factory or aggregator_factory()
        self.data_width = data_width
        self.core_div = core_div
        self.max_frame = max_frame
        self.port_a = port_a
        self.port_b = port_b

    @property
    def core_hz(self):
        return PLL_VCO_HZ / self.core_div

    def elaborate(self, platform):
        m = Module()
        m.submodules.clk100 = clk100 = io.Buffer("i", platform.request("clk100", 0, dir="-"))
        m.submodules.button = button = io.Buffer("i", platform.request("rst", 0, dir="-"))

        m.submodules.pll = pll = EcpPll(clk100.i, self.core_div)
        for name, clock in (("sync", pll.core), ("tx", pll.tx), ("tx90", pll.tx90)):
            m.domains += ClockDomain(name, reset_less=(name == "tx90"))
            m.d.comb += ClockSignal(name).eq(clock)
        # nextpnr derives the PLL outputs' constraints from clk100's and the PLL parameters.
        not_ready = ~pll.locked | button.i
        for name in ("sync", "tx"):
            m.submodules[f"reset_{name}"] = ResetSynchronizer(not_ready, domain=name)

        macs = {}
        for side, index in (("a", self.port_a), ("b", self.port_b)):
            pins = platform.request("eth_rgmii", index, dir="-")
            rx = f"rx_{side}"
            # Defined here, above every user of the domain; the DDR layer drives its clock.
            m.domains += ClockDomain(rx)
            m.submodules[f"ddr_{side}"] = ddr = RgmiiPlatformDDR(pins, rx_domain=rx)
            m.submodules[f"rgmii_{side}"] = rgmii = RgmiiGmii()
            mac = DomainRenamer({"rx": rx})(EthMac(self.data_width, max_frame=self.max_frame))
            m.submodules[f"mac_{side}"] = mac
            m.submodules[f"reset_{rx}"] = ResetSynchronizer(not_ready, domain=rx)
            wiring.connect(m, ddr.ddr, rgmii.ddr)
            wiring.connect(m, rgmii.gmii_rx, mac.gmii_rx)
            wiring.connect(m, mac.gmii_tx, rgmii.gmii_tx)
            self._phy_reset(m, pins, side)
            macs[side] = mac

        m.submodules.core = core = self.core_factory(self.data_width)
        from .lease import drive_lease_ticks

        drive_lease_ticks(m, core, self.core_hz)
        a, b = macs["a"], macs["b"]
        connect_core(m, core, a.rx_stream, b.tx_stream)
        wiring.connect(m, b.rx_stream, a.tx_stream)
        if hasattr(core, "ctl_we"):
            self._management_port(m, platform, core)

        self._leds(m, platform, pll, core, macs)
        return m

    def _management_port(self, m, platform, core):
        """The job tables' control writes from the USB UART's receive pin (its transmit pin is left alone)."""
        uart = platform.request("uart", 0, dir="-")
        m.submodules.uart_rx = rx = io.Buffer("i", uart.rx)
        m.submodules.management = management = ControlReceiver(len(core.ctl_addr), self.core_hz)
        m.d.comb += [management.rx.eq(rx.i), core.ctl_we.eq(management.ctl_we),
                     core.ctl_addr.eq(management.ctl_addr), core.ctl_data.eq(management.ctl_data)]

    def _phy_reset(self, m, pins, side):
        """Holds the PHY in reset for 2**21 cycles of 125 MHz (16.8 ms) after configuration."""
        m.submodules[f"phy_rst_{side}"] = phy_rst = io.Buffer("o", pins.rst)
        m.submodules[f"phy_mdc_{side}"] = mdc = io.Buffer("o", pins.mdc)
        timer = Signal(22, name=f"phy_reset_timer_{side}")
        with m.If(~timer[-1]):
            m.d.tx += timer.eq(timer + 1)
        m.d.comb += [phy_rst.o.eq(~timer[-1]), mdc.o.eq(0)]

    def _leds(self, m, platform, pll, core, macs):
        hold = int(self.core_hz * 0.05)
        leds = Signal(8)
        for index in range(8):
            m.submodules[f"led_buffer_{index}"] = led = io.Buffer("o", platform.request("led", index, dir="-"))
            m.d.comb += led.o.eq(leds[index])

        def activity(name, counter):
            m.submodules[f"led_{name}"] = led = ActivityLed(counter, hold)
            return led.led

        def stat(name):
            return getattr(core, f"stat_{name}", Const(0, 1))

        heartbeat = Signal(28)
        m.d.sync += heartbeat.eq(heartbeat + 1)
        locked = Signal()
        m.submodules.locked_sync = FFSynchronizer(pll.locked, locked)

        # One increment of any counter toggles the XOR of their bit 0; mixing the two rx domains is
        # harmless for an LED that only shows activity.
        mac_drops = Signal()
        m.d.comb += mac_drops.eq(Cat(*(getattr(mac, f"rx_{name}")[0] for mac in macs.values()
                                       for name in ("bad_fcs", "runts", "oversize", "overflows", "rx_errors"))).xor())
        core_drops = Signal()
        m.d.comb += core_drops.eq(Cat(Const(0, 1), *(getattr(core, name)[0] for name in dir(core)
                                                     if name.startswith("stat_drop_"))).xor())

        m.d.comb += leds.eq(Cat(
            locked,
            heartbeat[-1],
            activity("rx_a", macs["a"].rx_frames_ok),
            activity("rx_b", macs["b"].rx_frames_ok),
            activity("mac_drops", mac_drops),
            activity("core_in", stat("frames_in")),
            activity("results", stat("results_emitted")),
            activity("core_drops", core_drops),
        ))

