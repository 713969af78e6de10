"""`inwire serve` processes the tests start on loopback."""

import contextlib
import shutil
import subprocess
import sys

import pytest


@contextlib.contextmanager
def served_gateware(*options):
    """`inwire serve --sim icarus:8` on 127.0.0.1, its results multicast out of lo, with `options`: (its port,
    its listening line) once it is built; stopped after the body."""
    if shutil.which("iverilog") is None:
        pytest.fail("iverilog is not on PATH (run `make setup`)")
    process = subprocess.Popen([sys.executable, "-m", "inwire", "serve", "--sim", "icarus:8", "--listen", "127.0.0.1:0",
                                "--multicast-iface", "127.0.0.1", *options], stderr=subprocess.PIPE, text=True)
    try:
        line = process.stderr.readline()
        if line.startswith("inwire serve: building the gateware"):
            line = process.stderr.readline()
        assert "listening on udp://127.0.0.1:" in line, line
        yield int(line.split("udp://127.0.0.1:")[1].split(",")[0]), line.rstrip()
    finally:
        process.terminate()
        try:
            process.communicate(timeout=30)
        finally:
            process.kill()
