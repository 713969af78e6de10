"""Fuzzing: mutated frames through the gateware (cocotb, Verilator and Icarus) and through the software
aggregator.

The CI subset runs a few thousand frames on Verilator and a short stream of another seed on Icarus;
`make fuzz` runs the Verilator and software tests with INWIRE_FUZZ_FRAMES=100000 (docs/verification.md). The
gateware is the cocotb suite's build, with job tables: the fuzz installs two registered jobs and mixes their
version 3 traffic, and forgeries of it, into the stream.
"""

import json
import os
import shutil
import socket
import threading
from pathlib import Path

import numpy as np
import pytest

from inwire.datagram import parse_payload_header, parse_result, parse_stats_reply, payload_of, stats_request
from inwire.packets import build_frames
from inwire.protocol import DROP_COUNTERS, INT32_MAX, INT32_MIN, Disposition, Opcode
from traffic import GATEWARE_CONFIG

FUZZ_CONFIG = GATEWARE_CONFIG
"""The cocotb suite's build (no build of its own): job tables beside versions 1 and 2."""
JOB_DROPS = ("drop_job", "drop_token", "drop_member")
"""The registered jobs' checks the stream must reach."""
CI_FRAMES = {("verilator", 8): 2000, ("verilator", 64): 1000, ("icarus", 8): 1000, ("icarus", 64): 400}
"""Icarus runs a short stream: it simulates the same design several times slower than Verilator."""
SEED_OFFSET = {"verilator": 0, "icarus": 1}
"""Icarus gets another seed, so that its stream is not the start of Verilator's."""


def fuzz_frames(width, simulator="verilator"):
    return int(os.environ.get("INWIRE_FUZZ_FRAMES", CI_FRAMES[simulator, width]))


@pytest.mark.sim
@pytest.mark.parametrize("width", [8, 64])
@pytest.mark.parametrize("simulator", ["verilator", "icarus"])
def test_gateware_survives_fuzzing_then_aggregates(simulator, width, tmp_path):
    tool = {"verilator": "verilator", "icarus": "iverilog"}[simulator]
    if shutil.which(tool) is None:
        pytest.fail(f"{tool} is not on PATH (run `make setup`)")
    from inwire_hdl import sim

    runner, build_dir = sim.build(simulator, width, FUZZ_CONFIG, build_root=Path("build") / "fuzz")
    report = tmp_path / "report.json"
    frames = fuzz_frames(width, simulator)
    seed = int(os.environ.get("INWIRE_FUZZ_SEED", width + SEED_OFFSET[simulator]))
    outcome = sim.run(runner, build_dir, FUZZ_CONFIG, test_module="fuzz_cocotb", results_name="fuzz.xml",
                      extra_env={"INWIRE_FUZZ_FRAMES": str(frames), "INWIRE_FUZZ_SEED": str(seed),
                                 "INWIRE_FUZZ_REPORT": str(report)})
    assert outcome == {"fuzz_then_clean_round": True}, f"fuzz failed at seed {seed}, see {build_dir}/fuzz.log"
    summary = json.loads(report.read_text())
    print(json.dumps(summary))
    reached = {d.name.lower(): summary["fuzz_counters"][d.name.lower()] for d in Disposition}
    print(f"{simulator} width {width}, seed {seed}, {frames} frames: "
          + ", ".join(f"{name} {count}" for name, count in reached.items()))
    assert summary["frames"] == frames
    assert all(reached[name] for name in JOB_DROPS), reached
    assert summary["counters"]["frames_in"] == frames + summary["clean_frames"]
    assert summary["clean_results"] == FUZZ_CONFIG.slots
    # Functional coverage: every frame class and every slot transition was hit (and checked).
    assert summary["coverage"]["missing"] == [], summary["coverage"]


@pytest.fixture
def server():
    from inwire.serve import SoftwareAggregator

    lines = []
    instance = SoftwareAggregator(("127.0.0.1", 0), unicast=True, slots=FUZZ_CONFIG.slots,
                                  max_elements=FUZZ_CONFIG.max_elements, log=lines.append)
    thread = threading.Thread(target=instance.serve, daemon=True)
    thread.start()
    yield instance
    instance.stop()
    thread.join(timeout=5)
    instance.close()
    assert not thread.is_alive()


def _socket():
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.settimeout(5)
    return sock


def test_software_aggregator_keeps_serving_mutated_datagrams(server):
    """The UDP payloads of the mutated frames, then a clique whose result must come back right."""
    from mutate import Mutator

    frames = fuzz_frames(8)
    mutator = Mutator(server.config, seed=int(os.environ.get("INWIRE_FUZZ_SEED", 5)))
    sender = _socket()

    def counters_now(tag):
        """A stats request answers after every datagram before it: the counters, and flow control. The
        job field tells its reply from replies to fuzzed stats requests."""
        sender.sendto(stats_request(job=tag), server.address)
        while True:
            payload = sender.recvfrom(65535)[0]
            reply = parse_stats_reply(payload)
            if reply is not None and parse_payload_header(payload)["job"] == tag:
                return reply

    payloads = [payload_of(frame) for _, frame in mutator.frames(frames)]
    payloads += [b"", bytes(65507), bytes(range(256)) * 8]
    sent = 0
    for start in range(0, len(payloads), 32):
        for payload in payloads[start:start + 32]:
            sender.sendto(payload, server.address)
        sent += len(payloads[start:start + 32])
        reply = counters_now(0x5EED0000 + start)
        sent += 1
        # Every datagram, the stats requests included, is counted once.
        assert reply["frames_in"] == sent - 1
    assert sum(reply[name] for name in DROP_COUNTERS) > 0

    # A clean clique on a slot reclaimed by a newer round: every member gets the clipped sum.
    slot = 1
    owner = server.slot_key(slot)
    job, round_ = (owner[0], (owner[1] + 1) & 0xFFFFFFFF) if owner else (77, 1)
    members = [_socket() for _ in range(3)]
    vectors = np.random.default_rng(9).integers(INT32_MIN, INT32_MAX, size=(3, 8))
    for index, (member, vector) in enumerate(zip(members, vectors, strict=True)):
        frame = build_frames(vector, opcode=Opcode.CONTRIBUTION, sender=index, fanin=3, job=job, round=round_,
                             slot=slot, group=0xEF_01_01_01)
        member.sendto(payload_of(frame[0]), server.address)
    want = vectors[0]
    for vector in vectors[1:]:
        want = np.clip(want + vector, INT32_MIN, INT32_MAX)
    for member in members:
        payload = member.recvfrom(65535)[0]
        result = parse_result(payload)
        assert result is not None and result.header["round"] == round_
        assert list(result.elements) == list(want)
        member.close()
    sender.close()
