"""Write the aggregator gateware as Verilog; its top module is inwire_aggregator (ports clk, rst, s_axis_*,
m_axis_*, stat_*)."""

from pathlib import Path

from .options import gateware_config, gateware_size


def add_arguments(parser):
    from inwire_hdl.aggregator import DATA_WIDTHS

    gateware_size(parser, DATA_WIDTHS)
    parser.add_argument("-o", "--output", required=True, help="Verilog file to write")


def run(args):
    from inwire_hdl.verilog import generate_verilog

    text = generate_verilog(gateware_config(args), args.width)
    output = Path(args.output)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(text)
    return 0
