"""Predictions at the N and CP sizes a user asks for, and the planning table: for a target N, the
smallest CP size whose ranks fit it (the fake-tensor memory estimate, probe/trace.py) and what a
step there costs, in 1d and in 2d."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from cpbench.core import ConfigError, Topology
from cpbench.core.phases import COUNTED_BY
from cpbench.probe.search import align_up
from cpbench.probe.trace import TraceSpec, estimate, traced_ranks
from cpbench.settings.schema import BenchConfig
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


@dataclass(frozen=True)
class Target:
    """What a forecast is for: the machine's figures, the ranks a node runs, and how much more often
    the real job runs each phase than the benchmark (`phase_scales`; None: the job's step is not
    estimated)."""

    hw: Hardware
    ranks_per_node: int
    scales: dict[str, float] | None = None


def ranks_sharing(topology: Topology, hw: Hardware, ranks_per_node: int) -> float:
    """Ranks per device on a node (>= 1): more ranks on a node than it has devices share them, and
    each rank's step takes that many times as long (model.py)."""
    return max(1.0, min(topology.cp, ranks_per_node) / hw.devices_per_node)


def forecast_at(
    settings: BenchConfig, workload: Workload, topology: Topology, n: int, spec: TraceSpec, target: Target
) -> Forecast:
    """The predicted step at N (rounded up to tile the topology), its ranks' chunks sized for the
    spec's per-rank cap."""
    n = align_up(n, topology.tiling.multiple)
    shared = ranks_sharing(topology, target.hw, target.ranks_per_node)
    tallies = rank_tallies(workload, topology, run_shape(settings, n), spec)
    seconds = step_seconds(tallies, target.hw, target.ranks_per_node, shared)
    job_s = None if target.scales is None else seconds.job(target.scales)
    return Forecast(topology, n, seconds, job_s, shared)


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
    spec: TraceSpec,
    target: Target,
    progress: Callable[[str], None] = lambda line: None,
) -> SmallestFit:
    """The smallest CP size of `kind` whose every traced rank holds N within the spec's per-rank cap."""
    cap_gib = spec.chunk_cap_gib
    if cap_gib is None:
        raise ValueError("the planning table needs a per-rank cap: memory.budget_gib")
    for topology in topologies(kind, settings.forecast.plan_max_cp):
        at = align_up(n, topology.tiling.multiple)
        progress(f"N={at}: tracing {topology.kind} cp={topology.cp}")
        peak = estimate(workload, topology, run_shape(settings, at), spec, traced_ranks(topology)).peak_gib
        if peak <= cap_gib:
            progress(f"N={at}: counting {topology.kind} cp={topology.cp}'s work")
            return SmallestFit(n, kind, peak, forecast_at(settings, workload, topology, at, spec, target))
    return SmallestFit(n, kind, None, None)
