"""Run the software aggregator behind a UDP socket until SIGINT or SIGTERM.

By default the fast path decides on each UDP payload, bit-exact with the golden model (where the compiled
kernel is built; the golden model answers otherwise); with --golden each
datagram is wrapped in the frame it would have been on the wire and handed to the model itself; with
--sim the gateware answers, in co-simulation. Results go to the clique's multicast group (or, with
--unicast, to each member); a partial of a reduction tree goes to the next aggregator up, at its address
and this service's port.

Only registered jobs count (registered with `inwire job register`, or by `inwire stream` and the
launchers on their own, authenticated with the operator key). --unregistered also takes the unregistered
frames of versions 1 and 2, whose headers configure their slot and route: for captures, trees and the lab,
never on an aggregator shared by jobs that do not trust each other. With --sim the gateware decides, with
its job tables written through its control interface as jobs register: it holds jobs with a multicast group
only (it sends each result once, to the group), and with them the routes of reduction trees (2 per job,
2 child aggregators each), so it can be any level of a registered tree.
"""

import argparse
import ipaddress
import signal
import socket

from .. import control, extras
from ..datagram import ip_str, parse_endpoint
from ..model import DEFAULT_LEASE, AggregatorConfig
from ..protocol import DEFAULT_SLOTS, INWIRE_PORT, JUMBO_ELEMENTS_PER_FRAME
from ..serve import DEFAULT_MAX_ELEMENTS, DEFAULT_RECEIVE_BUFFER, SoftwareAggregator
from .options import check_integer, check_positive, decimal, simulator, whole


def add_arguments(parser):
    parser.add_argument("--listen", default=f"127.0.0.1:{INWIRE_PORT}", metavar="HOST:PORT",
                        help="address and UDP port to receive contributions on (port 0 picks a free one)")
    parser.add_argument("--stats-interval", type=decimal("--stats-interval"), default=None, metavar="S",
                        help="log the counters every S seconds")
    parser.add_argument("--unicast", action="store_true",
                        help="send each result to every member's own address instead of the multicast group "
                             "(where multicast is not routable, e.g. on one machine); in a reduction tree also to "
                             "each child aggregator, which relays it to its own members")
    parser.add_argument("--multicast-iface", default=None, metavar="ADDR",
                        help="send multicast results out of the interface with this IPv4 address")
    parser.add_argument("--slots", type=whole("--slots"), default=DEFAULT_SLOTS,
                        help=f"aggregator slots (default: {DEFAULT_SLOTS}: a run needs 4 x cliques x the islands' "
                             f"--window, and memory is no limit in software; the gateware's default, "
                             f"{AggregatorConfig().slots}, is what a board's block RAM holds)")
    parser.add_argument("--max-elements", type=whole("--max-elements"), default=DEFAULT_MAX_ELEMENTS,
                        help="largest element count per frame")
    parser.add_argument("--lease", type=whole("--lease"), default=DEFAULT_LEASE, metavar="MS",
                        help="milliseconds without an accepted contribution after which an unfinished slot may be "
                             "claimed by another job (0: never)")
    parser.add_argument("--upstream", default=None, metavar="PREFIX",
                        help="IPv4 prefix (A.B.C.D/N) of the aggregators above this one: the only addresses a "
                             "partial of a reduction tree may be sent to, whatever a frame names (default: the /24 "
                             "of the --listen address)")
    parser.add_argument("--stats-from", default=None, metavar="PREFIX",
                        help="IPv4 prefix whose hosts may ask for the counters besides this machine (a stats "
                             "reply is larger than its request; default: --upstream)")
    parser.add_argument("--sim", type=simulator, default=None, metavar="SIMULATOR[:WIDTH]",
                        help="answer with the gateware in co-simulation (icarus or verilator, width 8 to 64) "
                             "instead of the golden model")
    parser.add_argument("--golden", action="store_true",
                        help="answer with the golden model itself (each datagram wrapped into its frame) instead "
                             "of the fast path; slower, same answers")
    parser.add_argument("--receive-buffer", type=whole("--receive-buffer"), default=DEFAULT_RECEIVE_BUFFER,
                        metavar="BYTES",
                        help="socket receive buffer; must hold islands x window datagrams")
    parser.add_argument("--unregistered", action=argparse.BooleanOptionalAction, default=False,
                        help="also take unregistered frames (versions 1 and 2, whose headers configure their slot "
                             "and route: captures, trees and the lab) beside registered jobs; without it only jobs "
                             "registered with inwire job register (or by inwire stream and the launchers) count")
    parser.add_argument("--key-file", default=None, metavar="PATH",
                        help=f"operator key that registrations must be signed with (default: ${control.KEY_ENV}, "
                             f"else ~/.config/inwire/operator.key; made on first use)")


