"""The time budget (cpbench.plan.budget): a pure function of the plan, one measured step and the
budget; and one run through `python -m cpbench` that cannot fit and so runs nothing."""

from __future__ import annotations

import json

from conftest import FAST, cpbench
from test_what_changed import settings

from cpbench.core import Shape
from cpbench.plan.budget import Plan, Step, estimate, fit_budget, probe_trials
from cpbench.probe.search import SearchConfig


def _points(*ns: int) -> tuple[Shape, ...]:
    return tuple(Shape(n_tokens=n, n_atoms=9 * n, msa_depth=16) for n in ns)


STEP = Step(n=64, seconds=1.0)  # 1 s at N=64, 4 s at N=128, 16 s at N=256
PLAN = Plan(points=_points(64, 128, 256), warmup=3, repeats=5)  # 8 steps a point: 8 x 21 = 168 s


def test_the_estimate_scales_the_step_by_n_squared():
    assert estimate(PLAN, STEP) == (168.0, 0)


def test_within_budget_nothing_is_cut():
    verdict = fit_budget(PLAN, STEP, minutes=3, min_repeats=3)
    assert verdict.plan == PLAN and verdict.cuts == () and verdict.refusal is None
    assert verdict.summary(3, STEP) == (
        "plan: 3 point(s) x (3 warm-up + 5 repeats) x ~1 s at N=64 (x (N/64)^2) = ~2.8 min, budget 3 min"
    )


def test_a_budget_too_small_trims_repeats_first_and_lists_it():
    # 7 steps a point: 7 x 21 = 147 s; 2.5 min = 150 s fits with 4 repeats.
    verdict = fit_budget(PLAN, STEP, minutes=2.5, min_repeats=3)
    assert verdict.plan.repeats == 4 and verdict.plan.points == PLAN.points
    assert verdict.cuts == ("timing.repeats 5 -> 4 (the floor is budget.min_repeats=3)",)
    assert verdict.seconds == 147.0 and verdict.refusal is None


def test_repeats_stop_at_the_floor_then_points_go_the_largest_kept():
    # At the floor (6 steps a point) 126 s; without N=64 120 s; without N=128 too 96 s.
    verdict = fit_budget(PLAN, STEP, minutes=1.7, min_repeats=3)
    assert verdict.plan.repeats == 3
    assert [s.n_tokens for s in verdict.plan.points] == [256]
    assert verdict.cuts[1] == "sweep points: N=64, 128 dropped, N=256 kept"
    assert verdict.seconds == 96.0


def test_a_coarser_probe_granularity_is_the_last_cut():
    search = SearchConfig(start=128, granularity=16, budget_gib=1.0)
    plan = Plan(points=_points(64), warmup=1, repeats=2, probe=search, measure_at_max=False)
    step = Step(n=64, seconds=0.01, peak_gib=0.26, baseline_gib=0.2)  # 1 GiB is reached near N=234
    fine, coarse = (
        probe_trials(search, step),
        probe_trials(SearchConfig(start=128, granularity=64, budget_gib=1.0), step),
    )
    assert len(coarse) < len(fine)
    minutes = estimate(Plan(_points(64), 1, 2, SearchConfig(start=128, granularity=64, budget_gib=1.0),
                            measure_at_max=False), step)[0] / 60  # fmt: skip
    verdict = fit_budget(plan, step, minutes, min_repeats=2)
    assert verdict.refusal is None and verdict.cuts == ("probe.granularity 16 -> 64",)
    assert verdict.probe_steps == len(coarse)


def test_a_plan_that_cannot_fit_without_changing_the_job_is_refused():
    verdict = fit_budget(PLAN, STEP, minutes=1.5, min_repeats=3)  # the least plan needs 96 s
    assert verdict.plan.repeats == 3 and [s.n_tokens for s in verdict.plan.points] == [256]
    assert verdict.refusal == (
        "budget.minutes=1.5: even trimmed to the least the job allows (1 point(s) x (3 warm-up + 3 repeats) "
        "x ~1 s at N=64 (x (N/64)^2) = ~1.6 min, budget 1.5 min) the plan does not fit; nothing run (raise "
        "budget.minutes, or budget.minutes=null to run it all)"
    )
    assert "nothing run" in verdict.refusal


def test_no_budget_runs_the_plan_as_set():
    verdict = fit_budget(PLAN, STEP, minutes=None, min_repeats=3)
    assert verdict.plan == PLAN and verdict.cuts == () and verdict.refusal is None


def test_a_run_over_budget_says_so_in_one_line_and_measures_nothing(tmp_path):
    args = ["topology.cp=1", "sweep.n_tokens=[16,32]", "budget.minutes=0.00001", "output_dir=out"]
    proc = cpbench(*FAST, *args, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    refusals = [line for line in proc.stderr.splitlines() if line.startswith("cpbench: budget.minutes=")]
    assert len(refusals) == 1 and "nothing run" in refusals[0]
    assert "plan: 2 point(s) x (1 warm-up + 2 repeats)" in proc.stdout + proc.stderr  # said first
    out = tmp_path / "out"
    assert not (out / "results.csv").exists()
    assert json.loads((out / "state.json").read_text())["in_flight"] is None  # no point to resume
    assert json.loads((out / "run.json").read_text())["time_budget"]["refusal"] == refusals[0].removeprefix(
        "cpbench: "
    )


def test_bad_budget_settings_are_one_line_each():
    import pytest

    from cpbench.core import ConfigError
    from cpbench.settings.validate import validate

    for bad, says in (("budget.minutes=0", "budget.minutes=0.0: must be > 0"),
                      ("budget.min_repeats=0", "budget.min_repeats=0: must be >= 1")):  # fmt: skip
        with pytest.raises(ConfigError) as err:
            validate(settings(bad))
        assert str(err.value) == says
