"""Paired comparisons over seeds for the training studies: a continuous measure per seed, a bootstrap
confidence interval of the paired difference, an exact Wilcoxon signed-rank p-value, Holm's correction across
every comparison of a table, and a verdict.

The measure is the **time-averaged score**: the area under the score-against-simulated-time curve over the
window both runs of a seed cover, divided by the window's length (the mean score an observer sampling at a
random moment of that window would see). Chosen over the alternatives:
- time to a target moves only when a run crosses the threshold, and between syncs a run's score jumps at the
  sync, so it takes a few values set by where syncs fall (arms that sync often resolve finer); a run that never
  gets there has no value at all, so seeds are censored and a paired difference does not exist;
- the score at one equal time is a single sample of a sawtooth, set by the phase of the last sync before it;
- the area uses every evaluation (evaluations fall between syncs too) and exists for every run, so every
  seed gives one difference.
The window is [the later first evaluation, the earlier end] of the two runs: both are scored over the same
simulated time, so an arm that spends more on communication is cut where the cheaper one stops. Between
evaluations the score is interpolated linearly (trapezoids).

Per comparison the differences (this strategy minus the other, one per seed) get:
- a 95 % **BCa** bootstrap confidence interval of their mean (scipy.stats.bootstrap, 9,999 resamples, seeded:
  the same differences give the same interval). The differences are resampled, not each arm on its own: the
  seed is the pairing unit, and the shared seed effect (data split, initialization) cancels in a difference.
- a two-sided **Wilcoxon signed-rank** p-value (scipy.stats.wilcoxon, zero differences left out): exact for up
  to 50 seeds without ties or zeros, an exhaustive permutation of the signs for up to 13 seeds with them, the
  normal approximation beyond. All differences zero (identical runs): p = 1.
- **Holm's** step-down adjusted p-value across every comparison of the table (`holm`), which controls the
  chance of any false win or loss in the table at 5 %.
The verdict is `win` when the corrected p < 0.05 and the interval lies wholly on the side where this strategy
scores better, `loss` when it lies wholly on the other side with p < 0.05, `tie` otherwise. With n seeds the
smallest two-sided exact p is 2 / 2^n, so a table of m comparisons can hold a verdict other than a tie only
if m · 2 / 2^n < 0.05 (`smallest_corrected_p`).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

SIGNIFICANCE = 0.05
CONFIDENCE = 0.95
RESAMPLES = 9_999
BOOTSTRAP_SEED = 0
VERDICTS = ("win", "tie", "loss")


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's (1979) step-down adjusted p-values, in the order given: sorted ascending, the k-th smallest
    (from 0) is multiplied by m - k, capped at 1, and never less than the adjusted value before it."""
    for p in p_values:
        if not 0 <= p <= 1:
            raise ValueError(f"a p-value must be in [0, 1], got {p}")
    m = len(p_values)
    adjusted = [0.0] * m
    running = 0.0
    for rank, index in enumerate(sorted(range(m), key=lambda i: p_values[i])):
        running = max(running, min(1.0, (m - rank) * p_values[index]))
        adjusted[index] = running
    return adjusted


def smallest_corrected_p(seeds: int, comparisons: int) -> float:
    """The smallest Holm-corrected p a table of `comparisons` can hold with `seeds` seeds: the smallest
    two-sided exact signed-rank p, 2 / 2^seeds, times the number of comparisons."""
    return min(1.0, comparisons * 2.0 / 2.0 ** seeds)


def time_averaged(curve: Sequence[Mapping[str, Any]], key: str, start: float, end: float) -> float:
    """The mean of `key` over simulated time [start, end] (ms), linear between evaluations; an empty window
    gives the score at `end` (the last evaluation at that time)."""
    at: dict[float, float] = {}
    for point in curve:
        at[float(point["time_ms"])] = float(point[key])
    times, values = np.array(list(at)), np.array(list(at.values()))
    if end <= start:
        return float(np.interp(end, times, values))
    grid = np.array(sorted({start, end, *(t for t in times if start < t < end)}))
    scores = np.interp(grid, times, values)
    return float(np.sum((scores[1:] + scores[:-1]) / 2 * np.diff(grid)) / (end - start))


def paired_measure(curve: Sequence[Mapping[str, Any]], other: Sequence[Mapping[str, Any]], key: str
                   ) -> tuple[float, float]:
    """Both runs' time-averaged `key` over the simulated time they both cover (module docstring)."""
    end = min(curve[-1]["time_ms"], other[-1]["time_ms"])
    start = min(max(curve[0]["time_ms"], other[0]["time_ms"]), end)
    return time_averaged(curve, key, start, end), time_averaged(other, key, start, end)


