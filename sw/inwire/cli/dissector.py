"""Print the Wireshark Lua dissector for the inwire header, generated from the protocol table."""

import sys

from ..output import atomic_output
from ..wireshark import lua_dissector
from .options import earlier_spelling


def add_arguments(parser):
    parser.add_argument("--out", default=None, metavar="FILE", help="write to FILE instead of stdout")
    earlier_spelling(parser, "out", "-o", "--output")


def run(args):
    source = lua_dissector()
    if args.out:
        with atomic_output(args.out) as temporary, open(temporary, "w") as handle:
            handle.write(source)
    else:
        sys.stdout.write(source)
    return 0
