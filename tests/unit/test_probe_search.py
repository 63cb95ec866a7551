"""The search against pure functions: where it stops, what it tries, how many steps it takes."""

from __future__ import annotations

import pytest

from cpbench.probe.search import SearchConfig, Trial, bounds, next_trial
from cpbench.settings.schema import ProbeConfig


def run(cfg: SearchConfig, fits, peak=lambda n: None) -> list[Trial]:
    trials: list[Trial] = []
    while (p := next_trial(cfg, trials)) is not None:
        assert p.n not in {t.n for t in trials}, "no N is tried twice"
        assert p.n % cfg.multiple == 0, "every N tiles the grid"
        ok = fits(p.n)
        trials.append(Trial(p.n, ok, "ok" if ok else "oom", peak(p.n), guided=p.guided))
        assert len(trials) < 60
    return trials


@pytest.mark.parametrize("threshold", [1, 64, 100, 511, 512, 513, 777, 1024, 3000, 9999, 40000])
@pytest.mark.parametrize("multiple,granularity", [(1, 64), (2, 64), (4, 1), (6, 50)])
def test_stops_within_granularity_of_the_threshold(threshold, multiple, granularity):
    cfg = SearchConfig(ProbeConfig(start=512, factor=2, granularity=granularity), multiple=multiple)
    trials = run(cfg, lambda n: n <= threshold)
    best, fail = bounds(trials)
    assert fail is not None and fail.n > threshold
    if threshold < multiple:
        assert best is None  # nothing fits: the search went down to the smallest N and stopped
        assert fail.n == multiple or fail.n < 2 * multiple
        return
    assert best is not None and best.n <= threshold
    # the gap closes to the granularity, or to the grid's step when that is coarser
    assert fail.n - best.n <= max(granularity, multiple)


def test_start_failing_searches_downwards():
    trials = run(SearchConfig(ProbeConfig(start=512, factor=2, granularity=16)), lambda n: n <= 100)
    assert [t.n for t in trials[:4]] == [512, 256, 128, 64]
    best, fail = bounds(trials)
    assert best.n <= 100 < fail.n and fail.n - best.n <= 16


def test_granularity_edge_gap_equal_to_granularity_stops():
    cfg = SearchConfig(ProbeConfig(start=64, factor=2, granularity=64))
    trials = run(cfg, lambda n: n <= 64)
    assert [t.n for t in trials] == [64, 128]  # 128 - 64 == granularity: done, no bisection


def test_max_tokens_caps_the_ramp():
    trials = run(
        SearchConfig(ProbeConfig(start=512, factor=2, granularity=64, max_tokens=3000), multiple=4),
        lambda n: True,
    )
    assert [t.n for t in trials] == [512, 1024, 2048, 3000]
    assert bounds(trials) == (trials[-1], None)


def test_one_non_monotone_point_keeps_the_answer_below_every_failure():
    # 768 fails although 896 would fit (a transient failure): the answer must stay below 768.
    fits = lambda n: n <= 900 and n != 768  # noqa: E731
    trials = run(SearchConfig(ProbeConfig(start=512, factor=2, granularity=32)), fits)
    best, fail = bounds(trials)
    assert fail.n == 768 and best.n < 768 and fail.n - best.n <= 32
    assert all(t.fits for t in trials if t.n < best.n)


def test_guided_search_takes_fewer_steps_when_memory_follows_a_quadratic():
    budget = 10.0
    peak = lambda n: 0.5 + 2e-4 * n + 3e-6 * n * n  # noqa: E731
    fits = lambda n: peak(n) <= budget  # noqa: E731
    plain = run(
        SearchConfig(ProbeConfig(start=128, factor=2, granularity=8, guided=False), cap_gib=budget),
        fits,
        peak,
    )
    guided = run(SearchConfig(ProbeConfig(start=128, factor=2, granularity=8), cap_gib=budget), fits, peak)
    edge = max(n for n in range(1, 4000) if fits(n))
    for trials in (plain, guided):
        best, fail = bounds(trials)
        assert best.n <= edge < fail.n and fail.n - best.n <= 8
    assert any(t.guided for t in guided)
    assert len(guided) < len(plain)


@pytest.mark.parametrize("edge_at", [300, 380, 500])
def test_the_ramp_stops_short_of_a_step_the_model_puts_past_the_edge(edge_at):
    """A run's walltime points give the model its first fits: the ramp's next N (twice the last fit)
    is replaced by the crossing, so no trial lands far past the edge, the costliest step there is."""
    peak = lambda n: 0.3 + 1e-6 * n * n  # noqa: E731
    budget = peak(edge_at)
    fits = lambda n: peak(n) <= budget  # noqa: E731
    points = [Trial(n, True, "ok", peak(n), point=True) for n in (32, 64, 128)]
    cfg = SearchConfig(ProbeConfig(start=128, factor=2, granularity=16), cap_gib=budget)
    trials = list(points)
    while (p := next_trial(cfg, trials)) is not None:
        trials.append(Trial(p.n, fits(p.n), "ok" if fits(p.n) else "oom", peak(p.n), guided=p.guided))
    probed = [t.n for t in trials if not t.point]
    best, fail = bounds(trials)
    assert best.n <= edge_at < fail.n and fail.n - best.n <= 16
    assert max(probed) <= edge_at + 2 * 16, probed  # the plain ramp tried 512
    assert len(probed) <= 4, probed


def test_a_model_that_reads_low_steps_up_by_doubling_steps():
    """The model puts the edge at 200 while steps fit far beyond it: the first try is there, and each
    further guided fit doubles the step past the last fit, so the ramp's reach comes back within a few
    trials."""
    cfg = SearchConfig(ProbeConfig(start=128, factor=2, granularity=16), cap_gib=0.3 + 1e-6 * 200**2)
    trials = [Trial(n, True, "ok", 0.3 + 1e-6 * n * n, point=True) for n in (32, 64, 128)]
    steps = []
    while len(steps) < 5 and (p := next_trial(cfg, trials)) is not None:
        steps.append(p.n)
        trials.append(Trial(p.n, True, "ok", 0.3 + 1e-6 * 200**2, guided=p.guided))  # all fit, flat
    gaps = [b - a for a, b in zip(steps, steps[1:], strict=False)]
    assert steps[0] <= 200 and all(b >= 2 * a for a, b in zip(gaps, gaps[1:], strict=False)), steps


def test_guided_falls_back_to_bisection_when_the_model_does_not_fit():
    budget = 10.0
    peak = lambda n: 1.0 if n < 300 else 9.0 + (n % 7)  # noqa: E731  (no quadratic explains this)
    trials = run(
        SearchConfig(ProbeConfig(start=64, factor=2, granularity=16), cap_gib=budget),
        lambda n: peak(n) <= budget,
        peak,
    )
    best, fail = bounds(trials)
    assert fail.n - best.n <= 16


def test_bounds_does_not_trust_a_fit_above_a_failure():
    # 768 failed, 896 fitted later (a transient failure below, or memory not monotone in N).
    history = [
        Trial(512, True, "ok"),
        Trial(1024, False, "oom"),
        Trial(768, False, "oom"),
        Trial(896, True, "ok"),
    ]
    best, fail = bounds(history)
    assert (best.n, fail.n) == (512, 768)
