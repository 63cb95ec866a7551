"""The same job on one rank: the cp=1 run a CP run is compared with (the baseline beside it, and
mode=accuracy's reference, which are one run)."""

from __future__ import annotations

import copy

from cpbench.runtime.rank import device_type, pick_backend, threads_per_rank
from cpbench.settings.schema import BenchConfig, FaultConfig, Mode, TopologyConfig


def cp1_settings(settings: BenchConfig) -> BenchConfig:
    """`settings` on one rank, without a fault, a repeat check or a baseline of its own, with half the
    command's time budget (the CP run has what it leaves: `budget_left`). In mode=accuracy without the
    probe too: the points are what is checked, and the probe's N are the layout's own."""
    one = copy.deepcopy(settings)
    budget = settings.budget
    one.budget.minutes, one.budget.cuda_minutes = (
        None if m is None else m / 2 for m in (budget.minutes, budget.cuda_minutes)
    )
    # The run's own kind at one rank (2d: a 1x1 grid): a model that needs a 2d mesh gets one.
    one.topology = TopologyConfig(kind=settings.topology.kind, cp=1, grid=None)
    one.fault = FaultConfig()
    one.repeat_check = 0
    one.baseline = False
    if device_type(pick_backend(settings.dist.backend)) == "cpu":  # elsewhere it changes nothing
        one.dist.cpu_threads = threads_per_rank(settings.dist.cpu_threads, settings.topology.cp)
    if settings.mode is Mode.accuracy:
        one.probe.enabled = False
    return one


def budget_left(settings: BenchConfig, seconds_spent: float) -> BenchConfig:
    """`settings` with the time budget less what its cp=1 baseline took in this command (to a tenth
    of a minute, as the plan line says it): one budget for the command, baseline included."""
    left = copy.deepcopy(settings)
    budget = settings.budget
    left.budget.minutes, left.budget.cuda_minutes = (
        None if m is None else max(0.0, round(m - seconds_spent / 60, 1))
        for m in (budget.minutes, budget.cuda_minutes)
    )
    return left
