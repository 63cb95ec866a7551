"""Defaults meant for CPU do not refuse or trim a GPU-sized run: the time budget is the device's
(cpbench/preview/budget.py `budget_minutes`), with the default CPU run's budget unchanged."""

from __future__ import annotations

from hydra import compose, initialize_config_module

from cpbench.core import Shape
from cpbench.preview.budget import PilotStep, PlannedWork, budget_minutes, fit_budget
from cpbench.settings.schema import register


def _default_budget() -> tuple[float | None, float | None]:
    """budget.minutes and budget.cuda_minutes of `python -m cpbench` with no overrides."""
    register()
    with initialize_config_module("cpbench.configs", version_base=None):
        cfg = compose("config")
    return cfg.budget.minutes, cfg.budget.cuda_minutes


def test_the_budget_is_the_devices():
    assert budget_minutes(8.0, None, "cpu") == 8.0
    assert budget_minutes(8.0, None, "cuda") is None
    assert budget_minutes(8.0, 30.0, "cuda") == 30.0
    assert budget_minutes(None, 30.0, "cpu") is None


def test_the_default_run_keeps_its_8_minutes_on_cpu_and_has_none_on_cuda():
    minutes, cuda_minutes = _default_budget()
    assert budget_minutes(minutes, cuda_minutes, "cpu") == 8.0
    assert budget_minutes(minutes, cuda_minutes, "cuda") is None


def test_an_af3_size_plan_is_refused_by_the_cpu_budget_and_runs_whole_under_the_cuda_default():
    """A fold step of 40 s at N=512 on one GPU; 3 points to N=2048 (x16 a step there), 3 warm-up and
    5 timed steps each: 8 minutes cannot hold even the least the job allows, the CUDA default holds it."""
    work = PlannedWork(tuple(Shape(n, 9 * n, 16) for n in (512, 1024, 2048)), warmup=3, repeats=5)
    step = PilotStep(n=512, seconds=40.0)
    minutes, cuda_minutes = _default_budget()
    assert fit_budget(work, step, budget_minutes(minutes, cuda_minutes, "cpu"), 3).refusal
    verdict = fit_budget(work, step, budget_minutes(minutes, cuda_minutes, "cuda"), 3)
    assert verdict.refusal is None and verdict.work == work and not verdict.cuts
