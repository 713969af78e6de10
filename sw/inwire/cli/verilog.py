"""Write the aggregator gateware as Verilog; its top module is inwire_aggregator (ports clk, rst, s_axis_*,
m_axis_*, stat_*)."""

import sys
from pathlib import Path

from ..output import atomic_output, check_writable
from .options import earlier_spelling, gateware_config, gateware_size


def add_arguments(parser):
    from ..simulators import DATA_WIDTHS

    gateware_size(parser, DATA_WIDTHS)
    parser.add_argument("--out", metavar="FILE", help="Verilog file to write (required)")
    earlier_spelling(parser, "out", "-o", "--output")


def run(args):
    from inwire_hdl.verilog import TOP, generate_verilog

    if args.out is None:
        raise ValueError("--out FILE is required (the Verilog file to write)")
    config = gateware_config(args)
    output = Path(args.out)
    output.parent.mkdir(parents=True, exist_ok=True)
    check_writable(output, "--out")
    text = generate_verilog(config, args.width)
    with atomic_output(output) as temporary:
        Path(temporary).write_text(text)
    # On stderr: the Verilog itself may go to stdout (--out /dev/stdout).
    print(f"inwire verilog: wrote {output}: {len(text.encode()):,} bytes, top module {TOP} ({args.width}-byte data "
          f"path, {config.slots} slots of {config.max_elements} elements)", file=sys.stderr)
    return 0
