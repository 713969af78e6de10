"""Build a board bitstream with the open flow: Yosys, nextpnr-ecp5 and ecppack (YoWASP unless YOSYS,
NEXTPNR_ECP5 and ECPPACK are set). Writes <out>/inwire_board.bit and <out>/report.json, prints the report
and exits with status 1 when a clock misses its constraint."""

import json
import math
import sys
from pathlib import Path

from inwire_hdl import board_build
from inwire_hdl.board import PLL_VCO_HZ

from .. import progress


def add_arguments(parser):
    parser.add_argument("--board", choices=sorted(board_build.BOARDS), default="versa_ecp5",
                        help="board to build for")
    parser.add_argument("--core", choices=sorted(board_build.CORES), default="aggregator",
                        help="what the board carries between its ports")
    parser.add_argument("--width", type=int, default=8, help="core data width in bytes")
    # 31.25 MHz x 8 bytes = 2 Gb/s covers one 1 GbE port with room for result multicasts, and lies
    # within what the aggregator reaches on the ECP5-45 (see docs/board.md).
    parser.add_argument("--core-mhz", type=float, default=31.25,
                        help=f"core clock, {PLL_VCO_HZ / 1e6:g} MHz divided by an integer from 4 to 128")
    parser.add_argument("--out", type=Path, default=Path("build/board"), help="folder for the build")
    parser.add_argument("--seed", type=int, default=board_build.DEFAULT_SEED, help="nextpnr's placement seed")


def run(args):
    if not (args.core_mhz > 0 and math.isfinite(args.core_mhz)):
        raise ValueError(f"--core-mhz must be a positive number of MHz, got {args.core_mhz}")
    if not 1 <= args.width <= 64:
        raise ValueError(f"--width must lie in [1, 64] bytes, got {args.width}")
    core_div = round(PLL_VCO_HZ / (args.core_mhz * 1e6))
    if not 4 <= core_div <= 128 or abs(PLL_VCO_HZ / core_div - args.core_mhz * 1e6) > 1:
        raise ValueError(f"--core-mhz must be {PLL_VCO_HZ / 1e6:g} MHz divided by an integer from 4 to 128")
    progress.say(f"building the {args.board} bitstream ({args.core}, width {args.width}, core {args.core_mhz:g} MHz) "
                 f"with Yosys, nextpnr-ecp5 and ecppack in {args.out}; this takes minutes")
    report = board_build.build(args.board, args.core, data_width=args.width, core_div=core_div, out=args.out,
                               seed=args.seed)
    print(json.dumps(report, indent=2))
    if not report["timing_met"]:
        failed = [name for name, clock in report["clocks"].items() if not clock["met"]]
        print(f"inwire build: timing not met for {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0
