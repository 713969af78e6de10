"""Write the Verilog of the Alveo U200 100 GbE build: inwire_alveo_core.v (the 64-byte core between two
CMAC AXI-Stream ports) and inwire_alveo_u200.v (the card top). Vivado builds them with
inwire_hdl/constraints/alveo_u200_build.tcl."""

from pathlib import Path

from .options import earlier_spelling


def add_arguments(parser):
    parser.add_argument("--out-dir", type=Path, default=Path("build/alveo"), help="folder to write the Verilog to")
    earlier_spelling(parser, "out_dir", "--out", type=Path)


def run(args):
    from inwire_hdl.alveo import write_sources

    for path in write_sources(args.out_dir):
        print(path)
    return 0
