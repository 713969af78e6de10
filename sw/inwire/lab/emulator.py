"""A wide-area network on one machine: every city a network namespace, every link a shaped, delayed pair of
TUN devices (`inwire lab`, docs/lab.md).

City i has the address 10.75.0.(i+1) on a veth named `city` (an interface of its own, so that programs
that bind to an interface's address, gloo among them, find it). Each link of the topology whose direct
path is the shortest between its ends (no route uses the others) is emulated in both directions: the
sending city's TUN device has a `tbf` qdisc at the link's rate, counting each packet's Ethernet header,
preamble, FCS and gap on top of its IP bytes (`stab overhead`, so that the kernel spends on the link what
the cost model charges: MTU_BYTES frames, 24 bytes of wire overhead each); the relay process
(`inwire.lab.relay`) carries each packet to the receiving city's device after the link's one-way delay.
Routes follow the topology's latency-shortest paths, the paths the planner assumes; cities forward.

Delays and rates are the topology's times `delay_scale` and `rate_scale`. A lab time is `delay_scale`
times the time of the real network for a vector `1 / (delay_scale x rate_scale)` times as large: latency
and serialization keep the ratio they have there.
"""

import contextlib
import fcntl
import itertools
import json
import math
import os
import re
import select
import signal
import statistics
import struct
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from ..netns import LabError, inside, package_environment, udp_socket, unavailable_reason
from ..protocol import ETHERNET_BYTES, MTU_BYTES, WIRE_OVERHEAD_BYTES

PREFIX = "10.75.0"
NAMESPACE_PREFIX = "iwlab"
TUNSETIFF = 0x400454CA
IFF_TUN, IFF_NO_PI = 0x0001, 0x1000
LINK_OVERHEAD_BYTES = ETHERNET_BYTES + WIRE_OVERHEAD_BYTES
"""What a packet costs on an Ethernet link beyond its IP bytes: header, preamble, FCS, inter-frame gap."""
IPV4_UDP_BYTES, IPV4_TCP_BYTES = 28, 52
"""IPv4 and UDP headers; IPv4 and TCP headers with the timestamp option Linux sends."""
MIN_QUEUE_BYTES = 1 << 20
"""The least queue (tbf limit) of a link direction, some 500 full frames: what a burst of the lab's own
programs (a few islands' first windows, TCP's slow start in the link check) can put on it at once. A link
whose bandwidth-delay product is larger queues that much (`WanLab.queue_limit`); the lab sizes the queue
for the vectors it sums (`measure.queue_bytes_for`)."""
TOLERANCE = 0.10
"""The emulator check refuses a link whose delay or rate is off by more than this fraction."""
PROBES = 15
TCP_WARMUP_ROUND_TRIPS = 30
PROBE_ATTEMPTS = 3
STARTUP_TIMEOUT_S = 15
TCP_SETTINGS = ("net.ipv4.tcp_congestion_control", "net.ipv4.tcp_slow_start_after_idle")
"""The TCP settings a strategy over TCP runs with, read from (and set in) every city's namespace."""
TCP_TUNED = {"net.ipv4.tcp_congestion_control": "reno", "net.ipv4.tcp_slow_start_after_idle": "0"}
"""TCP tuned for repeated bulk transfers on long links: no slow start again after each idle gap between
repetitions, and reno's loss-based window instead of a rate estimate probed anew each time."""


_instances = itertools.count()


@dataclass(frozen=True)
class EmulatedLink:
    a: str
    b: str
    delay_s: float
    """One way, each direction."""
    rate_bps: float
    """Each direction, counting LINK_OVERHEAD_BYTES per packet."""
    loss: float = 0.0

    @property
    def name(self):
        return f"{self.a}-{self.b}"


def _run(*command, timeout=20):
    run = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    if run.returncode != 0:
        raise LabError(f"{' '.join(command)}: {(run.stderr or run.stdout).strip()}")
    return run.stdout


def _open_tun(name):
    fd = os.open("/dev/net/tun", os.O_RDWR)
    try:
        fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(), IFF_TUN | IFF_NO_PI))
    except OSError as error:
        os.close(fd)
        raise LabError(f"cannot create the TUN device {name}: {error.strerror}") from None
    return fd


