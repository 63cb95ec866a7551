"""The time budget (cpbench.preview.budget), in-process: a pure function of the plan, one measured step
and the budget (the estimate, each cut in its order, the probe's trials), and its settings checked."""

from __future__ import annotations

from dataclasses import replace

import pytest
from support.settings import settings

from cpbench.core import Shape
from cpbench.measure.cap import CPU_CREEP_GIB, Cap
from cpbench.measure.point import PointSettings
from cpbench.preview.budget import (
    PilotStep,
    PlannedWork,
    StepGrowth,
    estimate,
    fit_budget,
    fixed_part,
    probe_trials,
    step_seconds,
)
from cpbench.probe.search import SearchConfig, Trial
from cpbench.settings.cp1 import budget_left, cp1_settings
from cpbench.settings.schema import ProbeConfig


def _points(*ns: int) -> tuple[Shape, ...]:
    return tuple(Shape(n_tokens=n, n_atoms=9 * n, msa_depth=16) for n in ns)


STEP = PilotStep(n=64, seconds=1.0)  # 1 s at N=64, 4 s at N=128, 16 s at N=256
WORK = PlannedWork(points=_points(64, 128, 256), warmup=3, repeats=5)  # 8 steps a point: 8 x 21 = 168 s


def test_the_estimate_scales_the_step_by_n_squared():
    assert estimate(WORK, STEP) == (168.0, 0)


def test_each_measured_point_and_the_edge_pay_a_flop_count():
    """The count walks one pass of each repeated loop on fake tensors: about the same at every N, and
    paid by every point and by the probe's full measurement at its edge, never by a probe step."""
    counted = PilotStep(n=64, seconds=1.0, count_s=2.5)
    assert estimate(WORK, counted) == (168.0 + 3 * 2.5, 0)
    steps_at_64_and_128 = SearchConfig(ProbeConfig(start=64, granularity=64, max_tokens=128))
    probe = PlannedWork((), 1, 2, steps_at_64_and_128)
    assert estimate(probe, counted)[0] == estimate(probe, STEP)[0] + 2.5
    assert fit_budget(WORK, counted, 3, 3).summary(3, counted) == (
        "plan: 3 point(s) x (3 warm-up + 5 repeats) x ~1 s at N=64 (x (N/64)^2) + ~2.5 s a FLOP count "
        "= ~2.9 min, budget 3 min"
    )


def test_within_budget_nothing_is_cut():
    verdict = fit_budget(WORK, STEP, minutes=3, min_repeats=3)
    assert verdict.work == WORK and verdict.cuts == () and verdict.refusal is None
    assert verdict.summary(3, STEP) == (
        "plan: 3 point(s) x (3 warm-up + 5 repeats) x ~1 s at N=64 (x (N/64)^2) = ~2.8 min, budget 3 min"
    )


def test_a_budget_too_small_trims_repeats_first_and_lists_it():
    # 7 steps a point: 7 x 21 = 147 s; 2.5 min = 150 s fits with 4 repeats.
    verdict = fit_budget(WORK, STEP, minutes=2.5, min_repeats=3)
    assert verdict.work.repeats == 4 and verdict.work.points == WORK.points
    assert verdict.cuts == ("timing.repeats 5 -> 4 (the floor is budget.min_repeats=3)",)
    assert verdict.seconds == 147.0 and verdict.refusal is None


def test_repeats_stop_at_the_floor_then_points_go_the_largest_kept():
    # At the floor (6 steps a point) 126 s; without N=64 120 s; without N=128 too 96 s.
    verdict = fit_budget(WORK, STEP, minutes=1.7, min_repeats=3)
    assert verdict.work.repeats == 3
    assert [s.n_tokens for s in verdict.work.points] == [256]
    assert verdict.cuts[1] == "sweep points: N=64, 128 dropped, N=256 kept"
    assert verdict.seconds == 96.0


def test_a_coarser_probe_granularity_is_the_last_cut():
    search = SearchConfig(ProbeConfig(start=128, granularity=16), cap_gib=1.0)
    work = PlannedWork(points=_points(64), warmup=1, repeats=2, probe=search, measure_at_max=False)
    step = PilotStep(n=64, seconds=0.01, peak_gib=0.26, baseline_gib=0.2)  # 1 GiB is reached near N=234
    fine, coarse = (
        probe_trials(search, step),
        probe_trials(SearchConfig(ProbeConfig(start=128, granularity=64), cap_gib=1.0), step),
    )
    assert len(coarse) < len(fine)
    coarser = SearchConfig(ProbeConfig(start=128, granularity=64), cap_gib=1.0)
    minutes = estimate(PlannedWork(_points(64), 1, 2, coarser, measure_at_max=False), step)[0] / 60
    verdict = fit_budget(work, step, minutes, min_repeats=2)
    assert verdict.refusal is None and verdict.cuts == ("probe.granularity 16 -> 64",)
    assert verdict.probe_steps == len(coarse)


