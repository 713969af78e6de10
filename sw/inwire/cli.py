"""The `inwire` command."""

import argparse
import json
import sys

from inwire_hdl.board_build import add_build_parser
from inwire_hdl.verilog import add_replay_parser, add_verilog_parser

from . import __version__
from .decode import describe_frame
from .docs import protocol_markdown
from .host_cli import add_demo_parser, add_dissector_parser, add_serve_parser, add_stream_parser
from .pcap import CaptureError, read_frames
from .schedule_cli import add_schedule_parser


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
    from .train import command

    train = commands.add_parser("train", help="the training study: islands on digits, averaging strategies under "
                                "one deterministic clock, over seeds (needs torch)", description=command.__doc__)
    command.add_arguments(train)
    train.set_defaults(func=command.run)


def run_decode(args):
    for index, frame in enumerate(read_frames(args.capture)):
        print(json.dumps({"frame": index, **describe_frame(frame)}))
    return 0


def run_docs(_args):
    sys.stdout.write(protocol_markdown())
    return 0


if __name__ == "__main__":
    sys.exit(main())
