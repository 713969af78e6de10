"""The `host` benchmark: software aggregator goodput against the machine's UDP ceiling, and the numpy
packet path against scapy.

Goodput: two islands on loopback stream a vector through `inwire serve` (a separate process, unicast
results); gradient bytes summed per second. Ceiling: iperf3 UDP on loopback in the same run, same datagram
size, unlimited rate; received payload bytes per second. Packet rates: frames built and parsed per second by
`packets.build_frames` / `parse_frames` and by scapy one packet at a time.
"""

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

import numpy as np

from .datagram import PAYLOAD_HEADER_BYTES
from .protocol import INWIRE_PORT, Opcode
from .stream import DEFAULT_CHUNK, StreamConfig, load_plan, run_stream
from .transport import UdpTransport

ELEMENTS = 256 * 2048
WINDOW = 32
IPERF_SECONDS = 3
NUMPY_FRAMES = 4096
SCAPY_FRAMES = 400


def _free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def aggregator_goodput(elements=ELEMENTS, chunk=DEFAULT_CHUNK, window=WINDOW):
    port = _free_port()
    environment = {**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(os.path.abspath(__file__)))}
    service = subprocess.Popen([sys.executable, "-m", "inwire", "serve", "--listen", f"127.0.0.1:{port}", "--unicast",
                                "--max-elements", str(chunk)], stderr=subprocess.PIPE, text=True, env=environment)
    try:
        if "listening on" not in service.stderr.readline():
            raise RuntimeError("inwire serve did not start")
        with tempfile.TemporaryDirectory() as scratch:
            path = os.path.join(scratch, "schedule.json")
            with open(path, "w") as handle:
                json.dump({"topology": "doublezero9", "islands": ["LON", "FRA"],
                           "rounds": [{"cliques": [{"members": ["LON", "FRA"], "aggregator": "AMS"}]}]}, handle)
            plan = load_plan(path)
        config = StreamConfig(rounds=2, elements=elements, chunk=chunk, window=window, timeout_ms=500, job=4242)
        report = run_stream(plan, config, UdpTransport({island: ("127.0.0.1", port) for island in plan.islands}))
    finally:
        service.terminate()
        service.communicate(timeout=10)
    if not report["bit_exact"]:
        raise RuntimeError("benchmark run was not bit-exact")
    return {"goodput_bytes_per_s": report["goodput_bytes_per_s"], "elements": elements, "chunk": chunk,
            "window": window, "islands": 2, "rounds": 2, "retransmits": report["retransmits"],
            "datagram_bytes": PAYLOAD_HEADER_BYTES + 4 * chunk}


def udp_ceiling(datagram_bytes, seconds=IPERF_SECONDS):
    """iperf3 UDP on loopback at unlimited rate: payload bytes per second that arrived."""
    if shutil.which("iperf3") is None:
        return None
    port = str(_free_port())
    server = subprocess.Popen(["iperf3", "-s", "-1", "-p", port], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        time.sleep(0.5)
        client = subprocess.run(["iperf3", "-c", "127.0.0.1", "-p", port, "-u", "-b", "0", "-l", str(datagram_bytes),
                                 "-t", str(seconds), "-J"], capture_output=True, text=True, timeout=seconds + 30)
        result = json.loads(client.stdout)["end"]["sum"]
    finally:
        server.kill()
        server.wait()
    return result["bits_per_second"] / 8 * (1 - result["lost_percent"] / 100)


def packet_rates(chunk=DEFAULT_CHUNK):
    from scapy.config import conf
    from scapy.layers.inet import IP, UDP
    from scapy.layers.l2 import Ether

    from .layers import Inwire
    from .packets import build_frames, parse_frames

    rng = np.random.default_rng(0)
    values = rng.integers(-2**20, 2**20, (NUMPY_FRAMES, chunk), dtype=np.int32)
    fields = dict(opcode=Opcode.CONTRIBUTION, fanin=4, sender=1, job=1, round=2, clique=0, group=0xEF490001,
                  slot=np.arange(NUMPY_FRAMES) % 64, chunk=np.arange(NUMPY_FRAMES) * chunk)
    started = time.perf_counter()
    frames = build_frames(values, **fields)
    numpy_build = NUMPY_FRAMES / (time.perf_counter() - started)
    started = time.perf_counter()
    headers, elements = parse_frames(frames)
    numpy_parse = NUMPY_FRAMES / (time.perf_counter() - started)
    assert np.array_equal(elements, values) and headers["chunk"][-1] == (NUMPY_FRAMES - 1) * chunk

    started = time.perf_counter()
    udp = UDP(sport=INWIRE_PORT, dport=INWIRE_PORT)
    built = [bytes(Ether(dst="02:49:57:00:00:01") / IP(dst="10.73.87.1", flags="DF") / udp /
                   Inwire(opcode="contribution", fanin=4, sender=1, job=1, round=2, slot=i % 64, chunk=i * chunk,
                          group="239.73.0.1", elements=values[i].tolist())) for i in range(SCAPY_FRAMES)]
    scapy_build = SCAPY_FRAMES / (time.perf_counter() - started)
    # scapy refuses lists longer than conf.max_list_count (100) while dissecting, unless told otherwise.
    conf.max_list_count = max(conf.max_list_count, chunk)
    started = time.perf_counter()
    parsed = [Ether(frame)[Inwire] for frame in built]
    checks = [(packet.chunk, packet.elements[-1]) for packet in parsed]
    scapy_parse = SCAPY_FRAMES / (time.perf_counter() - started)
    assert checks[-1] == ((SCAPY_FRAMES - 1) * chunk, int(values[SCAPY_FRAMES - 1, -1]))
    return {"elements_per_frame": chunk,
            "numpy_build_per_s": numpy_build, "scapy_build_per_s": scapy_build,
            "build_ratio": numpy_build / scapy_build,
            "numpy_parse_per_s": numpy_parse, "scapy_parse_per_s": scapy_parse,
            "parse_ratio": numpy_parse / scapy_parse}


def run():
    """The `host` key of bench/results.json."""
    aggregator = aggregator_goodput()
    ceiling = udp_ceiling(aggregator["datagram_bytes"])
    return {
        "software_aggregator": {
            **aggregator,
            "udp_ceiling_bytes_per_s": ceiling,
            "ratio_to_ceiling": None if ceiling is None else aggregator["goodput_bytes_per_s"] / ceiling,
            "ceiling_tool": "iperf3 -u -b 0 on loopback" if ceiling is not None else "iperf3 not installed",
        },
        "packets": packet_rates(),
    }


if __name__ == "__main__":
    print(json.dumps(run(), indent=1))