def test_a_step_that_reads_below_its_baseline_predicts_no_peak_and_counts_one_ramp_step():
    """A tiny step's peak can read below the baseline (start-up's high-water mark): scaled by N^2 its
    negative share never reaches the cap, and the search ran to its 64-step guard (a plan of ~3e+37 min,
    refused). No prediction instead: one ramp step, as with no cap."""
    search = SearchConfig(ProbeConfig(start=64, granularity=64), cap_gib=1.0)
    step = PilotStep(n=16, seconds=1.0, peak_gib=0.199, baseline_gib=0.2)
    assert [t.n for t in probe_trials(search, step)] == [64]
    verdict = fit_budget(
        PlannedWork(_points(16), 1, 2, search, measure_at_max=False), step, 600, min_repeats=2
    )
    assert verdict.refusal is None and verdict.probe_steps == 1


def test_the_points_peaks_keep_the_fixed_part_from_growing_with_n():
    """fold_small's cp=1 points of one run (peak over the baseline, GiB): a + b N^2 through them has a
    of about 10 MiB. Kept fixed, the N=128 step's peak puts the edge under 0.05 GiB at 192 (granularity
    16); the whole peak scaled by N^2 put it at 176 (measured: 213 fits, 229 does not)."""
    peaks = [(32, 0.0093), (64, 0.0160), (128, 0.0259)]
    fixed = fixed_part(peaks)
    assert fixed == pytest.approx(0.0099, abs=0.0005)
    assert fixed_part(peaks[:1]) == 0.0  # one N cannot split it
    assert fixed_part([(64, 0.02), (128, 0.01)]) == 0.0  # no growth: no split
    search = SearchConfig(ProbeConfig(start=128, granularity=16), cap_gib=0.254 + 0.05)  # absolute
    edge = {}
    for kept in (0.0, fixed):
        step = PilotStep(n=128, seconds=1.0, peak_gib=0.254 + 0.0259, baseline_gib=0.254, fixed_gib=kept)
        edge[kept] = max(t.n for t in probe_trials(search, step) if t.fits)
    assert 160 <= edge[0.0] <= 180 and 190 <= edge[fixed] <= 215, edge


def test_the_probe_is_counted_from_the_walltime_points_it_starts_from():
    """The probe takes the walltime points at its shape as its first trials: they guide its first steps
    (a quadratic through three peaks), and none is stepped again. Counted without them, the search
    stepped its start N and bisected blind: fold_small's cp=2 probe planned 7 steps and took 2."""
    search = SearchConfig(ProbeConfig(start=128, granularity=16), cap_gib=0.254 + 0.05)
    step = PilotStep(n=128, seconds=1.0, peak_gib=0.254 + 0.0259, baseline_gib=0.254, fixed_gib=0.0099)
    seeds = tuple(Trial(n, fits=True, status="ok", point=True) for n in (32, 64, 128))  # to be measured
    seeded = [t for t in probe_trials(search, step, seeds) if not t.point]
    blind = probe_trials(search, step)
    assert not {t.n for t in seeded} & {32, 64, 128} and 128 in {t.n for t in blind}
    assert len(seeded) < len(blind)
    work = PlannedWork((), 3, 5, search, measure_at_max=False, probe_seeds=seeds)
    assert estimate(work, step) == (sum(step_seconds(step, t.n) for t in seeded), len(seeded))
    # A point the budget drops is no trial of the probe's either.
    trimmed = fit_budget(replace(work, points=_points(32, 64, 128)), step, 0.05, min_repeats=5)
    assert [s.n_tokens for s in trimmed.work.points] == [128]
    assert [t.n for t in trimmed.work.probe_seeds] == [128]
    # Measured points start it from their own peaks: concave through three small N (as fold_small's
    # are), the quadratic guide finds no edge below the ramp's next N, which the probe then steps.
    measured = tuple(
        Trial(n, fits=True, status="ok", peak_gib=0.254 + p, point=True)
        for n, p in ((32, 0.0093), (64, 0.0160), (128, 0.0259))
    )
    assert probe_trials(search, step, measured)[3].n == 256
    # An edge at a walltime point's N is measured already: the estimate counts no measurement there.
    low = replace(search, cap_gib=0.254 + 0.0262)  # N=128 fits, 144 does not
    at_point = PlannedWork((), 3, 5, low, measure_at_max=True, probe_seeds=measured)
    [over] = [t for t in probe_trials(low, step, measured) if not t.point]
    assert (over.n, over.fits) == (144, False)
    assert estimate(at_point, step) == (step_seconds(step, 144), 1)


