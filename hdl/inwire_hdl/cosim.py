"""The simulated gateware as an aggregator object: `process(frame, now)` and `stats()`, like the golden model.

A cocotb test (`inwire_hdl.cocotb.cosim`) runs in the simulator and serves frames over a Unix socket,
one at a time: the lease ticks from the previous frame's time to this one's are driven (one per cycle,
so a long pause costs simulated cycles), the frame is driven in, the output is collected until it has
been quiet, and the frames out and the counters come back. Host tools that talk to
`inwire.model.Aggregator` can talk to the gateware the same way.
"""

import json
import socket
import struct
import tempfile
import threading
from pathlib import Path

from inwire.model import TIME_BITS
from inwire.protocol import COUNTERS

from .sim import SimulationError, build, run

CONNECT_TIMEOUT_S = 120
ANSWER_TIMEOUT_S = 120
QUIT = 0xFFFFFFFF


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
    def __init__(self, simulator, data_width, config):
        self.config = config
        runner, run_dir = build(simulator, data_width, config)
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
        try:
            self.connection.sendall(struct.pack(">II", len(frame), ticks) + frame)
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
