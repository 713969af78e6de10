"""The `inwire` command."""

import argparse
import json
import pathlib
import sys

from inwire_hdl.board_build import add_build_parser
from inwire_hdl.verilog import add_replay_parser, add_verilog_parser

from . import __version__
from .decode import describe_frame
from .docs import protocol_markdown
from .host_cli import add_demo_parser, add_dissector_parser, add_serve_parser, add_stream_parser
from .pcap import CaptureError, read_frames
from .schedule_cli import add_schedule_parser
from .stream import parse_simulator


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except (CaptureError, OSError, ValueError, RuntimeError) as error:
        print(f"inwire {args.command}: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def build_parser():
    parser = argparse.ArgumentParser(
        prog="inwire", description="In-network gradient aggregation: gateware, verification and host tools.")
    parser.add_argument("--version", action="version", version=f"inwire {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    decode = commands.add_parser("decode", help="print each frame of a capture as a JSON line")
    decode.add_argument("capture", help="pcap or pcapng file of Ethernet frames")
    decode.set_defaults(func=run_decode)

    docs = commands.add_parser("docs", help="print the protocol reference (docs/protocol.md)")
    docs.set_defaults(func=run_docs)

    add_schedule_parser(commands)
    add_verilog_parser(commands)
    add_replay_parser(commands)
    add_build_parser(commands)
    add_serve_parser(commands)
    add_stream_parser(commands)
    add_demo_parser(commands)
    add_dissector_parser(commands)
    add_train_parser(commands)
    return parser


def add_train_parser(commands):
    train = commands.add_parser(
        "train", help="train islands on digits, averaging through inwire under four strategies (needs torch)")
    train.add_argument("--topology", default="doublezero9", help="doublezero9 or a topology file")
    train.add_argument("--islands", default="", help="comma-separated cities (default: all)")
    train.add_argument("--steps", type=int, default=300, help="local SGD steps per island")
    train.add_argument("--period", type=int, default=10, help="local steps between averaging rounds")
    train.add_argument("--strategies", default=",".join(("none", "global", "ring", "schedule")),
                       help="comma-separated among none, global, ring, schedule")
    train.add_argument("--seed", type=int, default=0)
    train.add_argument("--sim", default="", metavar="SIMULATOR[:WIDTH]",
                       help="average through the gateware in co-simulation (icarus or verilator) "
                            "instead of the golden model")
    train.add_argument("--model-mb", type=float, default=0.0,
                       help="plan and charge communication for a model of this size (default: the MLP's own)")
    train.add_argument("--out-dir", default="train", help="where train.json and train.png go")
    train.add_argument("--json", action="store_true", help="print the report as JSON")
    train.set_defaults(func=run_train)


def run_train(args):
    try:
        from .train import training
    except ImportError as error:
        raise ValueError(f"needs the torch extra (pip install 'inwire[torch]'): {error}") from None
    config = training.TrainConfig(
        topology=args.topology, islands=tuple(filter(None, args.islands.split(","))), steps=args.steps,
        period=args.period, seed=args.seed, strategies=tuple(filter(None, args.strategies.split(","))),
        model_bytes=round(args.model_mb * 1e6), sim=parse_simulator(args.sim) if args.sim else ())
    report = training.run_training(config)
    training.write_report(report, pathlib.Path(args.out_dir))
    print(json.dumps(report) if args.json else training.format_report(report))
    return 0


def run_decode(args):
    for index, frame in enumerate(read_frames(args.capture)):
        print(json.dumps({"frame": index, **describe_frame(frame)}))
    return 0


def run_docs(_args):
    sys.stdout.write(protocol_markdown())
    return 0


if __name__ == "__main__":
    sys.exit(main())