def test_a_probe_step_on_cpu_leaves_the_cap_room_for_a_full_measurements_later_steps():
    """A probe step stands for its N's full measurement, whose later steps add up to ~2 MiB of resident
    memory on CPU: it is held to the cap less that, and says so; a GPU's cap stays whole."""
    cpu = PointSettings(cap=Cap(0.05, 0.25))
    one = cpu.single_step().cap
    assert one.gib == pytest.approx(0.05 - CPU_CREEP_GIB) and cpu.cap.gib == 0.05
    assert one.over(0.049) == (
        "peak 0.049 GiB over the baseline exceeds 0.048 GiB (the 0.05 GiB cap less 2 MiB a full "
        "measurement adds)"
    )
    gpu = Cap(70.0, 0.5, held_gib=1.2)
    assert gpu.for_one_step() == gpu and gpu.over(70.5) == "peak 70.500 GiB over the baseline exceeds 70 GiB"


def test_the_report_sets_what_the_plan_took_against_its_estimate():
    from cpbench.record.run_record import TimeBudget
    from cpbench.report.sections.time_budget import lines

    budget = TimeBudget("plan: 3 point(s) ... = ~1 min, budget 8 min", took_s=84.8, estimate_s=60.2)
    assert lines(budget)[3] == (
        "plan: 3 point(s) ... = ~1 min, budget 8 min; it took 1.4 min (its timed step included): 85 s "
        "against ~60 s estimated (-29%)."
    )


def test_a_plan_that_cannot_fit_without_changing_the_job_is_refused():
    verdict = fit_budget(WORK, STEP, minutes=1.5, min_repeats=3)  # the least plan needs 96 s
    assert verdict.work.repeats == 3 and [s.n_tokens for s in verdict.work.points] == [256]
    assert verdict.refusal == (
        "budget.minutes=1.5: even trimmed to the least the job allows (1 point(s) x (3 warm-up + 3 repeats) "
        "x ~1 s at N=64 (x (N/64)^2) = ~1.6 min, budget 1.5 min) the plan does not fit; nothing run (raise "
        "budget.minutes, or budget.minutes=null to run it all)"
    )
    assert "nothing run" in verdict.refusal


def test_no_budget_runs_the_plan_as_set():
    verdict = fit_budget(WORK, STEP, minutes=None, min_repeats=3)
    assert verdict.work == WORK and verdict.cuts == () and verdict.refusal is None


def test_bad_budget_settings_are_one_line_each():
    import pytest

    from cpbench.core import ConfigError
    from cpbench.settings.validate import validate

    for bad, says in (("budget.minutes=0", "budget.minutes=0.0: must be > 0"),
                      ("budget.cuda_minutes=0", "budget.cuda_minutes=0.0: must be > 0"),
                      ("probe.warmup=-1", "probe.warmup=-1: must be >= 0"),
                      ("budget.min_repeats=0", "budget.min_repeats=0: must be >= 1")):  # fmt: skip
        with pytest.raises(ConfigError) as err:
            validate(settings(bad))
        assert str(err.value) == says


def test_a_steps_growth_is_fitted_from_the_steps_measured_with_no_negative_term():
    """A quadratic and a cubic law are found from their own steps; milliseconds of noise at small N do
    not hide the cubic growth of the largest steps; one N alone is priced all cubic (the steepest the
    model allows); none measured, no price."""
    quadratic = StepGrowth.fit([(64, 1.0), (128, 4.0), (256, 16.0)])
    assert quadratic.seconds(512) == pytest.approx(64.0)
    noisy = StepGrowth.fit([(16, 0.005), (32, 0.006), (64, 0.5), (128, 4.0)])
    assert noisy.seconds(256) == pytest.approx(32.0, rel=0.01)
    assert min(noisy.a, noisy.b, noisy.c) >= 0
    # fold_small's steps under a 0.5 GiB cap (issue 67): 27 s at 512, 173 s at 972; 1,026 took 192 s
    assert StepGrowth.fit([(512, 27.0), (972, 173.0)]).seconds(1026) == pytest.approx(192, rel=0.1)
    assert StepGrowth.fit([(32, 0.1), (32, 0.2)]).seconds(64) == pytest.approx(1.6)
    assert StepGrowth.fit([]) is None


def test_one_budget_for_the_command_the_baseline_has_half_and_the_cp_run_what_it_leaves():
    """budget.minutes bounds `python -m cpbench`, its cp=1 baseline included: the baseline plans for
    half, the CP run for the budget less what the baseline took (none when it came from the cache)."""
    run = settings("topology.cp=2", "budget.minutes=4", "budget.cuda_minutes=30")
    base = cp1_settings(run)
    assert (base.budget.minutes, base.budget.cuda_minutes) == (2.0, 15.0)
    left = budget_left(run, 96.0)
    assert (left.budget.minutes, left.budget.cuda_minutes) == (2.4, 28.4)
    assert budget_left(run, 600.0).budget.minutes == 0.0
    assert budget_left(settings("budget.minutes=null"), 96.0).budget.minutes is None
    assert run.budget.minutes == 4  # the run's own settings stay as given
