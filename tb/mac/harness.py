"""Simulation top for one Ethernet port: RGMII pins (behavioural DDR) <-> EthMac <-> AXI-Stream ports.

The RGMII side runs on the PHY's clocks (rx from the line, tx and its 90-degree copy), the AXI-Stream
side on `clk`, the core clock; every domain resets from `rst`.
"""

from amaranth.back import verilog
from amaranth.hdl import ClockDomain, ClockSignal, Elaboratable, Module, ResetSignal, Signal
from amaranth.lib import wiring

from inwire_hdl.mac import RX_COUNTERS, TX_COUNTERS, EthMac
from inwire_hdl.rgmii import RgmiiGmii, RgmiiSimDDR

AXIS_FIELDS = ("tdata", "tkeep", "tlast", "tuser", "tvalid", "tready")


class MacHarness(Elaboratable):
    def __init__(self, width, max_frame):
        self.width = width
        self.max_frame = max_frame
        self.clocks = {name: Signal(name=name) for name in ("clk", "rst", "rgmii_rx_clk", "tx_clk", "tx90_clk")}
        self.rgmii = {
            "rgmii_rxd": Signal(4, name="rgmii_rxd"),
            "rgmii_rx_ctl": Signal(name="rgmii_rx_ctl"),
            "rgmii_txd": Signal(4, name="rgmii_txd"),
            "rgmii_tx_ctl": Signal(name="rgmii_tx_ctl"),
            "rgmii_tx_clk": Signal(name="rgmii_tx_clk"),
        }
        shapes = {"tdata": 8 * width, "tkeep": width}
        self.m_axis = {f: Signal(shapes.get(f, 1), name=f"m_axis_{f}") for f in AXIS_FIELDS}
        self.s_axis = {f: Signal(shapes.get(f, 1), name=f"s_axis_{f}") for f in AXIS_FIELDS}
        self.counters = {name: Signal(32, name=name) for name in
                         [f"rx_{n}" for n in RX_COUNTERS] + [f"tx_{n}" for n in TX_COUNTERS]}

    def ports(self):
        return [*self.clocks.values(), *self.rgmii.values(), *self.m_axis.values(), *self.s_axis.values(),
                *self.counters.values()]

    def elaborate(self, platform):
        m = Module()
        for domain, clock, reset in (("sync", "clk", True), ("rx", "rgmii_rx_clk", True),
                                     ("tx", "tx_clk", True), ("tx90", "tx90_clk", False)):
            m.domains += ClockDomain(domain, reset_less=not reset)
            m.d.comb += ClockSignal(domain).eq(self.clocks[clock])
            if reset:
                m.d.comb += ResetSignal(domain).eq(self.clocks["rst"])

        m.submodules.ddr = ddr = RgmiiSimDDR()
        m.submodules.rgmii = rgmii = RgmiiGmii()
        m.submodules.mac = mac = EthMac(self.width, max_frame=self.max_frame)
        wiring.connect(m, ddr.ddr, rgmii.ddr)
        wiring.connect(m, rgmii.gmii_rx, mac.gmii_rx)
        wiring.connect(m, mac.gmii_tx, rgmii.gmii_tx)
        m.d.comb += [
            ddr.rx_data.eq(self.rgmii["rgmii_rxd"]),
            ddr.rx_ctl.eq(self.rgmii["rgmii_rx_ctl"]),
            self.rgmii["rgmii_txd"].eq(ddr.tx_data),
            self.rgmii["rgmii_tx_ctl"].eq(ddr.tx_ctl),
            self.rgmii["rgmii_tx_clk"].eq(ddr.tx_clk),
        ]
        for field in AXIS_FIELDS:
            rx_port, tx_port = getattr(mac.rx_stream, field), getattr(mac.tx_stream, field)
            if field == "tready":
                m.d.comb += [rx_port.eq(self.m_axis[field]), self.s_axis[field].eq(tx_port)]
            else:
                m.d.comb += [self.m_axis[field].eq(rx_port), tx_port.eq(self.s_axis[field])]
        for name, signal in self.counters.items():
            m.d.comb += signal.eq(getattr(mac, name))
        return m


def write_verilog(path, width, max_frame):
    harness = MacHarness(width, max_frame)
    path.write_text(verilog.convert(harness, ports=harness.ports(), name="mac_harness"))
    return path
