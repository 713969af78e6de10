"""A multi-host lab on one machine (`inwire demo`, tests/test_netns.py).

The aggregator and every island get their own network namespace, joined by veth pairs to a bridge that
lives in a namespace of its own (multicast snooping off, so the bridge floods the result groups to every
island's namespace). The software aggregator runs there as `inwire serve` in multicast mode.

Each island's link is delayed by the topology's one-way latency between its city and the clique's
aggregation city, times a scale factor. The kernel here has no `netem` qdisc, so the delay is made in user
space: a small relay in each island's namespace takes the island's datagrams on 127.0.0.1, holds each for
the delay and sends it on to the aggregator; it joins the clique's multicast group on the island's veth,
and holds every result (or stats reply) for the delay again before handing it to the island.

The islands and relays run in this process: their sockets are opened inside the namespaces (setns), so
their traffic crosses the veths and the bridge like traffic between hosts.
"""

import asyncio
import contextlib
import ctypes
import os
import select
import shutil
import socket
import subprocess
import sys
from collections import OrderedDict

from .datagram import PAYLOAD_OFFSET, ip_str
from .errors import InwireError
from .protocol import FRAME_OFFSETS, INWIRE_PORT, Opcode
from .stream import Workload, clique_group, stream_async
from .transport import UdpTransport

CLONE_NEWNET = 0x40000000
SUBNET = "10.77.0"
AGGREGATOR_IP = f"{SUBNET}.1"
GROUP_AT = FRAME_OFFSETS["group"] - PAYLOAD_OFFSET
MAX_GROUPS_JOINED = 16
"""Linux allows 20 memberships per socket by default; the oldest are left beyond this."""
STARTUP_TIMEOUT_S = 15


class LabError(InwireError):
    """The lab cannot be set up; the message is one line for the user."""


def unavailable_reason():
    """Why namespaces cannot be used here, or None when they can."""
    if shutil.which("ip") is None:
        return "the 'ip' command (iproute2) is not installed"
    if os.geteuid() != 0:
        return "they need root; run the command as root"
    name = f"iwprobe{os.getpid()}"
    probe = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True, timeout=10)
    if probe.returncode != 0:
        return f"'ip netns add' is not allowed here ({probe.stderr.strip()})"
    subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=10)
    return None


def _ip(*args):
    run = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=10)
    if run.returncode != 0:
        raise LabError(f"ip {' '.join(args)}: {run.stderr.strip()}")


_libc = ctypes.CDLL(None, use_errno=True)


def _setns(fd):
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        error = ctypes.get_errno()
        raise LabError(f"setns: {os.strerror(error)}")


@contextlib.contextmanager
def inside(namespace):
    """Run the body with this thread in the named network namespace; sockets made there stay there."""
    home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    target = os.open(f"/run/netns/{namespace}", os.O_RDONLY)
    try:
        _setns(target)
        yield
    finally:
        _setns(home)
        os.close(target)
        os.close(home)


def udp_socket(namespace, address, reuse=False):
    with inside(namespace):
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        if reuse:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    return sock


def package_environment():
    """The environment with this package importable, as programs started in a namespace need."""
    environment = dict(os.environ)
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    environment["PYTHONPATH"] = package_root + os.pathsep + environment.get("PYTHONPATH", "")
    return environment


def await_listening(service, what, timeout_s=STARTUP_TIMEOUT_S):
    """Wait for `inwire serve` (started with its stderr piped) to say it listens; LabError if it does not."""
    ready, _, _ = select.select([service.stderr], [], [], timeout_s)
    line = service.stderr.readline() if ready else ""
    if "listening on" not in line:
        raise LabError(f"{what} did not start: {line.strip() or 'no output'}")


