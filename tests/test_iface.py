"""`iface:` target: islands as raw-frame hosts on a veth, an aggregator behind it in a namespace."""

import json
import os
import subprocess

import pytest

from inwire.cli import main
from inwire.datagram import ip_str
from inwire.model import AggregatorConfig
from inwire.netns import inside, unavailable_reason
from inwire.packets import mac_bytes
from inwire.serve import SoftwareAggregator, serving_in_thread
from schedules import write_schedule

REASON = unavailable_reason()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"network namespaces unavailable: {REASON}")
BOARD = AggregatorConfig()
"""The software aggregator stands in for a board: it takes the gateware's default MAC and address."""


def ip(*args):
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=10)


@pytest.fixture
def wire(tmp_path):
    """A veth pair: our end in this namespace, the other in the aggregator's, which serves on it."""
    tag = f"iwf{os.getpid() % 100000}"
    namespace, ours = f"{tag}ns", f"{tag}a"
    board_ip = ip_str(BOARD.ip)
    ip("netns", "add", namespace)
    try:
        ip("link", "add", ours, "type", "veth", "peer", "name", "eth0", "netns", namespace)
        ip("link", "set", ours, "up")
        mac = ":".join(f"{byte:02x}" for byte in mac_bytes(BOARD.mac))
        ip("-n", namespace, "link", "set", "eth0", "address", mac)
        ip("-n", namespace, "addr", "add", f"{board_ip}/16", "dev", "eth0")
        ip("-n", namespace, "link", "set", "eth0", "up")
        ip("-n", namespace, "route", "add", "239.0.0.0/8", "dev", "eth0")
        with inside(namespace):
            # The islands' segment (10.73.1.x) shares the board's /16: a service answers stats there only when
            # told (a stats reply is larger than its request).
            server = SoftwareAggregator((board_ip, BOARD.port), multicast_iface=board_ip, log=lambda line: None,
                                        stats_from="10.73.0.0/16")
        with serving_in_thread(server):
            yield ours, server
    finally:
        subprocess.run(["ip", "netns", "del", namespace], capture_output=True, timeout=10)


def test_islands_on_raw_frames_get_bit_exact_results(wire, tmp_path, capsys):
    interface, server = wire
    schedule = write_schedule(tmp_path / "schedule.json")
    assert main(["stream", "--target", f"iface:{interface}", "--schedule", str(schedule),
                 "--rounds", "3", "--elements", "600", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["bit_exact"] and report["finished"]
    assert server.counters()["accumulated"] == 3 * 5 * -(-600 // 256)
    assert "unicast_copies" not in {name for name, value in server.counters().items() if value}


def test_unknown_interface_is_one_line_and_exit_2(tmp_path, capsys):
    assert main(["stream", "--target", "iface:no-such-nic0", "--schedule",
                 str(write_schedule(tmp_path / "schedule.json"))]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "no-such-nic0" in error
