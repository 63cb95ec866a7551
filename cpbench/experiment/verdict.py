"""An experiment against its reference, as pure functions: the walltime change with a confidence
interval from the repeats, and the verdict judged against the run's own noise.

A/B/A: the reference (the baseline, or the gate's winner) is measured just before and just after the
experiment. Its repeats are pooled, so slow drift over the experiment's span shifts both sides alike,
and the gap between the two reference medians (the drift) is noise the verdict must exceed."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from cpbench.experiment.plan import BETTER, NOISE, WORSE

LEVEL = 0.95  # of the confidence interval
RESAMPLES = 4000


@dataclass(frozen=True)
class WalltimeChange:
    """The experiment's median walltime against the reference's, in percent (negative: faster)."""

    pct: float
    low: float  # the confidence interval of pct
    high: float
    drift_pct: float  # how far the reference moved between its two measurements, % of their mean


def median_change(
    experiment: Sequence[float], before: Sequence[float], after: Sequence[float], seed: int
) -> WalltimeChange:
    """The change of the median with a seeded percentile-bootstrap interval: the repeats of each side
    resampled with replacement, the reference's from both of its measurements pooled."""
    reference = [*before, *after]
    pct = 100.0 * (statistics.median(experiment) / statistics.median(reference) - 1.0)
    rng = np.random.default_rng(seed)
    exp = np.median(rng.choice(np.asarray(experiment), (RESAMPLES, len(experiment))), axis=1)
    ref = np.median(rng.choice(np.asarray(reference), (RESAMPLES, len(reference))), axis=1)
    low, high = np.quantile(100.0 * (exp / ref - 1.0), [(1 - LEVEL) / 2, (1 + LEVEL) / 2])
    return WalltimeChange(pct, float(low), float(high), drift_pct(before, after))


def drift_pct(before: Sequence[float], after: Sequence[float]) -> float:
    """The gap between the reference's medians before and after, in % of their mean."""
    a, b = statistics.median(before), statistics.median(after)
    return 100.0 * abs(a - b) / ((a + b) / 2)


def judge(change: WalltimeChange, tolerance_pct: float = 0.0) -> str:
    """The noise rule, in one place: better (worse) when the whole interval lies below (above) zero
    and the change exceeds both the reference's drift and `tolerance_pct` (a floor set from outside,
    e.g. a measurement mode's tolerance); otherwise within noise."""
    band = max(change.drift_pct, tolerance_pct)
    if change.high < 0 and change.pct < -band:
        return BETTER
    if change.low > 0 and change.pct > band:
        return WORSE
    return NOISE


def judge_max_n(max_n: int | None, references: Sequence[int | None]) -> str:
    """Capacity: better when the largest N that fits exceeds every measurement of the reference, worse
    when below every one; the probe's granularity and the reference's own spread are its noise."""
    refs = [0 if r is None else r for r in references]
    mine = 0 if max_n is None else max_n
    if mine > max(refs):
        return BETTER
    if mine < min(refs):
        return WORSE
    return NOISE


def change_pct(value: float | None, reference: Sequence[float | None]) -> float | None:
    """A single figure (first step, peak memory) against the mean of the reference's measurements."""
    known = [r for r in reference if r is not None]
    if value is None or not known or statistics.fmean(known) == 0:
        return None
    return 100.0 * (value / statistics.fmean(known) - 1.0)
