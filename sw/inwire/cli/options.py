"""Argument types and option groups that several commands share."""

import argparse
import math
import re

from ..simulators import parse_simulator

MAX_MODEL_MB = 1e9
"""Largest model size a command plans or charges for: a petabyte, far beyond any model (and 1e308 MB would
make the byte count infinite)."""


def earlier_spelling(parser, dest, *names, **kwargs):
    """Accept `names`, an option's earlier spellings, for `dest` without showing them in --help; the
    option's own default stays (the first action of a dest sets it)."""
    parser.add_argument(*names, dest=dest, default=argparse.SUPPRESS, help=argparse.SUPPRESS, **kwargs)


def simulator(text):
    """`parse_simulator` as an argparse type."""
    try:
        return parse_simulator(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


WHOLE = re.compile(r"-?[0-9]+")
"""A whole number as the options take it: ASCII digits, a '-' before them at most. int() alone also reads
'1_0' as 10, '٣' (an Arabic-Indic digit) as 3, and ' 3' or '+3'."""
DECIMAL = re.compile(r"[-+]?(([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?|inf|infinity|nan)", re.IGNORECASE)
"""A number as the options take it: ASCII digits with a sign, a decimal point and an exponent, or the words
float() knows (each command refuses infinity and nan with its option's range); float() alone also reads
'1_0' as 10 and other scripts' digits."""
MAX_DIGITS = 40
"""Longer integers are refused by their length: every bound is far below 10^40, and int() of thousands of
digits is refused by Python itself with a message naming no option."""


def whole(option, low=None, high=None, why=None):
    """An argparse type for integer `option`: plain ASCII digits (see WHOLE); in [low, high] where the bounds are
    given (`why` says what sets them), else bounded by its command."""
    def parse(text):
        if not WHOLE.fullmatch(text):
            raise argparse.ArgumentTypeError(f"{option} must be a whole number in the digits 0-9, got {text!r}")
        digits = len(text.lstrip("-"))
        if digits > MAX_DIGITS:
            raise argparse.ArgumentTypeError(f"{option} must be a whole number of at most {MAX_DIGITS} digits, got "
                                             f"one of {digits}")
        value = int(text)
        if high is not None:
            try:
                check_integer(option, value, low, high, why)
            except ValueError as error:
                raise argparse.ArgumentTypeError(str(error)) from None
        return value

    return parse


def parse_decimal(option, text):
    """`text` of number `option` as a float: plain ASCII (see DECIMAL); ValueError naming the option."""
    if not DECIMAL.fullmatch(text):
        raise ValueError(f"{option} must be a number in the digits 0-9 (a point and an exponent allowed), "
                         f"got {text!r}")
    return float(text)


def decimal(option, low=None, high=None, unit=None, why=None):
    """An argparse type for number `option`: plain ASCII (`parse_decimal`); in [low, high] where the bounds are
    given (`unit` and `why` as for `check_range`), else bounded by its command."""
    def parse(text):
        try:
            value = parse_decimal(option, text)
            if high is not None:
                check_range(option, value, low, high, unit, why)
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error)) from None
        return value

    return parse


def check_range(option, value, low, high, unit=None, why=None):
    """`value` of a number option in [low, high], a range `why` explains: where its arithmetic stays finite
    and its value makes sense (a positive bound below excludes what rounds to nothing)."""
    if not low <= value <= high:  # nan too
        raise ValueError(f"{option} must lie in [{low:,.15g}, {high:,.15g}]{' ' + unit if unit else ''}"
                         f"{f' ({why})' if why else ''}, got {value!r}")


def check_integer(option, value, low, high, why=None):
    """`value` of an integer option; ValueError naming the option unless low <= value <= high, `why` saying
    what sets the bound."""
    if not low <= value <= high:
        raise ValueError(f"{option} must lie in [{low:,}, {high:,}]{f' ({why})' if why else ''}, got {value:,}")


def check_seed(value, high=None, why=None):
    """--seed: numpy takes no negative one; `high` where the tool it goes to takes no larger one."""
    if value < 0:
        raise ValueError(f"--seed must be a non-negative integer, got {value}")
    if high is not None:
        check_integer("--seed", value, 0, high, why)


def check_positive(option, value, high=math.inf, unit=None, why=None):
    """`value` of a number option in (0, high]; nan and infinity are refused, a bound `high` says `why`."""
    if not (0 < value <= high and math.isfinite(value)):
        if math.isinf(high):
            raise ValueError(f"{option} must be a positive number{' of ' + unit if unit else ''}, got {value:g}")
        raise ValueError(f"{option} must lie in (0, {high:,.15g}]{' ' + unit if unit else ''}"
                         f"{f' ({why})' if why else ''}, got {value:g}")


BOARD_WIDTH = 8
"""Data width of the board's core (`inwire build`): 8 bytes at 31.25 MHz carry one 1 GbE port."""
SLOTS_WHY = ("the sum memory is 2 banks of slots x elements int32: 16 x 256 is 32 KiB of a board's block RAM, "
             "256 x 256 (inwire serve's) 512 KiB, more than the largest ECP5 has")
