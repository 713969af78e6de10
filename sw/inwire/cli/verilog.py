"""Write the aggregator gateware as Verilog; its top module is inwire_aggregator (ports clk, rst, s_axis_*,
m_axis_*, stat_*)."""

from pathlib import Path

from ..output import atomic_output, check_writable
from .options import gateware_config, gateware_size


def add_arguments(parser):
    from inwire_hdl.aggregator import DATA_WIDTHS

    gateware_size(parser, DATA_WIDTHS)
    parser.add_argument("-o", "--output", required=True, help="Verilog file to write")


def run(args):
    from inwire_hdl.verilog import generate_verilog

    config = gateware_config(args)
    output = Path(args.output)
    output.parent.mkdir(parents=True, exist_ok=True)
    check_writable(output, "--output")
    text = generate_verilog(config, args.width)
    with atomic_output(output) as temporary:
        Path(temporary).write_text(text)
    return 0
