"""Verilog output of the aggregator (`inwire verilog`)."""

from amaranth.back import rtlil, verilog

from inwire.model import AggregatorConfig

from . import mutants
from .aggregator import Aggregator

TOP = "inwire_aggregator"


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
    # Amaranth's own Yosys script, with write_verilog's -sv option (amaranth 0.5 has no public knob).
    return verilog._convert_rtlil_text(rtlil.convert(aggregator, name=TOP, emit_src=False),
                                       write_verilog_opts=("-sv",))