"""Why the gateware's slot default is small where the software aggregator's is 256."""


def gateware_size(parser, widths, sized_by=None):
    """--width, --slots, --elements, --max-fanin, --lease and --upstream of a gateware build, defaults from the
    golden model or, with `sized_by` (e.g. "the capture"), left to the command to derive from it. A build
    that is simulated (`sized_by`: replay) has the simulated-gateware commands' width, a written one the
    board's."""
    from inwire.model import AggregatorConfig

    from ..simulators import SIM_DEFAULT_WIDTH

    defaults = AggregatorConfig()
    if sized_by:
        parser.add_argument("--width", type=whole("--width"), default=SIM_DEFAULT_WIDTH, choices=widths,
                            help=f"data width in bytes (default: {SIM_DEFAULT_WIDTH}, as in every simulated-gateware "
                                 f"command: the widest beat takes the fewest simulated cycles)")
        parser.add_argument("--slots", type=whole("--slots"), default=None,
                            help=f"aggregation slots (default: {defaults.slots}, or as many as {sized_by} uses; "
                                 f"{SLOTS_WHY})")
        parser.add_argument("--elements", type=whole("--elements"), default=None,
                            help=f"maximum int32 elements per frame (default: {defaults.max_elements}, or the most "
                                 f"{sized_by} carries)")
    else:
        parser.add_argument("--width", type=whole("--width"), default=BOARD_WIDTH, choices=widths,
                            help=f"data width in bytes (default: {BOARD_WIDTH}, the board's: 8 bytes at 31.25 MHz "
                                 f"carry one 1 GbE port; the simulated-gateware commands use {SIM_DEFAULT_WIDTH})")
        parser.add_argument("--slots", type=whole("--slots"), default=defaults.slots,
                            help=f"aggregation slots (default: {defaults.slots}: {SLOTS_WHY})")
        parser.add_argument("--elements", type=whole("--elements"), default=defaults.max_elements,
                            help="maximum int32 elements per frame")
    parser.add_argument("--max-fanin", type=whole("--max-fanin"), default=defaults.max_fanin,
                        help="maximum clique size")
    parser.add_argument("--lease", type=whole("--lease"), default=defaults.lease, metavar="TICKS",
                        help="lease_tick pulses (a board makes one per millisecond) without an accepted contribution "
                             "after which an unfinished slot may be claimed by another job (0: never)")
    parser.add_argument("--upstream", default=None, metavar="PREFIX",
                        help="IPv4 prefix (A.B.C.D/N) of the aggregators above this one: the only addresses the "
                             "gateware sends a partial to, whatever a frame names (default: the /24 of its address)")


MAX_SUM_WORDS = 1 << 16
"""Largest --slots x --elements generated: a sum memory of 2 banks x 64 Ki int32 (512 KiB). Generation
time and memory grow with it (about 25 s and 600 MB at this size on a loaded 2-core machine; 256 x 2048
took more than 5 minutes)."""


def gateware_config(args):
    """The AggregatorConfig the size options describe, refused up front when it is too large to generate."""
    from inwire.model import AggregatorConfig
    from inwire.protocol import JUMBO_ELEMENTS_PER_FRAME, MAX_FANIN

    if not 1 <= args.elements <= JUMBO_ELEMENTS_PER_FRAME:
        raise ValueError(f"--elements must lie in [1, {JUMBO_ELEMENTS_PER_FRAME}] (8 KiB, the largest frame the "
                         f"board's MAC takes), got {args.elements}")
    if not 1 <= args.slots <= 1 << 16:
        raise ValueError(f"--slots must lie in [1, 65536] (the slot field has 16 bits), got {args.slots}")
    if not 1 <= args.max_fanin <= MAX_FANIN:
        raise ValueError(f"--max-fanin must lie in [1, {MAX_FANIN}], got {args.max_fanin}")
    if args.slots * args.elements > MAX_SUM_WORDS:
        raise ValueError(f"--slots {args.slots} x --elements {args.elements} = {args.slots * args.elements:,} sum "
                         f"words, more than the {MAX_SUM_WORDS:,} a generated core may hold; lower one of them")
    upstream = None
    if args.upstream is not None:
        from inwire.serve import parse_prefix

        upstream = parse_prefix(args.upstream)
    try:
        return AggregatorConfig(slots=args.slots, max_elements=args.elements, max_fanin=args.max_fanin,
                                lease=args.lease, upstream=upstream)
    except TypeError as error:
        raise ValueError(str(error)) from None


def topology_file(spec):
    """The file a --topology value names, None for a built-in topology (for `check_outputs_apart`)."""
    from inwire.plan.topology import BUILTIN_TOPOLOGIES

    return None if spec in BUILTIN_TOPOLOGIES else spec