def leftover_namespaces():
    """Lab namespaces whose owning process is gone (an interrupted run killed before it cleaned up)."""
    listing = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=10).stdout
    names = [line.split()[0] for line in listing.splitlines() if line.startswith(NAMESPACE_PREFIX)]
    leftovers = []
    for name in names:
        match = re.match(rf"{NAMESPACE_PREFIX}(\d+)n\d+c\d+$", name)
        if match is None:
            continue
        pid = int(match.group(1))
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            leftovers.append(name)
        except PermissionError:
            pass
    return leftovers


def clean_leftovers():
    names = leftover_namespaces()
    for name in names:
        subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=10)
    return names


def emulated_links(topology, delay_scale, rate_scale, loss=0.0):
    """The links routes use (each the shortest path between its own ends), scaled."""
    links = []
    for a, b, data in sorted(topology.graph.edges(data=True)):
        if topology.path(a, b) == [a, b]:
            link = data["link"]
            links.append(EmulatedLink(a, b, link.latency_ms * 1e-3 * delay_scale,
                                      link.bandwidth_gbps * 1e9 * rate_scale, loss))
    return links


class WanLab:
    """The emulated network of `topology`; a context manager that builds it and removes it again (also on
    Ctrl-C or SIGTERM)."""

    def __init__(self, topology, delay_scale=1.0, rate_scale=0.002, loss=0.0, queue_bytes=MIN_QUEUE_BYTES):
        if not (delay_scale > 0 and rate_scale > 0 and queue_bytes > 0 and 0 <= loss < 1):
            raise LabError("delay and rate scales and the queue must be positive, loss in [0, 1)")
        self.topology, self.delay_scale, self.rate_scale = topology, delay_scale, rate_scale
        self.queue_bytes = int(queue_bytes)
        """Each link direction's queue, unless its bandwidth-delay product is longer (`queue_limit`)."""
        self.cities = tuple(topology.cities)
        if len(self.cities) > 250:
            raise LabError(f"{len(self.cities)} cities: the lab numbers them in one /24")
        self.links = emulated_links(topology, delay_scale, rate_scale, loss)
        instance = next(_instances)
        tag = f"{NAMESPACE_PREFIX}{os.getpid()}n{instance}"
        self.namespaces = {city: f"{tag}c{i}" for i, city in enumerate(self.cities)}
        self.addresses = {city: f"{PREFIX}.{i + 1}" for i, city in enumerate(self.cities)}
        self._index = {city: i for i, city in enumerate(self.cities)}
        self._tag = f"iw{os.getpid() % 100000}{instance % 100}"
        self._created, self._fds, self.relay, self.relay_counters = [], [], None, {}
        self.directions = [(end, other) for link in self.links for end, other in ((link.a, link.b), (link.b, link.a))]
        """Each emulated link direction as (from, to), in the link process's order."""
        self._previous_sigterm = None

    def device(self, city, towards):
        """The name, inside `city`'s namespace, of its TUN device on the link to `towards`."""
        return f"to{self._index[towards]}"

    # -- building and removing --------------------------------------------------------------------
    def __enter__(self):
        reason = unavailable_reason()
        if reason:
            raise LabError(f"network namespaces unavailable: {reason}")
        if not os.path.exists("/dev/net/tun"):
            raise LabError("/dev/net/tun is missing: the lab's links are TUN devices")
        clean_leftovers()
        self._previous_sigterm = signal.signal(signal.SIGTERM, _interrupt)
        try:
            self._build()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _build(self):
        for city in self.cities:
            namespace, address = self.namespaces[city], self.addresses[city]
            _run("ip", "netns", "add", namespace)
            self._created.append(namespace)
            for command in (("link", "set", "lo", "up"),
                            ("link", "add", "city", "type", "veth", "peer", "name", "cityp"),
                            ("link", "set", "cityp", "up"), ("link", "set", "city", "up"),
                            ("addr", "add", f"{address}/32", "dev", "city")):
                _run("ip", "-n", namespace, *command)
            # No IPv6 on the links (set before they exist): neighbour and router solicitations would cross them
            # beside the traffic whose bytes the lab counts.
            ipv6 = ("net.ipv6.conf.all.disable_ipv6=1", "net.ipv6.conf.default.disable_ipv6=1") \
                if os.path.exists("/proc/sys/net/ipv6") else ()
            for setting in ("net.ipv4.ip_forward=1", "net.ipv4.conf.all.rp_filter=0",
                            "net.ipv4.conf.default.rp_filter=0", *ipv6):
                _run("ip", "netns", "exec", namespace, "sysctl", "-q", "-w", setting)
        directions = []
        for k, link in enumerate(self.links):
            ends = {}
            for side, (city, other) in enumerate(((link.a, link.b), (link.b, link.a))):
                staging = f"{self._tag}t{k}{'ab'[side]}"
                fd = _open_tun(staging)
                self._fds.append(fd)
                name, namespace = self.device(city, other), self.namespaces[city]
                _run("ip", "link", "set", staging, "netns", namespace, "name", name)
                # One segment per packet: the qdisc adds the link overhead once per packet it sees, so a
                # GSO super-packet of TCP segments would pay it once for all of them.
                _run("ip", "-n", namespace, "link", "set", name, "mtu", str(MTU_BYTES), "txqueuelen", "1000",
                     "gso_max_segs", "1", "up")
                self._shape(namespace, name, link.rate_bps, self.queue_limit(link))
                ends[city] = fd
            directions += [[ends[link.a], ends[link.b], link.delay_s, link.loss],  # as self.directions
                           [ends[link.b], ends[link.a], link.delay_s, link.loss]]
        for city in self.cities:
            for destination in self.cities:
                if destination != city:
                    hop = self.topology.path(city, destination)[1]
                    _run("ip", "-n", self.namespaces[city], "route", "add", f"{self.addresses[destination]}/32",
                         "dev", self.device(city, hop), "src", self.addresses[city])
        self._start_relay(directions)

    def queue_limit(self, link):
        """The queue (bytes, with each packet's link overhead) of each direction of `link`: `queue_bytes`, or
        the link's bandwidth-delay product where that is longer, which TCP (the link check, gloo, the host
        tree) needs queued to keep the link busy after it halves its window."""
        return max(self.queue_bytes, math.ceil(link.rate_bps / 8 * 2 * link.delay_s))

    def _shape(self, namespace, device, rate_bps, limit_bytes):
        burst = max(4 * (MTU_BYTES + LINK_OVERHEAD_BYTES), int(rate_bps / 8 * 0.004))
        command = ("tc", "-n", namespace, "qdisc", "add", "dev", device, "root", "stab", "overhead",
                   str(LINK_OVERHEAD_BYTES), "tbf", "rate", f"{int(rate_bps)}bit", "burst", str(burst),
                   "limit", str(limit_bytes))
        run = subprocess.run(command, capture_output=True, text=True, timeout=10)
        if run.returncode != 0:
            reason = run.stderr.strip()
            if "Unknown qdisc" in reason or "No such file" in reason or "not supported" in reason.lower():
                raise LabError(f"this kernel has no tbf qdisc to shape the links' rates ({reason})")
            raise LabError(f"{' '.join(command)}: {reason}")

    def _start_relay(self, directions):
        self.relay = subprocess.Popen([sys.executable, "-m", "inwire.lab.relay"], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, text=True, pass_fds=self._fds,
                                      env=package_environment())
        self.relay.stdin.write(json.dumps({"directions": directions}) + "\n")
        self.relay.stdin.flush()
        ready, _, _ = select.select([self.relay.stdout], [], [], STARTUP_TIMEOUT_S)
        line = self.relay.stdout.readline() if ready else ""
        if line.strip() != "ready":
            raise LabError(f"the link process did not start: {line.strip() or 'no output'}")
        # The relay holds its own copies now; the lab's are not needed to keep the devices.
        for fd in self._fds:
            os.close(fd)
        self._fds = []

    def link_bytes(self):
        """{(from, to): IP bytes} every emulated link direction has carried so far (the link process's count)."""
        self.relay.stdin.write("\n")
        self.relay.stdin.flush()
        ready, _, _ = select.select([self.relay.stdout], [], [], STARTUP_TIMEOUT_S)
        line = self.relay.stdout.readline() if ready else ""
        if not line:
            raise LabError("the link process did not report its counters")
        return dict(zip(self.directions, json.loads(line)["bytes"], strict=True))

    def _stop_relay(self):
        if self.relay is None:
            return
        with contextlib.suppress(OSError):
            self.relay.stdin.close()
        try:
            self.relay.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.relay.kill()
            self.relay.wait()
        lines = self.relay.stdout.read().strip().splitlines()
        self.relay.stdout.close()
        with contextlib.suppress(ValueError, IndexError):
            self.relay_counters = json.loads(lines[-1])
            for name in ("packets", "bytes"):
                self.relay_counters[name] = {f"{a}->{b}": count for (a, b), count in
                                             zip(self.directions, self.relay_counters[name], strict=True)}
        self.relay = None

    def __exit__(self, *exc):
        self._stop_relay()
        for fd in self._fds:
            os.close(fd)
        self._fds = []
        for namespace in reversed(self._created):
            subprocess.run(["ip", "netns", "del", namespace], capture_output=True, timeout=10)
        self._created = []
        if self._previous_sigterm is not None:
            signal.signal(signal.SIGTERM, self._previous_sigterm)
            self._previous_sigterm = None

    # -- running programs in cities ---------------------------------------------------------------
    def command(self, city, *argv):
        """`argv` run in `city`'s namespace."""
        return ["ip", "netns", "exec", self.namespaces[city], *argv]

    def python(self, city, module, *argv):
        return self.command(city, sys.executable, "-m", module, *argv)

    def tcp_settings(self):
        """The TCP settings (`TCP_SETTINGS`) new sockets in the cities get, as the first city's namespace has them
        (every city's are set together)."""
        city = self.cities[0]
        return {name: _run(*self.command(city, "sysctl", "-n", name)).strip() for name in TCP_SETTINGS}

    @contextlib.contextmanager
    def tcp(self, settings):
        """Every city's namespace with the TCP `settings` (sysctl name -> value) inside the block, as before
        after it."""
        before = self.tcp_settings()
        try:
            self._set_tcp(settings)
            yield self.tcp_settings()
        finally:
            self._set_tcp(before)

    def _set_tcp(self, settings):
        for city in self.cities:
            _run(*self.command(city, "sysctl", "-q", "-w", *(f"{name}={value}" for name, value in settings.items())))

    def inside(self, city):
        """A context in which this thread is in `city`'s namespace: sockets made there (a registration's, say)
        stay there and reach the city's services on its own address."""
        return inside(self.namespaces[city])

    # -- the emulator check ---------------------------------------------------------------------
    def probe_delay_ms(self, link, probes=PROBES):
        """One-way delay of `link`: the median round trip of small UDP datagrams across it less that of the
        same exchange within one city (the probe's own time), halved."""
        across = self._round_trip_s(link.a, link.b, probes)
        local = self._round_trip_s(link.a, link.a, probes)
        if across is None or local is None:
            return None
        return 1e3 * (across - local) / 2

    def _round_trip_s(self, a, b, probes):
        sender = udp_socket(self.namespaces[a], (self.addresses[a], 0))
        echo = udp_socket(self.namespaces[b], (self.addresses[b], 0))
        trips = []
        try:
            for n in range(probes):
                began = time.perf_counter()
                sender.sendto(n.to_bytes(4, "big"), echo.getsockname())
                if not select.select([echo], [], [], 2.0)[0]:
                    continue
                data, source = echo.recvfrom(64)
                echo.sendto(data, source)
                if not select.select([sender], [], [], 2.0)[0]:
                    continue
                sender.recvfrom(64)
                trips.append(time.perf_counter() - began)
        finally:
            sender.close()
            echo.close()
        return statistics.median(trips) if trips else None

    def _iperf(self, link, udp, seconds, port):
        """Goodput (bit/s) iperf3 measures across `link`: TCP from a to b, UDP from b to a at 2 % above
        what the link carries; None when iperf3 gives no result."""
        source, sink = (link.b, link.a) if udp else (link.a, link.b)
        server = subprocess.Popen(self.command(sink, "iperf3", "-s", "-1", "-B", self.addresses[sink], "-p",
                                               str(port)), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            time.sleep(0.3)
            if udp:
                options = ["-u", "-l", str(MTU_BYTES - IPV4_UDP_BYTES),
                           "-b", str(int(expected_goodput_bps(link, True) * 1.02)), "-t", str(seconds)]
            else:
                # Slow start takes a number of round trips to fill the link: leave them out of the figure.
                # Cubic, whatever the machine's default: BBR's own probing (it drains the path every 10 s)
                # costs a long link a tenth of its rate, which says nothing about the link.
                omitted = max(2, math.ceil(TCP_WARMUP_ROUND_TRIPS * 2 * link.delay_s))
                options = ["-t", str(max(seconds, omitted)), "-O", str(omitted), "-C", "cubic"]
            run = subprocess.run(self.command(source, "iperf3", "-c", self.addresses[sink], "-p", str(port),
                                              "-B", self.addresses[source], "-J", *options),
                                 capture_output=True, text=True,
                                 timeout=seconds + 30 + 4 * TCP_WARMUP_ROUND_TRIPS * link.delay_s)
        finally:
            with contextlib.suppress(subprocess.TimeoutExpired):
                server.wait(timeout=5)
            if server.poll() is None:
                server.kill()
                server.wait()
        try:
            end = json.loads(run.stdout)["end"]
            if not udp:
                return end["sum_received"]["bits_per_second"]
            # The sender's rate less what the receiver says was lost (on purpose or not).
            return end["sum"]["bits_per_second"] * (1 - end["sum"].get("lost_percent", 0.0) / 100)
        except (ValueError, KeyError):
            return None

    def check(self, seconds=3, tolerance=TOLERANCE, links=None):
        """Every link's delay (UDP probe) and rate (iperf3 TCP a->b, UDP b->a, all links at once), judged
        against what was configured (`judge`); one row per link. A delay off by more than `tolerance` is
        probed again, up to PROBE_ATTEMPTS times: a busy CPU can hold one probe, not a link."""
        links = list(self.links if links is None else links)
        rows = []
        for link in links:
            delay_ms = None
            for _ in range(PROBE_ATTEMPTS):
                delay_ms = self.probe_delay_ms(link)
                if delay_ms is not None and abs(delay_ms / (1e3 * link.delay_s) - 1) <= tolerance:
                    break
            rows.append({"link": link.name, "measured_delay_ms": None if delay_ms is None else round(delay_ms, 3)})
        for udp in (False, True):
            with ThreadPoolExecutor(max_workers=max(1, len(links))) as pool:
                results = list(pool.map(self._iperf, links, [udp] * len(links), [seconds] * len(links),
                                        range(5201, 5201 + len(links))))
            for row, measured in zip(rows, results):
                row[f"{'udp' if udp else 'tcp'}_mbps"] = None if measured is None else round(measured / 1e6, 3)
        return [judge(row, link, tolerance) for row, link in zip(rows, links)]


def expected_goodput_bps(link, udp):
    """What iperf3 can carry across `link`: its rate less every packet's headers and link overhead, and
    for UDP less the packets the link drops on purpose."""
    payload = MTU_BYTES - (IPV4_UDP_BYTES if udp else IPV4_TCP_BYTES)
    return link.rate_bps * payload / (MTU_BYTES + LINK_OVERHEAD_BYTES) * ((1 - link.loss) if udp else 1)


def judge(row, link, tolerance=TOLERANCE):
    """`row` (a link's measured delay and goodputs) with what `link` configures, `ok` and the problems."""
    row = dict(row, link=link.name, delay_ms=round(1e3 * link.delay_s, 3), rate_mbps=round(link.rate_bps / 1e6, 3),
               tcp_expected_mbps=round(expected_goodput_bps(link, False) / 1e6, 3),
               udp_expected_mbps=round(expected_goodput_bps(link, True) / 1e6, 3))
    problems = []
    if row["measured_delay_ms"] is None:
        problems.append("no probe came back")
    elif abs(row["measured_delay_ms"] / row["delay_ms"] - 1) > tolerance:
        problems.append(f"delay {row['measured_delay_ms']:.2f} ms, configured {row['delay_ms']:.2f} ms")
    # TCP's goodput on a lossy link depends on its congestion control, not on the link alone.
    for kind in ("tcp", "udp") if link.loss == 0 else ("udp",):
        measured, expected = row[f"{kind}_mbps"], row[f"{kind}_expected_mbps"]
        if measured is None:
            problems.append(f"iperf3 {kind.upper()} gave no result")
        elif abs(measured / expected - 1) > tolerance:
            problems.append(f"{kind.upper()} {measured:.2f} Mb/s, the rate allows {expected:.2f} Mb/s")
    row["ok"], row["problems"] = not problems, problems
    return row


def refuse_unless_ok(rows):
    """A LabError naming every link the check found off, if any."""
    bad = [row for row in rows if not row["ok"]]
    if bad:
        described = "; ".join(f"{row['link']}: {', '.join(row['problems'])}" for row in bad)
        raise LabError(f"the emulated network is off by more than {TOLERANCE:.0%} on {len(bad)} of {len(rows)} "
                       f"links, so no strategy time is reported (a loaded CPU cannot hold the rates: lower "
                       f"--rate-scale): {described}")


def _interrupt(signum, frame):
    raise KeyboardInterrupt

