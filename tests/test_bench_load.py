"""A benchmark figure is flagged `loaded` by what other programs did while it ran, not by its own work:
the islands, service and references it starts and waits for are its own, a program it does not own is
foreign."""

import subprocess
import sys
import time

import pytest

from inwire import host_bench
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


def test_the_benchmarks_own_children_are_counted_as_its_own():
    """A second of CPU in a child the benchmark starts and waits for (an island, the service, iperf3) is
    charged to the benchmark, however busy the machine is."""
    before = host_bench._own_cpu_s()
    subprocess.run([sys.executable, "-c", SPIN], check=True)
    assert host_bench._own_cpu_s() - before >= 0.95


@pytest.mark.parametrize("own_s, loaded", [(1.99, False), (0.0, True)])
def test_only_the_busy_time_that_is_not_the_benchmarks_is_foreign(monkeypatch, own_s, loaded):
    """Of the machine's 2 busy seconds during a figure, those the benchmark's own processes spent are not
    foreign: all of them its own, the figure is quiet; none of them, it is loaded."""
    busy, own = iter([100.0, 102.0]), iter([10.0, 10.0 + own_s])
    monkeypatch.setattr(host_bench, "_machine_busy_s", lambda: next(busy))
    monkeypatch.setattr(host_bench, "_own_cpu_s", lambda: next(own))
    with MachineLoad() as load:
        time.sleep(0.2)
    assert load.record({})["loaded"] is loaded


def test_where_the_time_goes_measures_every_part_of_a_real_averaging():
    """The parts are timed on the real code: the service's results of every member's contributions finish
    the member's sum (the measurement fails otherwise), and every part costs some CPU."""
    from inwire.train import bench

    parts = bench.where_the_time_goes(elements=3 * bench.CHUNK * 40, sample=bench.CHUNK * 20)
    assert parts["results_per_member"] == 3 * 40 and parts["contributions_at_service"] == 3 * 3 * 40
    assert all(parts[name] > 0 for name in ("encode_s", "decode_s", "member_us_per_result",
                                            "service_us_per_contribution"))


def test_where_the_time_goes_fails_when_the_results_do_not_finish_the_sum(monkeypatch):
    """A service that answers nothing leaves the member's sum unfinished: the measurement says so instead of
    timing nothing."""
    from inwire.serve import SoftwareAggregator
    from inwire.train import bench

    monkeypatch.setattr(SoftwareAggregator, "handle_batch", lambda self, *batch: [])
    with pytest.raises(RuntimeError, match="did not finish"):
        bench.where_the_time_goes(elements=bench.CHUNK * 30, sample=bench.CHUNK * 10)
