"""Experiment plans in-process: the planner (order, gates, only_if, refusals) and the verdict statistics
as pure functions, and every shipped plan composed and checked as a run would be."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_module

from cpbench.app.preflight import checked
from cpbench.core import ConfigError
from cpbench.experiment.plan import (
    BASELINE,
    BETTER,
    NOISE,
    WORSE,
    Outcome,
    base_of,
    find_cycle,
    next_experiment,
    parse_plan,
    skip_reason,
    winner,
)
from cpbench.experiment.runner import PlanRun
from cpbench.experiment.verdict import WalltimeChange, drift_pct, judge, judge_max_n, median_change
from cpbench.measure.stats import RepeatTiming, first_step_ms, repeat_totals_ms
from cpbench.settings.schema import register

PLANS = Path(__file__).resolve().parents[2] / "configs" / "experiment"


def _exp(id_: str, priority: str = "medium", **extra) -> dict:
    return {"id": id_, "overrides": [f"seed={len(id_)}"], "priority": priority, **extra}


PLAN = parse_plan(
    {
        "baseline": ["sweep.n_tokens=[16]"],
        "experiments": [
            _exp("MP-1", "low"),
            _exp("CMP-1", "high", group="compile"),
            _exp("CMP-2", "high", group="compile"),
            _exp("CMP-3", "medium", only_if=["CMP-1", "CMP-2"]),
            _exp("RE-1", "high", after="compile"),
        ],
    }
)


def _decide(plan, verdicts: dict[str, str]) -> list[str]:
    """The order in which the planner decides a plan, given each experiment's verdict."""
    outcomes, order = {}, []
    while (exp := next_experiment(plan, outcomes)) is not None:
        order.append(exp.id)
        ran_on, base = base_of(plan, exp, outcomes)
        verdict = "skipped" if skip_reason(exp, outcomes) else verdicts[exp.id]
        pct = {BETTER: -10.0, WORSE: 10.0}.get(verdict, 0.0) - len(order)  # later better ones gain more
        outcomes[exp.id] = Outcome(exp.id, verdict, (*base, *exp.overrides), ran_on, pct)
    return order, outcomes


def test_priority_first_then_the_plans_order_and_gates_wait_for_their_group():
    order, _ = _decide(PLAN, {i: NOISE for i in ("MP-1", "CMP-1", "CMP-2", "CMP-3", "RE-1")})
    assert order == ["CMP-1", "CMP-2", "RE-1", "CMP-3", "MP-1"]


def test_a_gated_experiment_runs_on_its_groups_winner_and_on_the_baseline_when_none_improved():
    _, outcomes = _decide(
        PLAN, {"MP-1": NOISE, "CMP-1": BETTER, "CMP-2": BETTER, "CMP-3": NOISE, "RE-1": NOISE}
    )
    assert winner(PLAN, "compile", outcomes).id == "CMP-2"  # the larger gain
    assert outcomes["RE-1"].ran_on == "CMP-2"
    assert outcomes["RE-1"].applied == (*PLAN.by_id("CMP-2").overrides, *PLAN.by_id("RE-1").overrides)
    _, outcomes = _decide(
        PLAN, {"MP-1": NOISE, "CMP-1": WORSE, "CMP-2": NOISE, "CMP-3": NOISE, "RE-1": NOISE}
    )
    assert winner(PLAN, "compile", outcomes) is None
    assert outcomes["RE-1"].ran_on == BASELINE and outcomes["RE-1"].applied == PLAN.by_id("RE-1").overrides


def test_only_if_runs_when_one_improved_and_is_skipped_otherwise():
    _, outcomes = _decide(
        PLAN, {"MP-1": NOISE, "CMP-1": WORSE, "CMP-2": BETTER, "CMP-3": NOISE, "RE-1": NOISE}
    )
    assert outcomes["CMP-3"].verdict == NOISE
    _, outcomes = _decide(
        PLAN, {"MP-1": NOISE, "CMP-1": WORSE, "CMP-2": NOISE, "CMP-3": BETTER, "RE-1": NOISE}
    )
    assert outcomes["CMP-3"].verdict == "skipped"
    assert skip_reason(PLAN.by_id("CMP-3"), outcomes) == "none of CMP-1, CMP-2 improved"