class Lab:
    """Namespaces, veths and the bridge for an aggregator and `islands`; removed again on exit."""

    def __init__(self, islands):
        self.islands = tuple(islands)
        tag = f"iw{os.getpid() % 100000}"
        self.switch, self.aggregator = f"{tag}sw", f"{tag}agg"
        self.namespaces = {island: f"{tag}i{i}" for i, island in enumerate(self.islands)}
        self.addresses = {island: f"{SUBNET}.{10 + i}" for i, island in enumerate(self.islands)}
        self.created = []
        self.service = None

    def __enter__(self):
        try:
            self._build()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _build(self):
        for namespace in (self.switch, self.aggregator, *self.namespaces.values()):
            _ip("netns", "add", namespace)
            self.created.append(namespace)
        _ip("-n", self.switch, "link", "add", "br0", "type", "bridge", "mcast_snooping", "0")
        _ip("-n", self.switch, "link", "set", "br0", "up")
        nodes = [(self.aggregator, AGGREGATOR_IP)] + [(self.namespaces[i], self.addresses[i]) for i in self.islands]
        for port, (namespace, address) in enumerate(nodes):
            _ip("-n", self.switch, "link", "add", f"p{port}", "type", "veth", "peer", "name", "eth0",
                "netns", namespace)
            _ip("-n", self.switch, "link", "set", f"p{port}", "master", "br0", "up")
            _ip("-n", namespace, "addr", "add", f"{address}/24", "dev", "eth0")
            _ip("-n", namespace, "link", "set", "eth0", "up")
            _ip("-n", namespace, "link", "set", "lo", "up")
            _ip("-n", namespace, "route", "add", "239.0.0.0/8", "dev", "eth0")

    def start_aggregator(self, slots, unicast=False):
        """`inwire serve` in the aggregator's namespace, multicasting results onto the bridge (with
        `unicast`, sending each member its copy)."""
        self.service = subprocess.Popen(
            ["ip", "netns", "exec", self.aggregator, sys.executable, "-m", "inwire", "serve",
             "--listen", f"{AGGREGATOR_IP}:{INWIRE_PORT}", "--multicast-iface", AGGREGATOR_IP, "--slots", str(slots),
             "--unregistered",
             *(["--unicast"] if unicast else [])],
            stderr=subprocess.PIPE, text=True, env=package_environment())
        await_listening(self.service, "the aggregator")
        return (AGGREGATOR_IP, INWIRE_PORT)

    def stop_aggregator(self):
        """Stop the service with SIGTERM; returns its last line (the final counters)."""
        if self.service is None:
            return ""
        self.service.terminate()
        try:
            rest = self.service.communicate(timeout=10)[1]
        except subprocess.TimeoutExpired:
            self.service.kill()
            rest = self.service.communicate()[1]
        self.service = None
        lines = rest.strip().splitlines()
        return lines[-1] if lines else ""

    def __exit__(self, *exc):
        self.stop_aggregator()
        for namespace in reversed(self.created):
            subprocess.run(["ip", "netns", "del", namespace], capture_output=True, timeout=10)
        self.created = []