def paired_test(differences: Sequence[float], seed: int = BOOTSTRAP_SEED) -> dict[str, Any]:
    """Mean of the per-seed differences, its BCa bootstrap interval and the signed-rank p (uncorrected).
    One seed gives no interval (None) and p = 1."""
    from scipy.stats import bootstrap, wilcoxon

    values = np.asarray(differences, dtype=float)
    if values.ndim != 1 or not len(values) or not np.all(np.isfinite(values)):
        raise ValueError(f"paired differences must be a non-empty list of finite numbers, got {list(differences)}")
    mean = float(np.mean(values))
    if len(values) < 2:
        return {"difference": mean, "ci": None, "p": 1.0}
    if np.ptp(values) == 0:
        # Every seed the same difference: the bootstrap has nothing to resample (BCa's jackknife divides by 0).
        interval = (mean, mean)
    else:
        with warnings.catch_warnings():
            # BCa warns when few distinct values make some resamples alike; the interval is still computed.
            warnings.simplefilter("ignore")
            result = bootstrap((values,), np.mean, confidence_level=CONFIDENCE, n_resamples=RESAMPLES,
                               method="BCa", random_state=np.random.default_rng(seed))
        interval = (float(result.confidence_interval.low), float(result.confidence_interval.high))
    # Identical runs: no rank to test (scipy warns and calls it 1).
    p = 1.0 if not np.any(values) else float(wilcoxon(values).pvalue)
    return {"difference": mean, "ci": list(interval), "p": p}


def verdict(ci: Sequence[float] | None, corrected_p: float, higher_is_better: bool) -> str:
    """win, loss or tie (module docstring): significance after correction and an interval excluding 0."""
    if ci is None or not corrected_p < SIGNIFICANCE:
        return "tie"
    low, high = ci
    better, worse = (low > 0, high < 0) if higher_is_better else (high < 0, low > 0)
    return "win" if better else "loss" if worse else "tie"


def correct(comparisons: Iterable[dict[str, Any]]) -> None:
    """Holm-correct the `p` of every comparison (one table's, each as `compare_runs` makes it) and set its
    `p_holm` and `verdict` in place."""
    table = list(comparisons)
    for comparison, adjusted in zip(table, holm([c["p"] for c in table]), strict=True):
        comparison["p_holm"] = adjusted
        comparison["verdict"] = verdict(comparison["ci"], adjusted, comparison["higher_is_better"])


def compare_runs(curves: Sequence[Sequence[Mapping[str, Any]]], others: Sequence[Sequence[Mapping[str, Any]]],
                 key: str, higher_is_better: bool, seed: int = BOOTSTRAP_SEED) -> dict[str, Any]:
    """One comparison, paired over seeds: `curves[i]` and `others[i]` are seed i's runs of the two strategies.
    The verdict stays `tie` until `correct` has seen the whole table."""
    if len(curves) != len(others) or not curves:
        raise ValueError(f"paired runs need one run of each strategy per seed, got {len(curves)} and {len(others)}")
    measured = [paired_measure(a, b, key) for a, b in zip(curves, others)]
    test = paired_test([a - b for a, b in measured], seed)
    return {"measure": f"time-averaged {key}", "higher_is_better": higher_is_better,
            "per_seed": [list(pair) for pair in measured], **test, "p_holm": None, "verdict": "tie"}


def format_difference(comparison: Mapping[str, Any], digits: int, scale: float = 1.0) -> str:
    """The difference with its interval, e.g. "+0.012 [+0.004, +0.020]"; without an interval the mean alone."""
    def signed(value: float) -> str:
        return f"{value * scale:+.{digits}f}"

    if comparison["ci"] is None:
        return signed(comparison["difference"])
    low, high = comparison["ci"]
    return f"{signed(comparison['difference'])} [{signed(low)}, {signed(high)}]"


def format_p(p: float | None) -> str:
    if p is None:
        return "–"
    return f"{p:.2g}" if p >= 0.001 else f"{p:.1e}"


def describe(seeds: int, comparisons: int) -> str:
    """The rule in a sentence for a table's caption, with what `smallest_corrected_p` allows."""
    floor = smallest_corrected_p(seeds, comparisons)
    reach = ": no verdict in it can be other than a tie" if not floor < SIGNIFICANCE else ""
    return (f"Win or loss: Holm-corrected p < {SIGNIFICANCE:g} over the table's {comparisons} comparisons and the "
            f"{CONFIDENCE * 100:g} % BCa bootstrap interval of the paired difference excluding 0; the Wilcoxon "
            f"signed-rank test over {seeds} seeds cannot give less than p = {2 / 2 ** seeds:.2g}, which Holm "
            f"multiplies by up to {comparisons}: at best {format_p(floor)}{reach}")

