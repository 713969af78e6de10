"""The studies' statistics on constructed data: Holm's correction on a worked example, the time-averaged score,
paired bootstrap intervals and signed-rank p-values, and the verdicts they give."""

import warnings

import numpy as np
import pytest

from inwire.train import stats


def flat(value, end_ms=100.0, key="accuracy"):
    """A run whose score stays at `value` from its first evaluation to `end_ms`."""
    return [{"time_ms": 10.0, key: value}, {"time_ms": end_ms, key: value}]


def study_pair(gain, spread, noise, seeds=10, key="accuracy"):
    """Per seed, a strategy scoring `gain` above the other, both sharing a seed effect drawn over `spread` (the
    data split and initialization move both), plus independent noise of scale `noise`."""
    rng = np.random.default_rng(7)
    base = rng.uniform(0.5 - spread, 0.5 + spread, seeds)
    first = base + gain + rng.normal(0, noise, seeds)
    second = base + rng.normal(0, noise, seeds)
    return [flat(v, key=key) for v in first], [flat(v, key=key) for v in second]


def test_holm_on_the_worked_example():
    """Four hypotheses at α = 0.05 with p = 0.01, 0.04, 0.03, 0.005 (the Holm–Bonferroni method's worked example
    in Wikipedia, and R's p.adjust(method = "holm")): H4 and H1 are rejected, H3 and H2 are not, although both
    are below 0.05 uncorrected. H2's 0.04 × 1 would stay 0.04 without the step-down maximum; it is 0.06."""
    adjusted = stats.holm([0.01, 0.04, 0.03, 0.005])
    assert adjusted == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert [p < 0.05 for p in adjusted] == [True, False, False, True]
    assert stats.holm([0.5, 0.9]) == [1.0, 1.0], "capped at 1"
    assert stats.holm([]) == []


def test_holm_refuses_what_is_not_a_p_value():
    with pytest.raises(ValueError, match="in \\[0, 1\\], got 1.5"):
        stats.holm([0.1, 1.5])


def test_the_time_averaged_score_is_the_area_over_the_window_both_runs_cover():
    rising = [{"time_ms": 0.0, "loss": 0.0}, {"time_ms": 10.0, "loss": 1.0}]
    assert stats.time_averaged(rising, "loss", 0.0, 10.0) == pytest.approx(0.5)
    assert stats.time_averaged(rising, "loss", 0.0, 5.0) == pytest.approx(0.25)
    # A sync's jump between two evaluations is linear between them; after the last one the score holds.
    step = [{"time_ms": 0.0, "loss": 1.0}, {"time_ms": 2.0, "loss": 1.0}, {"time_ms": 4.0, "loss": 3.0}]
    assert stats.time_averaged(step, "loss", 0.0, 4.0) == pytest.approx((2 * 1 + 2 * 2) / 4)
    # The run that spends longer communicating is cut where the other one ends.
    short = [{"time_ms": 0.0, "loss": 2.0}, {"time_ms": 5.0, "loss": 2.0}]
    assert stats.paired_measure(rising, short, "loss") == pytest.approx((0.25, 2.0))
    assert stats.time_averaged(step, "loss", 4.0, 4.0) == 3.0, "an empty window: the score at its end"


def test_a_clear_win_is_found_through_the_seeds_pairing():
    """The seed effect (±0.2) dwarfs the gain (0.01): only the paired difference shows it. Resampling each arm
    on its own gives an interval around 0.01 about 0.2 wide, which includes 0."""
    better, worse = study_pair(gain=0.01, spread=0.2, noise=0.002)
    comparison = stats.compare_runs(better, worse, "accuracy", higher_is_better=True)
    stats.correct([comparison])
    low, high = comparison["ci"]
    assert 0 < low < 0.01 < high < 0.02
    assert comparison["p"] == pytest.approx(2 / 2 ** 10), "every seed one way: the exact signed-rank p"
    assert comparison["p_holm"] == comparison["p"] and comparison["verdict"] == "win"


def test_a_clear_loss_and_a_loss_measured_the_other_way_round():
    worse, better = study_pair(gain=-0.01, spread=0.2, noise=0.002)
    comparison = stats.compare_runs(worse, better, "accuracy", higher_is_better=True)
    stats.correct([comparison])
    assert comparison["ci"][1] < 0 and comparison["verdict"] == "loss"
    # A lower validation loss is the better one: the same numbers as losses are a win.
    lower, higher = study_pair(gain=-0.01, spread=0.2, noise=0.002, key="loss")
    comparison = stats.compare_runs(lower, higher, "loss", higher_is_better=False)
    stats.correct([comparison])
    assert comparison["verdict"] == "win"


def test_no_difference_is_a_tie():
    same, other = study_pair(gain=0.0, spread=0.2, noise=0.01)
    comparison = stats.compare_runs(same, other, "accuracy", higher_is_better=True)
    stats.correct([comparison])
    low, high = comparison["ci"]
    assert low < 0 < high and comparison["p"] > 0.05 and comparison["verdict"] == "tie"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        identical = stats.compare_runs(same, same, "accuracy", higher_is_better=True)
    assert identical["ci"] == [0.0, 0.0] and identical["p"] == 1.0


def test_a_difference_significant_alone_is_a_tie_in_a_table_of_many():
    """p = 0.0039 (9 of 10 seeds one way) wins alone; among 20 comparisons Holm makes it 0.078: a tie."""
    better, worse = study_pair(gain=0.01, spread=0.2, noise=0.002)
    worse[0] = flat(better[0][0]["accuracy"] + 0.0001)
    alone = stats.compare_runs(better, worse, "accuracy", higher_is_better=True)
    stats.correct([alone])
    assert alone["p"] == pytest.approx(0.00390625) and alone["verdict"] == "win"
    table = [stats.compare_runs(better, worse, "accuracy", higher_is_better=True) for _ in range(20)]
    stats.correct(table)
    assert table[0]["p_holm"] == pytest.approx(20 * 0.00390625) and table[0]["verdict"] == "tie"


def test_the_interval_is_seeded_and_the_verdict_needs_both_rules():
    differences = [0.3, 0.1, 0.5, 0.2, 0.4, -0.05, 0.35, 0.25, 0.15, 0.45]
    assert stats.paired_test(differences) == stats.paired_test(differences)
    assert stats.verdict([0.1, 0.5], 0.01, True) == "win"
    assert stats.verdict([0.1, 0.5], 0.06, True) == "tie", "significance after correction is needed"
    assert stats.verdict([-0.1, 0.5], 0.01, True) == "tie", "an interval over 0 is a tie"
    assert stats.verdict([0.1, 0.5], 0.01, False) == "loss"
    assert stats.verdict(None, 0.0, True) == "tie", "one seed has no interval"


def test_one_seed_has_no_interval_and_bad_differences_are_refused():
    assert stats.paired_test([0.3]) == {"difference": 0.3, "ci": None, "p": 1.0}
    for bad in ([], [0.1, float("nan")]):
        with pytest.raises(ValueError, match="paired differences"):
            stats.paired_test(bad)
    with pytest.raises(ValueError, match="one run of each strategy per seed"):
        stats.compare_runs([flat(0.5)], [], "accuracy", True)


def test_the_caption_says_when_no_verdict_can_be_other_than_a_tie():
    assert stats.smallest_corrected_p(10, 15) == pytest.approx(15 * 2 / 1024)
    assert "no verdict in it can be other than a tie" in stats.describe(10, 384)
    assert "other than a tie" not in stats.describe(20, 384)
