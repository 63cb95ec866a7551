"""Which N to try next, as a pure function of the trials so far: a geometric ramp until a step
does not fit, then bisection (guided by a fit of peak memory in N, where one fits well) until the
gap between the largest fit and the smallest failure is at most the granularity.

Being a function of the history alone, the search resumes from persisted trials unchanged.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from cpbench.results.row import CRASH, OOM
from cpbench.settings.schema import ProbeConfig


@dataclass(frozen=True)
class Trial:
    """One N's answer. Any that did not fit bounds the search from above, whatever its class: above a
    kernel fault (status error, failure kernel) no N is tried either."""

    n: int
    fits: bool
    status: str  # ok | oom | error | crashed
    peak_gib: float | None = None  # max over ranks
    seconds: float | None = None
    guided: bool = False  # proposed by the memory model rather than by the ramp or bisection
    point: bool = False  # a walltime point of the run at the probe's shape, not a probe step
    predicted_gib: float | None = None  # the fake-tensor estimate of peak_gib (probe.predict)
    peak_min_gib: float | None = None  # min over ranks: with the max, how evenly the grid shares memory
    failure: str = ""  # one that did not fit: its class (results/row.py FAILURES)

    def __post_init__(self) -> None:
        if not self.fits and not self.failure:  # a trial saved before the class, or told its status alone
            object.__setattr__(self, "failure", OOM if self.status == "oom" else CRASH)


@dataclass(frozen=True)
class SearchConfig:
    """The run's probe settings (`ProbeConfig`, where their defaults live) and what the run adds."""

    config: ProbeConfig = field(default_factory=ProbeConfig)
    multiple: int = 1  # every N tried tiles the topology's grid
    cap_gib: float | None = None  # the per-rank memory cap (a peak's figure); enables the guided proposal
    predicted: int | None = None  # the N the fake-tensor estimate proposes: it replaces the ramp


@dataclass(frozen=True)
class Proposal:
    n: int
    guided: bool


def answered(trials: list[Trial], trial: Trial) -> list[Trial]:
    """The trials with `trial` as its N's one answer: a later answer for an N replaces the earlier (the
    full measurement at the probe's edge ran out of memory where its single step fit)."""
    return [t for t in trials if t.n != trial.n] + [trial]


