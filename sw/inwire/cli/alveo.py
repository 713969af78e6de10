"""Write the Verilog of the Alveo U200 100 GbE build: inwire_alveo_core.v (the 64-byte core between two
CMAC AXI-Stream ports) and inwire_alveo_u200.v (the card top). Vivado builds them with
inwire_hdl/constraints/alveo_u200_build.tcl."""

from pathlib import Path


def add_arguments(parser):
    parser.add_argument("--out", type=Path, default=Path("build/alveo"), help="folder to write the Verilog to")


def run(args):
    from inwire_hdl.alveo import write_sources

    for path in write_sources(args.out):
        print(path)
    return 0
