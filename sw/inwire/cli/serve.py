"""Run the software aggregator, the golden model behind a UDP socket, until SIGINT or SIGTERM.

Each datagram is wrapped in the frame it would have been on the wire and handed to the model; what the
model sends goes to the clique's multicast group (or, with --unicast, to each member). With --sim the
gateware itself answers, in co-simulation.
"""

import signal

from ..datagram import parse_endpoint
from ..protocol import INWIRE_PORT
from ..serve import DEFAULT_MAX_ELEMENTS, DEFAULT_SLOTS, SoftwareAggregator
from .options import simulator


def add_arguments(parser):
    parser.add_argument("--listen", default=f"127.0.0.1:{INWIRE_PORT}", metavar="HOST:PORT",
                        help="address and UDP port to receive contributions on (port 0 picks a free one)")
    parser.add_argument("--stats-interval", type=float, default=None, metavar="S",
                        help="log the counters every S seconds")
    parser.add_argument("--unicast", action="store_true",
                        help="send each result to every member's own address instead of the multicast group "
                             "(where multicast is not routable, e.g. on one machine)")
    parser.add_argument("--multicast-iface", default=None, metavar="ADDR",
                        help="send multicast results out of the interface with this IPv4 address")
    parser.add_argument("--slots", type=int, default=DEFAULT_SLOTS, help="aggregator slots")
    parser.add_argument("--max-elements", type=int, default=DEFAULT_MAX_ELEMENTS,
                        help="largest element count per frame")
    parser.add_argument("--sim", type=simulator, default=None, metavar="SIMULATOR[:WIDTH]",
                        help="answer with the gateware in co-simulation (icarus or verilator, width 8 to 64) "
                             "instead of the golden model")


def run(args):
    listen = parse_endpoint(args.listen, "--listen")
    if args.stats_interval is not None and args.stats_interval <= 0:
        raise ValueError(f"--stats-interval must be positive, got {args.stats_interval}")
    kwargs = {}
    if args.sim:
        from inwire_hdl.cosim import CoSimulation

        sim, width = args.sim
        kwargs["make_aggregator"] = lambda config: CoSimulation(sim, width, config)
    server = SoftwareAggregator(listen, unicast=args.unicast, slots=args.slots, max_elements=args.max_elements,
                                multicast_iface=args.multicast_iface, **kwargs)
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: server.stop())
    host, port = server.address
    mode = "unicast to each member" if args.unicast else "multicast to the clique's group"
    engine = f"the gateware in {args.sim[0]} at width {args.sim[1]}" if args.sim else "the golden model"
    server.log(f"inwire serve: listening on udp://{host}:{port}, {server.config.slots} slots of up to "
               f"{server.config.max_elements} elements, {engine}, results by {mode}")
    try:
        server.serve(args.stats_interval)
    finally:
        server.close()
    return 0
