"""Predictions at the N and CP sizes a user asks for, and the planning table: for a target N, the
smallest CP size whose ranks fit it (the fake-tensor memory estimate, probe/predict.py) and what a
step there costs, in 1d and in 2d."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from cpbench.core import ConfigError, Topology
from cpbench.core.phases import COUNTED_BY
from cpbench.models.pairformer import chunking
from cpbench.probe.predict import TracedForm, estimate, traced_ranks
from cpbench.probe.search import align_up
from cpbench.runtime.rank import pick_backend
from cpbench.settings.schema import BenchConfig, Workflow
from cpbench.steptime.count import rank_tallies
from cpbench.steptime.model import Hardware, Seconds, step_seconds
from cpbench.sweep import run_shape
from cpbench.workloads.base import Workload


@dataclass(frozen=True)
class Forecast:
    """A predicted step at one topology and N: its seconds (slowest rank), the real job's step
    (None where the job runs a loop cpbench does not time apart), and ranks per device."""

    topology: Topology
    n_tokens: int
    seconds: Seconds
    job_s: float | None
    shared: float


def phase_scales(scaled: dict[str, float]) -> dict[str, float] | None:
    """How much more often the real job runs each phase, from the what-changed table's scaled
    settings; None when it scales a loop no phase times apart (its time then cannot be scaled)."""
    phase_of = {setting: phase for phase, setting in COUNTED_BY.items()}
    if any(setting not in phase_of for setting in scaled):
        return None
    return {phase_of[setting]: scale for setting, scale in scaled.items()}


def ranks_sharing(topology: Topology, hw: Hardware, ranks_per_node: int) -> float:
    """Ranks per device on a node (>= 1): more ranks on a node than it has devices share them, and
    each rank's step takes that many times as long (model.py)."""
    return max(1.0, min(topology.cp, ranks_per_node) / hw.devices_per_node)


def forecast_at(
    settings: BenchConfig,
    workload: Workload,
    topology: Topology,
    n: int,
    hw: Hardware,
    ranks_per_node: int,
    scales: dict[str, float] | None,
    budget_gib: float | None,
) -> Forecast:
    """The predicted step at N (rounded up to tile the topology), its ranks' chunks sized for
    `budget_gib` per rank."""
    n = align_up(n, topology.tiling.multiple)
    shared = ranks_sharing(topology, hw, ranks_per_node)
    tallies = rank_tallies(settings, workload, topology, run_shape(settings, n), budget_gib)
    seconds = step_seconds(tallies, hw, ranks_per_node, shared)
    return Forecast(topology, n, seconds, None if scales is None else seconds.job(scales), shared)


@dataclass(frozen=True)
class SmallestFit:
    """A target N on one topology kind: the smallest CP size that fits it and its forecast, or None
    when none up to the largest CP size tried does."""

    n_tokens: int
    kind: str
    peak_gib: float | None
    forecast: Forecast | None


def topologies(kind: str, max_cp: int) -> Iterator[Topology]:
    """The CP sizes the planning table tries, smallest first: powers of two (a 2d grid of each that tiles)."""
    cp = 1
    while cp <= max_cp:
        with contextlib.suppress(ConfigError):  # a CP size the kind cannot lay out
            yield Topology.from_config(kind if cp > 1 else "1d", cp, None)
        cp *= 2


def smallest_fit(
    settings: BenchConfig,
    workload: Workload,
    n: int,
    kind: str,
    hw: Hardware,
    ranks_per_node: int,
    budget_gib: float,
    scales: dict[str, float] | None,
    progress: Callable[[str], None] = lambda line: None,
) -> SmallestFit:
    """The smallest CP size of `kind` whose every traced rank holds N within `budget_gib` per rank."""
    train, dtype = settings.workflow is Workflow.training, getattr(torch, settings.dtype.value)
    gloo = pick_backend(settings.dist.backend) == "gloo"
    for topology in topologies(kind, settings.forecast.plan_max_cp):
        at = align_up(n, topology.tiling.multiple)
        progress(f"N={at}: tracing {topology.kind} cp={topology.cp}")
        with chunking.sized_for(budget_gib):
            form = TracedForm.of(workload, topology, train, dtype, settings.seed)
            peak = estimate(workload, topology, run_shape(settings, at), train, dtype, settings.seed,
                            traced_ranks(topology), gloo, form).peak_gib  # fmt: skip
        if peak <= budget_gib:
            progress(f"N={at}: counting {topology.kind} cp={topology.cp}'s work")
            fc = forecast_at(settings, workload, topology, at, hw, ranks_per_node, scales, budget_gib)
            return SmallestFit(n, kind, peak, fc)
    return SmallestFit(n, kind, None, None)
