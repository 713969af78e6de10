"""Verilator line coverage of the aggregator over the cocotb suite and a fuzz run (`make coverage`)."""

import shutil

import pytest


@pytest.mark.sim
def test_suite_covers_the_core_lines():
    if shutil.which("verilator") is None:
        pytest.fail("verilator is not on PATH (run `make setup`)")
    import verilator_coverage

    report = verilator_coverage.measure(width=8, frames=1000)
    line = report["line"]
    # Every coverage point is either hit or listed with its source line.
    assert line["total"] > 0 and line["total"] - line["covered"] == len(line["uncovered"])
    assert line["percent"] >= verilator_coverage.LINE_GOAL, line["uncovered"]
    assert report["toggle"]["covered"] > 0
