"""Feed every frame of IN.pcap to the simulated aggregator (cocotb on Icarus Verilog or Verilator), write
what comes out to OUT.pcap and print the counters as JSON. Simulation builds go to build/sim under the
working directory."""

import json

from inwire_hdl import SIMULATORS

from ..output import atomic_output, check_writable
from ..pcap import read_frames, write_frames
from .options import gateware_config, gateware_size


def add_arguments(parser):
    from inwire_hdl.aggregator import DATA_WIDTHS

    parser.add_argument("--sim", choices=SIMULATORS, default=SIMULATORS[0], help="simulator")
    gateware_size(parser, DATA_WIDTHS)
    parser.add_argument("input", metavar="IN.pcap")
    parser.add_argument("output", metavar="OUT.pcap")


def run(args):
    from inwire_hdl.sim import replay

    config = gateware_config(args)
    check_writable(args.output, "OUT.pcap")
    frames = read_frames(args.input)
    outputs, counters = replay(frames, simulator=args.sim, data_width=args.width, config=config)
    with atomic_output(args.output) as temporary:
        write_frames(temporary, outputs)
    print(json.dumps(counters, indent=2))
    return 0
