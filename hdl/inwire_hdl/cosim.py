"""The simulated gateware as an aggregator object: `process(frame, now)`, `stats()`, and with job tables
(`config.registered`) `install(entry)`, `leave(job, members)` and `remove(job)`, like the golden model.

A cocotb test (`inwire_hdl.cocotb.cosim`) runs in the simulator and serves frames over a Unix socket,
one at a time: the lease ticks from the previous frame's time to this one's are driven (one per cycle,
so a long pause costs simulated cycles), the frame is driven in, the output is collected until it has
been quiet, and the frames out and the counters come back. Between frames a control message drives
control-interface writes (ctl_we, ctl_addr, ctl_data), one a cycle, and the counters come back. Host
tools that talk to `inwire.model.Aggregator` can talk to the gateware the same way.

Messages to the simulator (big-endian 32-bit words): a frame is its size, the lease ticks before it, then
its bytes; a control message is CONTROL, the number of writes, then (address, word) per write; QUIT ends
the service. Each frame and control message is answered with a size and that many bytes of JSON (the
frames out, hex, and the counters).
"""

import json
import socket
import struct
import tempfile
import threading
from pathlib import Path

from inwire.jobs import JobEntry
from inwire.model import TIME_BITS
from inwire.model import Aggregator as Model
from inwire.protocol import COUNTERS

from .job_table import GatewareJobs
from .sim import SimulationError, build, run

CONNECT_TIMEOUT_S = 120
ANSWER_TIMEOUT_S = 120
QUIT = 0xFFFFFFFF
CONTROL = 0xFFFFFFFE
"""In the place of a frame's size: control-interface writes follow (no frame is this long)."""


def receive_exactly(connection, size):
    """`size` bytes from a stream socket; both ends of the co-simulation read their messages with it."""
    data = b""
    while len(data) < size:
        chunk = connection.recv(size - len(data))
        if not chunk:
            raise ConnectionError("the other end of the co-simulation closed the connection")
        data += chunk
    return data


class CoSimulation:
    def __init__(self, simulator, data_width, config, mutant=None):
        """`mutant`: the broken aggregator of that name (`inwire_hdl.mutants`) in place of the real one."""
        self.config = config
        runner, run_dir = build(simulator, data_width, config, mutant=mutant)
        self.scratch = tempfile.TemporaryDirectory(prefix="inwire-cosim-")
        path = str(Path(self.scratch.name) / "cosim.sock")
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(path)
        listener.listen(1)
        listener.settimeout(CONNECT_TIMEOUT_S)
        self.outcome = {}
        self.thread = threading.Thread(target=self._simulate, args=(runner, run_dir, path), daemon=True)
        self.thread.start()
        try:
            self.connection, _ = listener.accept()
        except TimeoutError:
            raise SimulationError(f"the {simulator} co-simulation did not connect within {CONNECT_TIMEOUT_S} s, "
                                  f"see {run_dir / 'cosim.log'}") from None
        finally:
            listener.close()
        self.connection.settimeout(ANSWER_TIMEOUT_S)
        self.counters = dict.fromkeys(COUNTERS, 0)
        """The gateware's counters after the last frame; zero after its reset."""
        self.now = 0
        """The previous frame's arrival time in lease ticks, modulo 2**TIME_BITS; zero after reset."""
        self.jobs = GatewareJobs(Model(config))
        """The gateware's job tables as the host keeps them: a golden model holding the same jobs, which decides
        each job's range and refuses what the tables cannot hold, and which entry holds which job."""

    def _simulate(self, runner, run_dir, path):
        try:
            self.outcome = run(runner, run_dir, self.config, testcase="cosim", test_module="inwire_hdl.cocotb.cosim",
                               extra_env={"INWIRE_COSIM_SOCKET": path}, results_name="cosim.xml")
        except SimulationError as error:
            self.outcome = {"error": str(error)}

    def process(self, frame, now=None):
        """Frames the gateware sends in answer to `frame` (aborted ones left out), as the model's `process`:
        `now` is its arrival time in lease ticks, None for no time since the previous frame."""
        frame = bytes(frame)
        ticks = 0
        if now is not None:
            ticks = (now - self.now) % 2**TIME_BITS
            self.now = now % 2**TIME_BITS
        return self._exchange(struct.pack(">II", len(frame), ticks) + frame)

    def install(self, entry: JobEntry):
        """Install or renew a job in the gateware's tables, as the model's `install`: its first slot. What the
        tables cannot hold (a job without a group, too many members or jobs) is refused by the model, with
        its `JobTableError`, before anything is written."""
        writes = self.jobs.install(entry)
        self._write(writes)
        return self.jobs.model.jobs.bases[entry.job]

    def remove(self, job):
        """Tear a job down in the gateware's tables, as the model's `remove`: whether it was there."""
        writes = self.jobs.remove(job)
        if not writes:
            return False
        self._write(writes)
        return True

    def leave(self, job, members):
        """`members` leave a job in the gateware's tables, as the model's `leave`: (how many were members, how
        many remain); the last member's leave tears the job down."""
        writes, left, remaining = self.jobs.leave(job, members)
        if writes:
            self._write(writes)
        return left, remaining

    def _write(self, writes):
        message = struct.pack(">II", CONTROL, len(writes))
        message += b"".join(struct.pack(">II", address, word) for address, word in writes)
        self._exchange(message)

    def _exchange(self, message):
        """Send one message to the simulator; the frames of its answer (the counters are kept)."""
        try:
            self.connection.sendall(message)
            size = struct.unpack(">I", receive_exactly(self.connection, 4))[0]
            answer = json.loads(receive_exactly(self.connection, size))
        except (OSError, ConnectionError) as error:
            raise SimulationError(f"co-simulation stopped answering: {error}") from None
        self.counters = answer["counters"]
        return [bytes.fromhex(output) for output in answer["frames"]]

    def stats(self):
        return dict(self.counters)

    def close(self):
        try:
            self.connection.sendall(struct.pack(">I", QUIT))
        except OSError:
            pass
        self.connection.close()
        self.thread.join(timeout=ANSWER_TIMEOUT_S)
        self.scratch.cleanup()
