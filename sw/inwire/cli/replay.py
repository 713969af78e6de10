"""Feed every frame of IN.pcap to the simulated aggregator (cocotb on Icarus Verilog or Verilator), write
what comes out to OUT.pcap, print the counters as JSON and say whether OUT.pcap and the counters equal the
golden model's for the same frames (exit status 1 when they do not). The gateware has the golden model's default
slots and elements per frame, or more where the capture uses more (a capture that needs more than a given
--slots or --elements is refused with the numbers it needs). Simulation builds go to build/sim under the
working directory."""

import json
import sys

from .. import extras, progress
from ..decode import describe_frame
from ..model import Aggregator, AggregatorConfig
from ..output import atomic_output, check_outputs_apart, check_writable
from ..pcap import read_frames, write_frames
from ..protocol import JUMBO_ELEMENTS_PER_FRAME
from ..simulators import SIMULATORS
from .options import MAX_SUM_WORDS, gateware_config, gateware_size


def add_arguments(parser):
    from ..simulators import DATA_WIDTHS

    parser.add_argument("--sim", choices=SIMULATORS, default=SIMULATORS[0], help="simulator")
    gateware_size(parser, DATA_WIDTHS, sized_by="the capture")
    parser.add_argument("input", metavar="IN.pcap", help="capture of the frames to feed in")
    parser.add_argument("output", metavar="OUT.pcap", help="capture of what the gateware sends out")


def capture_needs(frames):
    """(slots, elements per frame) an aggregator needs so that none of the capture's contributions and
    result requests is dropped for its slot or its element count: the highest slot + 1, the largest count;
    then the frames that ask for them (numbered from 0 as by inwire decode; None for a size of 1)."""
    slots = elements = 1
    slot_frame = elements_frame = None
    for index, frame in enumerate(frames):
        described = describe_frame(frame)
        if described["kind"] in ("contribution", "result_request") and described["slot"] + 1 > slots:
            slots, slot_frame = described["slot"] + 1, index
        if described["kind"] == "contribution" and described["count"] > elements:
            elements, elements_frame = described["count"], index
    return slots, elements, slot_frame, elements_frame


def model_agreement(frames, outputs, counters, config, output_name):
    """(whether the gateware's `outputs` and `counters` for `frames` equal the golden model's with `config`,
    one line saying so or naming the first difference)."""
    model = Aggregator(config)
    expected = [answer for frame in frames for answer in model.process(frame)]
    if outputs != expected:
        if len(outputs) != len(expected):
            return False, (f"{output_name} differs from the golden model's output: {len(outputs)} frames where the "
                           f"model sends {len(expected)}")
        first = next(index for index, (got, want) in enumerate(zip(outputs, expected)) if got != want)
        return False, (f"{output_name} differs from the golden model's output: frame {first} of "
                       f"{len(expected)} (numbered from 0)")
    wanted = model.stats()
    if counters != wanted:
        moved = ", ".join(f"{name} {counters.get(name)} where the model has {wanted.get(name)}"
                          for name in sorted(set(counters) | set(wanted)) if counters.get(name) != wanted.get(name))
        return False, f"the counters differ from the golden model's: {moved}"
    return True, f"{output_name} equals the golden model's output ({len(expected)} frames), and so do the counters"


def run(args):
    extras.require("sim", "the simulated gateware")
    check_outputs_apart({"OUT.pcap": args.output}, {"IN.pcap": args.input})
    check_writable(args.output, "OUT.pcap")
    frames = read_frames(args.input)
    # A shorter runt goes in and is counted as drop_runt as in the model; an empty record has no beat to send.
    empty = [index for index, frame in enumerate(frames) if not frame]
    if empty:
        raise ValueError(f"{args.input}: record {empty[0]} is empty ({len(empty)} of its {len(frames)} records "
                         f"are); AXI-Stream carries no frame without a byte, so the gateware cannot be given it "
                         f"(the model counts it as drop_runt)")
    slots, elements, slot_frame, elements_frame = capture_needs(frames)
    for option, given, needed in (("--slots", args.slots, slots), ("--elements", args.elements, elements)):
        if given is not None and given < needed:
            raise ValueError(f"{args.input} needs {option} {needed} or more (its frames use slots up to {slots - 1} "
                             f"and up to {elements} elements per frame), got {option} {given}; leave {option} out "
                             f"to take it from the capture")
    defaults = AggregatorConfig()
    # A size taken from the capture is refused naming the frame that asks for it, not options never given.
    asked = [f"frame {slot_frame} uses slot {slots - 1}"] if args.slots is None and slots > defaults.slots else []
    if args.elements is None and elements > defaults.max_elements:
        asked.append(f"frame {elements_frame} carries {elements} elements")
    # At least the defaults, so that a capture replays as on the default golden model unless it needs more.
    args.slots = max(slots, defaults.slots) if args.slots is None else args.slots
    args.elements = max(elements, defaults.max_elements) if args.elements is None else args.elements
    if asked and (args.elements > JUMBO_ELEMENTS_PER_FRAME or args.slots * args.elements > MAX_SUM_WORDS):
        raise ValueError(f"{args.input}: {' and '.join(asked)} (numbered as by inwire decode), which asks for a "
                         f"core of {args.slots:,} slots of {args.elements:,} elements; a generated core holds at most "
                         f"{MAX_SUM_WORDS:,} sum words and {JUMBO_ELEMENTS_PER_FRAME:,} elements per frame")
    config = gateware_config(args)
    progress.say(f"{len(frames)} frames from {args.input}; gateware with {config.slots} slots of "
                 f"{config.max_elements} elements")
    from inwire_hdl.sim import replay

    outputs, counters = replay(frames, simulator=args.sim, data_width=args.width, config=config)
    with atomic_output(args.output) as temporary:
        write_frames(temporary, outputs)
    print(json.dumps(counters, indent=2))
    agrees, verdict = model_agreement(frames, outputs, counters, config, args.output)
    print(f"inwire replay: {verdict}", file=sys.stderr)
    return 0 if agrees else 1