def run(args):
    if args.sim:
        extras.require("sim", "--sim")
    listen = parse_endpoint(args.listen, "--listen")
    if args.multicast_iface is not None:
        try:
            ipaddress.IPv4Address(args.multicast_iface)
        except ValueError:
            raise ValueError(f"--multicast-iface {args.multicast_iface!r} is not an IPv4 address (the "
                             f"interface's own address, e.g. 10.0.0.5)") from None
        # The socket option the service sets, tried up front: the kernel refuses an address no interface has.
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
                probe.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, socket.inet_aton(args.multicast_iface))
        except OSError:
            raise ValueError(f"--multicast-iface {args.multicast_iface} is not the address of an interface of this "
                             f"machine (see ip -4 addr)") from None
    for option, value, low, high in (("--slots", args.slots, 1, 2**16),
                                     ("--max-elements", args.max_elements, 1, JUMBO_ELEMENTS_PER_FRAME)):
        if not low <= value <= high:
            raise ValueError(f"{option} must lie in [{low}, {high}], got {value}")
    if args.stats_interval is not None:
        check_positive("--stats-interval", args.stats_interval, unit="seconds")
    check_integer("--receive-buffer", args.receive_buffer, 1, 2**31 - 1, "SO_RCVBUF is a C int")
    key = control.load_key(args.key_file)
    # engine None: the fast path where the compiled kernel is built, else the golden model (serve chooses)
    kwargs = {"engine": "golden" if args.golden or args.sim else None, "receive_buffer": args.receive_buffer}
    if args.sim:
        from inwire_hdl.cosim import CoSimulation
        from inwire_hdl.job_table import TREE_LIMITS

        sim, width = args.sim
        kwargs["make_aggregator"] = lambda config: CoSimulation(sim, width, config)
        kwargs["limits"] = TREE_LIMITS  # routes too: the gateware can be any level of a registered tree
    server = SoftwareAggregator(listen, unicast=args.unicast, slots=args.slots, max_elements=args.max_elements,
                                multicast_iface=args.multicast_iface, lease=args.lease, upstream=args.upstream,
                                stats_from=args.stats_from, registered=True, unregistered=args.unregistered,
                                key=key, **kwargs)
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: server.stop())
    host, port = server.address
    mode = "unicast to each member" if args.unicast else "multicast to the clique's group"
    engine = f"the gateware in {args.sim[0]} at width {args.sim[1]}" if args.sim else server.description
    server.log(f"inwire serve: listening on udp://{host}:{port}, {server.config.slots} slots of up to "
               f"{server.config.max_elements} elements, {engine}, results by {mode}, receive buffer "
               f"{server.receive_buffer} bytes, partials only to {ip_str(server.config.upstream_prefix[0])}/"
               f"{server.config.upstream_prefix[1]}, "
               f"{'registered jobs and unregistered frames' if args.unregistered else 'registered jobs only'}")
    if server.receive_buffer < args.receive_buffer:
        # Linux grants up to twice net.core.rmem_max without privileges; islands x window must fit.
        server.log(f"inwire serve: warning: receive buffer {server.receive_buffer} bytes, asked for "
                   f"{args.receive_buffer}: raise net.core.rmem_max (sysctl -w net.core.rmem_max="
                   f"{args.receive_buffer}) or run as root, or datagrams beyond it are dropped and retransmitted")
    try:
        server.serve(args.stats_interval)
    finally:
        server.close()
    return 0