class DelayRelay:
    """An island's delayed link: datagrams from the island (on 127.0.0.1) reach the aggregator, and
    results and replies reach the island, each `delays[group]` seconds late."""

    def __init__(self, namespace, interface_address, aggregator, delays):
        self.namespace, self.interface_address, self.aggregator = namespace, interface_address, aggregator
        self.delays = delays
        self.island = None
        self.joined = OrderedDict()
        self.relayed = 0

    async def start(self):
        loop = asyncio.get_running_loop()
        inner = udp_socket(self.namespace, ("127.0.0.1", 0))
        outer = udp_socket(self.namespace, ("0.0.0.0", INWIRE_PORT), reuse=True)
        for sock in (inner, outer):
            sock.setblocking(False)
        self.inner, _ = await loop.create_datagram_endpoint(lambda: _Side(self._from_island), sock=inner)
        self.outer, _ = await loop.create_datagram_endpoint(lambda: _Side(self._from_network), sock=outer)
        return inner.getsockname()

    def _delay(self, payload):
        group = int.from_bytes(payload[GROUP_AT:GROUP_AT + 4], "big") if len(payload) >= GROUP_AT + 4 else 0
        return group, self.delays.get(group, 0.0)

    def _from_island(self, payload, address):
        self.island = address
        group, delay = self._delay(payload)
        if len(payload) > 3 and payload[3] == Opcode.CONTRIBUTION and group in self.delays:
            self._join(group)
        asyncio.get_running_loop().call_later(delay, self._forward, self.outer, payload, self.aggregator)

    def _from_network(self, payload, address):
        if self.island is not None:
            _, delay = self._delay(payload)
            asyncio.get_running_loop().call_later(delay, self._forward, self.inner, payload, self.island)

    def _forward(self, endpoint, payload, address):
        if not endpoint.is_closing():
            endpoint.sendto(payload, address)
            self.relayed += 1

    def _join(self, group):
        if group in self.joined:
            self.joined.move_to_end(group)
            return
        sock = self.outer.get_extra_info("socket")
        membership = socket.inet_aton(ip_str(group)) + socket.inet_aton(self.interface_address)
        sock.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP, membership)
        self.joined[group] = membership
        if len(self.joined) > MAX_GROUPS_JOINED:
            _, oldest = self.joined.popitem(last=False)
            sock.setsockopt(socket.IPPROTO_IP, socket.IP_DROP_MEMBERSHIP, oldest)

    def close(self):
        self.inner.close()
        self.outer.close()


class _Side(asyncio.DatagramProtocol):
    def __init__(self, receive):
        self.receive = receive

    def datagram_received(self, data, addr):
        self.receive(data, addr)

    def error_received(self, exc):
        """A lost datagram on the emulated link; the islands' timeouts recover it."""


def link_delays(plan, island, scale):
    """Seconds each of the island's clique groups is delayed: the topology's one-way latency between the
    island's city and the clique's aggregation city, times `scale`. A clique the schedule exchanges directly
    is emulated at the member city with the smallest worst latency to the others."""
    topology, delays = plan.topology, {}
    for period_round, cliques in enumerate(plan.period):
        for c, (members, aggregator) in enumerate(cliques):
            if island not in members:
                continue
            if aggregator is None:
                aggregator = min(members, key=lambda m: max(topology.latency_ms(m, o) for o in members))
            delays[clique_group(period_round, c)] = topology.latency_ms(island, aggregator) * scale / 1000
    return delays


def run_lab(plan, config, scale, progress=None):
    """Run the islands of `plan` through the lab (`progress(round)` after each round); returns (report, the
    aggregator's final counters line)."""
    reason = unavailable_reason()
    if reason:
        raise LabError(f"network namespaces unavailable: {reason}")
    workload = Workload(plan, config)
    with Lab(plan.islands) as lab:
        aggregator = lab.start_aggregator(max(16, workload.slots_needed))
        relays = {island: DelayRelay(lab.namespaces[island], lab.addresses[island], aggregator,
                                     link_delays(plan, island, scale)) for island in plan.islands}

        async def main():
            targets = {island: await relay.start() for island, relay in relays.items()}
            sockets = {island: udp_socket(lab.namespaces[island], ("127.0.0.1", 0)) for island in plan.islands}
            try:
                return await stream_async(plan, config, UdpTransport(targets, sockets), progress or (lambda _: None),
                                          "udp")
            finally:
                for relay in relays.values():
                    relay.close()

        report = asyncio.run(main())
        report["relayed"] = {island: relay.relayed for island, relay in relays.items()}
        final = lab.stop_aggregator()
    return report, final


def demo_schedule(path):
    """The optimized schedule for doublezero9 (a 100 MB model), written to `path`."""
    from .plan.schedule_file import write_schedule
    from .plan.search import plan_schedule
    from .plan.topology import load_topology
    write_schedule(plan_schedule(load_topology("doublezero9"), iterations=300), path)
