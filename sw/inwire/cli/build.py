"""Build a board bitstream with the open flow: Yosys, nextpnr-ecp5 and ecppack (YoWASP unless YOSYS,
NEXTPNR_ECP5 and ECPPACK are set). Writes OUT_DIR/inwire_board.bit and OUT_DIR/report.json, prints the report
and exits with status 1 when a clock misses its constraint."""

import json
import math
import sys
from pathlib import Path

from inwire_hdl import board_build
from inwire_hdl.board import PLL_VCO_HZ

from .. import progress
from ..simulators import DATA_WIDTHS
from .options import BOARD_WIDTH, check_seed, decimal, earlier_spelling, whole


def add_arguments(parser):
    parser.add_argument("--board", choices=sorted(board_build.BOARDS), default="versa_ecp5",
                        help="board to build for")
    parser.add_argument("--core", choices=sorted(board_build.CORES), default="aggregator",
                        help="what the board carries between its ports")
    parser.add_argument("--width", type=whole("--width"), default=BOARD_WIDTH,
                        help=f"core data width in bytes: {', '.join(map(str, DATA_WIDTHS))}")
    # 31.25 MHz x 8 bytes = 2 Gb/s covers one 1 GbE port with room for result multicasts, and lies
    # within what the aggregator reaches on the ECP5-45 (see docs/board.md).
    parser.add_argument("--core-mhz", type=decimal("--core-mhz"), default=31.25,
                        help=f"core clock, {PLL_VCO_HZ / 1e6:g} MHz divided by an integer from 4 to 128")
    parser.add_argument("--out-dir", type=Path, default=Path("build/board"), help="folder for the build")
    earlier_spelling(parser, "out_dir", "--out", type=Path)
    parser.add_argument("--seed", type=whole("--seed"), default=board_build.DEFAULT_SEED,
                        help="nextpnr's placement seed")


def run(args):
    if not (args.core_mhz > 0 and math.isfinite(args.core_mhz)):
        raise ValueError(f"--core-mhz must be a positive number of MHz, got {args.core_mhz}")
    if args.width not in DATA_WIDTHS:
        raise ValueError(f"--width must be one of {', '.join(map(str, DATA_WIDTHS))} bytes, got {args.width}")
    # Bounded before rounding: 1e-308 MHz makes the divider infinite.
    divider = PLL_VCO_HZ / (args.core_mhz * 1e6)
    if not 3.5 <= divider < 128.5 or abs(PLL_VCO_HZ / round(divider) - args.core_mhz * 1e6) > 1:
        raise ValueError(f"--core-mhz must be {PLL_VCO_HZ / 1e6:g} MHz divided by an integer from 4 to 128")
    core_div = round(divider)
    check_seed(args.seed, high=2**64 - 1, why="nextpnr's seed has 64 bits")
    progress.say(f"building the {args.board} bitstream ({args.core}, width {args.width}, core {args.core_mhz:g} MHz) "
                 f"with Yosys, nextpnr-ecp5 and ecppack in {args.out_dir}; this takes minutes")
    report = board_build.build(args.board, args.core, data_width=args.width, core_div=core_div, out=args.out_dir,
                               seed=args.seed)
    print(json.dumps(report, indent=2))
    if not report["timing_met"]:
        failed = [name for name, clock in report["clocks"].items() if not clock["met"]]
        print(f"inwire build: timing not met for {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0
