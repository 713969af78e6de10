"""Verilog output of the aggregator and the `inwire verilog` / `inwire replay` subcommands."""

import json
import sys
from pathlib import Path

from amaranth.back import rtlil, verilog

from inwire.model import AggregatorConfig

from .aggregator import DATA_WIDTHS, Aggregator

TOP = "inwire_aggregator"


def generate_verilog(config=None, data_width=8, systemverilog=False):
    """Verilog text whose top module `inwire_aggregator` has ports clk, rst, s_axis_*, m_axis_*, stat_*.

    With `systemverilog`, combinational processes are `always_comb` blocks. Plain Verilog needs an
    `if (...) begin end` statement in each `always @*` to run it at time zero; such statements can never
    execute and would count as uncovered lines in coverage.
    """
    aggregator = Aggregator(config or AggregatorConfig(), data_width)
    if not systemverilog:
        return verilog.convert(aggregator, name=TOP, emit_src=False)
    # Amaranth's own Yosys script, with write_verilog's -sv option (amaranth 0.5 has no public knob).
    return verilog._convert_rtlil_text(rtlil.convert(aggregator, name=TOP, emit_src=False),
                                       write_verilog_opts=("-sv",))


def _config(args):
    return AggregatorConfig(slots=args.slots, max_elements=args.elements, max_fanin=args.max_fanin)


def _fail(message):
    print(f"inwire: error: {message}", file=sys.stderr)
    return 2


def _size_options(parser, width_choices=DATA_WIDTHS):
    defaults = AggregatorConfig()
    parser.add_argument("--width", type=int, default=8, choices=width_choices, help="data width in bytes")
    parser.add_argument("--slots", type=int, default=defaults.slots, help="aggregation slots")
    parser.add_argument("--elements", type=int, default=defaults.max_elements,
                        help="maximum int32 elements per frame")
    parser.add_argument("--max-fanin", type=int, default=defaults.max_fanin, help="maximum clique size")


def _verilog_command(args):
    try:
        config = _config(args)
    except (TypeError, ValueError) as error:
        return _fail(str(error))
    text = generate_verilog(config, args.width)
    try:
        output = Path(args.output)
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(text)
    except OSError as error:
        return _fail(f"cannot write {args.output}: {error.strerror or error}")
    return 0


def add_verilog_parser(subparsers):
    parser = subparsers.add_parser("verilog", help="write the aggregator gateware as Verilog",
                                   description="Write Verilog whose top module is inwire_aggregator.")
    _size_options(parser)
    parser.add_argument("-o", "--output", required=True, help="Verilog file to write")
    parser.set_defaults(func=_verilog_command)
    return parser


def _replay_command(args):
    from inwire.pcap import CaptureError, read_frames, write_frames

    from .sim import SimulationError, replay

    try:
        config = _config(args)
    except (TypeError, ValueError) as error:
        return _fail(str(error))
    try:
        frames = read_frames(args.input)
    except CaptureError as error:
        return _fail(str(error))
    try:
        outputs, counters = replay(frames, simulator=args.sim, data_width=args.width, config=config)
    except SimulationError as error:
        return _fail(str(error))
    try:
        write_frames(args.output, outputs)
    except OSError as error:
        return _fail(f"cannot write {args.output}: {error.strerror or error}")
    print(json.dumps(counters, indent=2))
    return 0


def add_replay_parser(subparsers):
    parser = subparsers.add_parser(
        "replay", help="run a capture through the simulated gateware",
        description="Feed every frame of IN.pcap to the simulated aggregator, write what comes out to "
                    "OUT.pcap and print the counters as JSON.")
    parser.add_argument("--sim", choices=("icarus", "verilator"), default="icarus", help="simulator")
    _size_options(parser)
    parser.add_argument("input", metavar="IN.pcap")
    parser.add_argument("output", metavar="OUT.pcap")
    parser.set_defaults(func=_replay_command)
    return parser
