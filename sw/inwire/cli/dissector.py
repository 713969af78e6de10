"""Print the Wireshark Lua dissector for the inwire header, generated from the protocol table."""

import sys

from ..output import atomic_output
from ..wireshark import lua_dissector


def add_arguments(parser):
    parser.add_argument("-o", "--output", default=None, metavar="FILE", help="write to FILE instead of stdout")


def run(args):
    source = lua_dissector()
    if args.output:
        with atomic_output(args.output) as temporary, open(temporary, "w") as handle:
            handle.write(source)
    else:
        sys.stdout.write(source)
    return 0
