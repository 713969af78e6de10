"""Subcommands of the host tools: `serve`, `stream`, `demo` and `dissector`.

Each `add_*_parser(subparsers)` registers one subcommand whose `func(args)` returns the exit code; a
user error becomes one line on stderr and exit status 2, never a traceback.
"""

import argparse
import functools
import sys

from .protocol import INWIRE_PORT


def _guarded(name, function):
    """`function(args)`, with the errors a user can cause turned into one line and exit status 2."""
    from inwire_hdl.sim import SimulationError

    from .iface import IfaceError
    from .netns import LabError
    from .pcap import CaptureError
    from .serve import ServeError
    from .stream import StreamError

    @functools.wraps(function)
    def guarded(args):
        try:
            return function(args)
        except (ServeError, StreamError, LabError, CaptureError, SimulationError, IfaceError, OSError,
                ValueError) as error:
            print(f"inwire {name}: {error}", file=sys.stderr)
            return 2
        except KeyboardInterrupt:
            return 130
    return guarded


def _positive_float(text):
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text}")
    return value


def _simulator(text):
    from .stream import parse_simulator

    try:
        return parse_simulator(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def add_serve_parser(subparsers):
    from . import serve
    parser = subparsers.add_parser("serve", help="run the software aggregator (the golden model) as a UDP service")
    parser.add_argument("--listen", default=f"127.0.0.1:{INWIRE_PORT}", metavar="HOST:PORT",
                        help=f"address and UDP port to receive contributions on (default 127.0.0.1:{INWIRE_PORT}; "
                             "port 0 picks a free one)")
    parser.add_argument("--stats-interval", type=float, default=None, metavar="S",
                        help="log the counters every S seconds")
    parser.add_argument("--unicast", action="store_true",
                        help="send each result to every member's own address instead of the multicast group "
                             "(where multicast is not routable, e.g. on one machine)")
    parser.add_argument("--multicast-iface", default=None, metavar="ADDR",
                        help="send multicast results out of the interface with this IPv4 address")
    parser.add_argument("--slots", type=int, default=serve.DEFAULT_SLOTS, help="aggregator slots")
    parser.add_argument("--max-elements", type=int, default=serve.DEFAULT_MAX_ELEMENTS,
                        help="largest element count per frame")
    parser.add_argument("--sim", type=_simulator, default=None, metavar="SIMULATOR[:WIDTH]",
                        help="answer with the gateware in co-simulation (icarus or verilator, width 8 to 64) "
                             "instead of the golden model")
    parser.set_defaults(func=_guarded("serve", serve.run))
    return parser


def add_stream_parser(subparsers):
    from . import stream
    parser = subparsers.add_parser("stream", help="run one island per city of a schedule against an aggregator")
    parser.add_argument("--target", required=True, metavar="TARGET",
                        help="udp://HOST:PORT, pcap:FILE, sim:icarus|verilator[:WIDTH] or iface:NAME")
    parser.add_argument("--schedule", required=True, metavar="FILE", help="schedule JSON (inwire schedule)")
    parser.add_argument("--rounds", type=int, default=4, metavar="N", help="rounds to run (default 4)")
    parser.add_argument("--elements", type=int, default=1024, metavar="N", help="gradient elements per island")
    parser.add_argument("--seed", type=int, default=0, metavar="S", help="seed of the test gradients and of --loss")
    parser.add_argument("--loss", type=float, default=0.0, metavar="P",
                        help="drop this fraction of outgoing datagrams on purpose")
    parser.add_argument("--window", type=int, default=stream.DEFAULT_WINDOW, metavar="W",
                        help="chunks in flight per island")
    parser.add_argument("--timeout-ms", type=float, default=stream.DEFAULT_TIMEOUT_MS, metavar="T",
                        help="retransmit a chunk after T ms without its result")
    parser.add_argument("--retries", type=int, default=stream.DEFAULT_RETRIES, metavar="N",
                        help="retransmissions of one chunk before the round is given up")
    parser.add_argument("--chunk", type=int, default=stream.DEFAULT_CHUNK, metavar="N",
                        help="elements per frame (at most the aggregator's maximum)")
    parser.add_argument("--job", type=int, default=None, metavar="ID",
                        help="job identifier (default: random, or 1 for pcap:)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.set_defaults(func=_guarded("stream", stream.run))
    return parser


def add_demo_parser(subparsers):
    from . import netns
    parser = subparsers.add_parser(
        "demo", help="aggregator and islands in network namespaces, links delayed as in the topology (root)")
    parser.add_argument("--schedule", default=None, metavar="FILE",
                        help="schedule JSON (default: optimize one for doublezero9)")
    parser.add_argument("--rounds", type=int, default=4, metavar="N")
    parser.add_argument("--elements", type=int, default=2048, metavar="N")
    parser.add_argument("--scale", type=_positive_float, default=0.1,
                        help="multiply the topology's latencies by this (default 0.1)")
    parser.add_argument("--loss", type=float, default=0.0, metavar="P")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.set_defaults(func=_guarded("demo", netns.run))
    return parser


def add_dissector_parser(subparsers):
    from . import wireshark
    parser = subparsers.add_parser("dissector", help="print the Wireshark Lua dissector for the inwire header")
    parser.add_argument("-o", "--output", default=None, metavar="FILE", help="write to FILE instead of stdout")
    parser.set_defaults(func=_guarded("dissector", wireshark.run))
    return parser


def run_command(name, argv=None):
    """Parse and run one host subcommand on its own (`python -m inwire.serve ...`)."""
    parser = argparse.ArgumentParser(prog="inwire")
    subparsers = parser.add_subparsers(dest="command", required=True)
    {"serve": add_serve_parser, "stream": add_stream_parser, "demo": add_demo_parser,
     "dissector": add_dissector_parser}[name](subparsers)
    args = parser.parse_args([name, *(sys.argv[1:] if argv is None else argv)])
    return args.func(args)