@pytest.mark.parametrize(
    ("experiments", "message"),
    [
        ([_exp("A", after="nothing")], "experiment A: after=nothing names no group of the plan"),
        ([_exp("A", only_if=["B"])], "experiment A: only_if names B, no experiment of the plan"),
        ([_exp("A", group="a", after="b"), _exp("B", group="b", after="a")],
         "experiment: the gates form a cycle: A -> B -> A"),
        ([_exp("A", group="a", after="a")], "experiment: the gates form a cycle: A -> A"),
        ([_exp("A", only_if=["B"]), _exp("B", only_if=["A"])],
         "experiment: the gates form a cycle: A -> B -> A"),
        ([_exp("A"), _exp("A")], "experiment A: the id is used twice"),
        ([_exp("A", priority="urgent")], "experiment A: priority=urgent: allowed values are high, medium"),
        ([{"id": "A", "overrides": []}], "experiment A: overrides: give at least one"),
        ([{"id": "A", "overrides": ["seed=1"], "when": "now"}], "experiment A: unknown key when"),
        ([], "experiment.experiments: a plan needs at least one experiment"),
        ([{"id": "A", "overrides": ["timing.repeats=9"]}],
         "experiment A: timing.repeats=9: every experiment measures with the baseline's points"),
    ],
)  # fmt: skip
def test_a_bad_plan_is_refused_in_one_line(experiments, message):
    with pytest.raises(ConfigError) as err:
        parse_plan({"experiments": experiments})
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


def test_find_cycle():
    assert find_cycle({"a": ["b"], "b": ["c"], "c": []}) is None
    assert find_cycle({"a": ["b"], "b": ["c"], "c": ["b"]}) == ["b", "c", "b"]


def test_repeats_and_the_first_step_are_the_slowest_ranks():
    rank0 = [RepeatTiming(t, t, 0, 0, 0) for t in (0.001, 0.004, 0.002)]
    rank1 = [RepeatTiming(t, t, 0, 0, 0) for t in (0.003, 0.001, 0.002)]
    assert repeat_totals_ms([rank0, rank1]) == pytest.approx([3.0, 4.0, 2.0])
    assert first_step_ms([0.5, 0.7]) == pytest.approx(700.0)
    assert first_step_ms([None, None]) is None  # a probe step has no warm-up


# Repeats in ms: a reference whose two measurements agree, and experiments clearly apart from it.
REF = [10.0, 10.2, 9.9, 10.1, 10.0]


def test_the_walltime_change_and_its_interval_are_seeded_and_judged_against_the_noise():
    faster = median_change([8.0, 8.1, 7.9, 8.0, 8.05], REF, REF, seed=0)
    assert faster.pct == pytest.approx(-20.0)
    assert faster.low <= faster.pct <= faster.high < 0 and faster.drift_pct == 0
    assert median_change([8.0, 8.1, 7.9, 8.0, 8.05], REF, REF, seed=0) == faster  # same seed, same answer
    assert judge(faster) == BETTER
    assert judge(median_change([12.0, 12.2, 11.9, 12.1, 12.0], REF, REF, seed=0)) == WORSE
    same = median_change(REF, REF, REF, seed=0)
    assert same.low < 0 < same.high and judge(same) == NOISE


def test_a_change_smaller_than_the_references_drift_or_the_tolerance_is_within_noise():
    assert drift_pct([10.0], [12.0]) == pytest.approx(100 * 2 / 11)
    assert judge(WalltimeChange(pct=-5.0, low=-6.0, high=-4.0, drift_pct=8.0)) == NOISE
    assert judge(WalltimeChange(pct=-5.0, low=-6.0, high=-4.0, drift_pct=1.0)) == BETTER
    assert judge(WalltimeChange(pct=-5.0, low=-6.0, high=-4.0, drift_pct=1.0), tolerance_pct=6.0) == NOISE
    assert (
        judge(WalltimeChange(pct=-5.0, low=-9.0, high=0.5, drift_pct=0.0)) == NOISE
    )  # the interval spans zero


def test_max_n_is_judged_against_both_reference_measurements():
    assert judge_max_n(640, [512, 512]) == BETTER
    assert judge_max_n(512, [512, 576]) == NOISE
    assert judge_max_n(None, [512, 512]) == WORSE  # nothing fits


@pytest.mark.parametrize("name", sorted(p.stem for p in PLANS.glob("*.yaml")))
def test_every_shipped_plan_composes_and_checks_as_a_run(name, tmp_path):
    register()  # the schema the config's defaults name
    with initialize_config_module("cpbench.configs", version_base="1.3"):
        cfg = compose("config", [f"experiment={name}", f"output_dir={tmp_path}"])
        PlanRun(cfg, [], checked, run_one=lambda c: 1).check_all()
