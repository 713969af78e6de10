"""Argument types and option groups that several commands share."""

import argparse

from inwire_hdl import parse_simulator


def simulator(text):
    """`parse_simulator` as an argparse type."""
    try:
        return parse_simulator(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def positive_float(text):
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text}")
    return value


def gateware_size(parser, widths):
    """--width, --slots, --elements, --max-fanin and --lease of a gateware build, defaults from the golden
    model."""
    from inwire.model import AggregatorConfig

    defaults = AggregatorConfig()
    parser.add_argument("--width", type=int, default=8, choices=widths, help="data width in bytes")
    parser.add_argument("--slots", type=int, default=defaults.slots, help="aggregation slots")
    parser.add_argument("--elements", type=int, default=defaults.max_elements,
                        help="maximum int32 elements per frame")
    parser.add_argument("--max-fanin", type=int, default=defaults.max_fanin, help="maximum clique size")
    parser.add_argument("--lease", type=int, default=defaults.lease, metavar="TICKS",
                        help="lease_tick pulses (a board makes one per millisecond) without an accepted contribution "
                             "after which an unfinished slot may be claimed by another job (0: never)")


def gateware_config(args):
    """The AggregatorConfig the size options describe."""
    from inwire.model import AggregatorConfig

    try:
        return AggregatorConfig(slots=args.slots, max_elements=args.elements, max_fanin=args.max_fanin,
                                lease=args.lease)
    except TypeError as error:
        raise ValueError(str(error)) from None