def align_down(n: float, multiple: int) -> int:
    return int(n // multiple) * multiple


def align_up(n: float, multiple: int) -> int:
    return int(math.ceil(n / multiple)) * multiple


def bounds(trials: list[Trial]) -> tuple[Trial | None, Trial | None]:
    """The largest fit below the smallest failure, and that failure. A fit above a failure (a
    non-monotone point) is not trusted: the answer stays below every N that failed."""
    fails = [t for t in trials if not t.fits]
    first_fail = min(fails, key=lambda t: t.n) if fails else None
    fits = [t for t in trials if t.fits and (first_fail is None or t.n < first_fail.n)]
    return (max(fits, key=lambda t: t.n) if fits else None), first_fail


def peak_model(trials: list[Trial]) -> np.poly1d | None:
    """Least-squares quadratic of peak memory in N over the fits, when at least three fits have
    peaks and the model explains them within 5% (RMS, relative)."""
    points = sorted({t.n: t.peak_gib for t in trials if t.fits and t.peak_gib}.items())
    if len(points) < 3:
        return None
    n, peak = (np.array(v, dtype=float) for v in zip(*points, strict=True))
    model = np.poly1d(np.polyfit(n, peak, deg=min(2, len(points) - 1)))
    residual = np.sqrt(np.mean(((model(n) - peak) / peak) ** 2))
    return model if residual < 0.05 else None


def _crossing(model: np.poly1d, cap_gib: float, lo: int, hi: int) -> float | None:
    roots = (model - cap_gib).roots
    inside = [r.real for r in roots if abs(r.imag) < 1e-9 and lo < r.real < hi]
    return min(inside) if inside else None


def _confirm(cfg: SearchConfig, trials: list[Trial], cap: int | None) -> Proposal | None | bool:
    """The opening of a predicted search: the proposal, then away from it by one granularity (up
    after a fit, down after a failure), the step doubling while the outcome repeats; False once the
    next step would pass the other bound (bisection takes over between them)."""
    m, g = cfg.multiple, max(cfg.config.granularity, cfg.multiple)
    proposal = max(m, align_down(cfg.predicted, m))
    proposal = min(proposal, cap) if cap else proposal
    best, fail = bounds(trials) if trials else (None, None)
    tried = {t.n for t in trials}
    if best is not None and fail is not None and fail.n - best.n <= cfg.config.granularity:
        return False  # the edge is found (a proposal moved by a calibration need not be tried)
    # First the proposal itself, unless the trials so far (walltime points too) already decide it.
    if proposal not in tried and (best is None or proposal > best.n) and (fail is None or proposal < fail.n):
        return Proposal(proposal, True)
    if best is not None and best.n >= proposal:  # it fits: the prediction was low (or exact); step up
        k = len({t.n for t in trials if t.fits and proposal <= t.n <= best.n})
        n = max(align_up(best.n + g * 2 ** (k - 1), m), best.n + m)
        n = min(n, cap) if cap else n
        if fail is not None and n >= fail.n:
            return False
        return None if n <= best.n else Proposal(n, True)
    k = len({t.n for t in trials if not t.fits and fail.n <= t.n <= proposal})  # it failed: step down
    n = max(m, align_down(fail.n - g * 2 ** (k - 1), m))
    if best is not None and n <= best.n:
        return False
    return None if n >= fail.n else Proposal(n, True)


def _guided_ramp(cfg: SearchConfig, trials: list[Trial], best: Trial, ramp: int) -> Proposal | None:
    """Short of the ramp's next N where the memory model puts the edge below it: a step past the
    edge is the search's dearest (at twice the N, a quadratic peak and a cubic step time). At the
    crossing, or past the last fit by the granularity, doubled for each further guided fit in a row, so
    that a model that keeps reading low does not creep up by small steps."""
    model = peak_model(trials) if cfg.config.guided and cfg.cap_gib else None
    crossing = _crossing(model, cfg.cap_gib, 0, ramp) if model is not None else None
    if crossing is None:
        return None
    streak = 0
    for trial in sorted((t for t in trials if not t.point), key=lambda t: t.n, reverse=True):
        if not (trial.guided and trial.fits):
            break
        streak += 1
    step = max(cfg.config.granularity, cfg.multiple) * 2 ** max(streak - 1, 0)
    n = max(align_down(crossing, cfg.multiple), align_up(best.n + step, cfg.multiple))
    return Proposal(n, True) if best.n < n < ramp and n not in {t.n for t in trials} else None


def next_trial(cfg: SearchConfig, trials: list[Trial]) -> Proposal | None:
    """The next N to try, or None when the search is done."""
    m = cfg.multiple
    cap = align_down(cfg.config.max_tokens, m) if cfg.config.max_tokens else None
    tried = {t.n for t in trials}
    if cfg.predicted is not None:
        opening = _confirm(cfg, trials, cap)
        if opening is not False:
            return opening
    if not trials:
        start = max(m, align_down(cfg.config.start, m))
        return Proposal(min(start, cap) if cap else start, False)
    best, fail = bounds(trials)
    if fail is None:  # ramp up, never below the start (walltime points may be the first trials)
        n = max(align_up(best.n * cfg.config.factor, m), best.n + m, max(m, align_down(cfg.config.start, m)))
        if cap is not None:
            n = min(n, cap)
        if n <= best.n or n in tried:
            return None
        return _guided_ramp(cfg, trials, best, n) or Proposal(n, False)
    if best is None:  # the start failed: search downwards
        n = align_down(fail.n / cfg.config.factor, m)
        return None if n < m or n in tried else Proposal(n, False)
    if fail.n - best.n <= cfg.config.granularity:
        return None
    model = peak_model(trials) if cfg.config.guided and cfg.cap_gib else None
    if model is not None:
        crossing = _crossing(model, cfg.cap_gib, best.n, fail.n)
        if crossing is not None:
            guess = align_down(crossing, m)
            if guess <= best.n:  # the model puts the edge right above the last fit: confirm it
                guess = align_up(best.n + cfg.config.granularity, m)
            if best.n < guess < fail.n and guess not in tried:
                return Proposal(guess, True)
    mid = align_down((best.n + fail.n) / 2, m)
    if mid <= best.n:
        mid = best.n + m
    return None if mid >= fail.n or mid in tried else Proposal(mid, False)
