"""A benchmark figure is flagged `loaded` by what other programs did while it ran, not by its own work:
the islands, service and references it starts and waits for are its own, a program it does not own is
foreign."""

import subprocess
import sys
import time

from inwire.host_bench import FOREIGN_LIMIT, MachineLoad

SPIN = "import time\nend = time.process_time() + 1.0\nwhile time.process_time() < end: pass\n"
"""One second of one core's CPU."""


def test_a_program_outside_the_benchmark_flags_the_figure():
    """A busy program that the figure neither started nor waited for (as another user's job) counts as
    foreign: about one core, and the figure is flagged."""
    spinner = subprocess.Popen([sys.executable, "-c", SPIN])
    try:
        time.sleep(0.1)
        with MachineLoad() as load:
            time.sleep(0.6)
    finally:
        spinner.wait()
    entry = load.record({})
    assert entry["foreign_cpu_cores"] > FOREIGN_LIMIT
    assert entry["loaded"] is True
    assert set(entry["load_average_1min"]) == {"before", "after"}


def test_the_benchmarks_own_children_are_not_foreign():
    """The same second of CPU in a child the figure starts and waits for is its own: not flagged."""
    with MachineLoad() as load:
        subprocess.run([sys.executable, "-c", SPIN], check=True)
    entry = load.record({})
    assert entry["foreign_cpu_cores"] < FOREIGN_LIMIT
    assert entry["loaded"] is False
