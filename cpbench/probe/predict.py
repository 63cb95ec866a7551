"""Predict the per-rank peak memory of a probe step, and the largest N within the per-rank cap,
without running a real step: each traced rank's step runs on fake tensors (probe/trace.py, the one
trace engine) at a few N, and a quadratic of peak in N through them finds where the cap is crossed.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np

from cpbench.core import Shape, Topology
from cpbench.probe.owners import top_owners
from cpbench.probe.search import align_down, align_up
from cpbench.probe.trace import (
    ASSUMPTIONS,
    GIB,
    Estimate,
    TracedForm,
    TraceSpec,
    estimate,
    peak_owners,
    traced_ranks,
)
from cpbench.runtime.rank import visible_gpus
from cpbench.settings.schema import BenchConfig, ProbeConfig
from cpbench.sweep import run_shape
from cpbench.workloads.base import Workload

MAX_TRACES = 12  # fake traces per prediction: the ramp, the fit's crossing and its check


@dataclass
class Prediction:
    """Traced peaks at a few N, and the largest N predicted to fit `cap_gib` (per rank, over what a
    rank holds after start-up)."""

    estimates: list[Estimate] = field(default_factory=list)
    cap_gib: float | None = None
    proposal: int | None = None
    ranks: tuple[int, ...] = ()  # the ranks traced, one per distinct role on the grid
    # What real steps held beyond their traces (the process, workspaces: see ASSUMPTIONS), in turn:
    # N_tokens, missed_gib, proposal. The last one's miss is added to every estimate (`calibrated`).
    calibrations: tuple[dict, ...] = ()
    # Who holds the peak at the proposal (the first traced rank): (holder, bytes), largest first.
    owners: tuple[tuple[str, int], ...] = ()

    @property
    def missed_gib(self) -> float:
        return self.calibrations[-1]["missed_gib"] if self.calibrations else 0.0

    @property
    def calibrated_at(self) -> int | None:
        return self.calibrations[-1]["N_tokens"] if self.calibrations else None

    def as_json(self) -> dict:
        return {
            "budget_gib": self.cap_gib,  # prediction.json's key, as earlier runs wrote it
            "proposal": self.proposal,
            "ranks": list(self.ranks),
            "estimates": [{"N_tokens": e.n, "peak_gib": e.peak_gib} for e in self.estimates],
            "calibration": {"N_tokens": self.calibrated_at, "missed_gib": self.missed_gib},
            "calibrations": list(self.calibrations),
            "owners_at_proposal": [{"holder": name, "gib": size / GIB} for name, size in self.owners],
            "assumes": ASSUMPTIONS,
        }

    def at(self, n: int) -> float | None:
        """The predicted peak at N: the traced one, else the quadratic through the nearest three
        (plus what a real step was measured to hold beyond its trace, once calibrated)."""
        points = sorted({e.n: e.peak_gib for e in self.estimates}.items())
        if not points:
            return None
        exact = dict(points)
        if n in exact:
            return exact[n] + self.missed_gib
        near = sorted(points, key=lambda p: abs(p[0] - n))[:3]
        xs, ys = (np.array(v, dtype=float) for v in zip(*near, strict=True))
        return float(np.poly1d(np.polyfit(xs, ys, deg=len(near) - 1))(n)) + self.missed_gib

    def calibrated(self, n: int, measured_gib: float, multiple: int) -> Prediction:
        """This prediction once a real step at N measured `measured_gib` (over the start-up baseline):
        the difference, memory the trace cannot see, is added to every estimate, and the proposal
        moves to where the shifted curve crosses the cap (between the traces: no new trace)."""
        missed = measured_gib - (self.at(n) - self.missed_gib)
        proposal = self.proposal
        if self.cap_gib is not None:
            proposal = _proposal_within(self.estimates, self.cap_gib - missed, multiple)
        step = {"N_tokens": n, "missed_gib": missed, "proposal": proposal}
        return replace(self, proposal=proposal, calibrations=(*self.calibrations, step))


def predict(
    workload: Workload,
    topology: Topology,
    shape_at: Callable[[int], Shape],
    spec: TraceSpec,
    probe: ProbeConfig,
    points: list[int] | None = None,
) -> Prediction:
    """Trace at `points` when given; otherwise ramp N from `probe.start` by `probe.factor` (up to
    `probe.max_tokens`) until the predicted peak passes the per-rank cap (`spec.chunk_cap_gib`), fit a
    quadratic of peak in N through the last three traces, and trace at its crossing of the cap
    (rounded down to the grid), stepping down until the trace fits."""
    m, cap_gib = topology.tiling.multiple, spec.chunk_cap_gib
    prediction = Prediction(cap_gib=cap_gib, ranks=traced_ranks(topology))
    form = TracedForm.of(workload, topology, spec)

    def trace(n: int) -> Estimate:
        e = estimate(workload, topology, shape_at(n), spec, prediction.ranks, form)
        prediction.estimates.append(e)
        return e

    if points is not None:
        for n in points:
            trace(n)
        return prediction
    if cap_gib is None:
        raise ValueError("probe.predict needs a cap: memory.budget_gib (or on CPU memory.cpu_budget_gib)")
    n = max(m, align_down(probe.start, m))
    top = align_down(probe.max_tokens, m) if probe.max_tokens else None
    while len(prediction.estimates) < MAX_TRACES:
        e = trace(n)
        if e.peak_gib > cap_gib:
            break
        nxt = max(align_up(n * probe.factor, m), n + m)
        if top is not None and n >= top:
            prediction.proposal = n  # everything up to probe.max_tokens fits
            return prediction
        n = min(nxt, top) if top is not None else nxt
    fits = [e for e in prediction.estimates if e.peak_gib <= cap_gib]
    if not fits:  # the start is over the cap: halve until a trace fits
        while n > m and len(prediction.estimates) < MAX_TRACES:
            n = max(m, align_down(n / probe.factor, m))
            if trace(n).peak_gib <= cap_gib:
                break
        fits = [e for e in prediction.estimates if e.peak_gib <= cap_gib]
        if not fits:
            return prediction
    lo = max(e.n for e in fits)
    guess = _proposal_within(prediction.estimates, cap_gib, m)
    while len(prediction.estimates) < MAX_TRACES and guess > lo:
        if trace(guess).peak_gib <= cap_gib:
            prediction.proposal = guess
            return prediction
        guess -= m * max(1, math.ceil(0.01 * guess / m))  # 1% steps down
    prediction.proposal = lo
    return prediction


def _proposal_within(estimates: list[Estimate], cap_gib: float, m: int) -> int | None:
    """The largest N the traces put within the cap: the largest trace that fits, or above it the
    crossing of the quadratic through the three largest traces, below the smallest trace over it."""
    fits = [e.n for e in estimates if e.peak_gib <= cap_gib]
    if not fits:
        return None
    lo, over = max(fits), [e.n for e in estimates if e.peak_gib > cap_gib]
    guess = _crossing(estimates, cap_gib, m, lo)
    return guess if guess is not None and (not over or guess < min(over)) else lo


def _crossing(estimates: list[Estimate], cap_gib: float, m: int, lo: int) -> int | None:
    """Where the quadratic through the three largest traces first crosses the cap above the
    largest trace that fits (`lo`), rounded down to m."""
    points = sorted({e.n: e.peak_gib for e in estimates}.items())[-3:]
    if len(points) < 2:
        return None
    xs, ys = (np.array(v, dtype=float) for v in zip(*points, strict=True))
    model = np.poly1d(np.polyfit(xs, ys, deg=len(points) - 1)) - cap_gib
    roots = [r.real for r in model.roots if abs(r.imag) < 1e-9 and r.real > lo]
    return align_down(min(roots), m) if roots else None


def for_run(settings: BenchConfig, workload: Workload, topology: Topology) -> Prediction:
    """The run's prediction, held to its per-rank cap; CannotTrace (probe/trace.py) names the op when
    the workload cannot run on fake tensors."""
    spec = TraceSpec.of(settings)
    prediction = predict(workload, topology, lambda n: run_shape(settings, n), spec, settings.probe)
    if prediction.proposal:
        prediction.owners = tuple(holders_at(settings, workload, topology, prediction.proposal))
    return prediction


def holders_at(
    settings: BenchConfig, workload: Workload, topology: Topology, n: int
) -> list[tuple[str, int]]:
    """Who holds the run's peak at N on its first traced rank (bytes, largest first), traced with the
    chunks its ranks run; CannotTrace where the workload cannot run on fake tensors."""
    spec, rank = TraceSpec.of(settings), traced_ranks(topology)[0]
    return top_owners(peak_owners(workload, topology, run_shape(settings, n), spec, rank))


def summary(prediction: Prediction) -> list[str]:
    """What `python -m cpbench.predict` prints: the peak at each traced N, the proposal, the assumptions."""
    lines = [f"{'N_tokens':>9}  predicted peak GiB/rank (over the start-up baseline)"]
    lines += [f"{e.n:>9}  {e.peak_gib:.4f}" for e in sorted(prediction.estimates, key=lambda e: e.n)]
    ranks = ", ".join(str(r) for r in prediction.ranks)
    lines.append(f"traced ranks: {ranks}; cap {prediction.cap_gib:g} GiB per rank")
    lines.append(f"predicted max N_tokens: {prediction.proposal if prediction.proposal else 'none fits'}")
    if prediction.owners:
        held = ", ".join(f"{name} {size / GIB:.3f} GiB" for name, size in prediction.owners)
        lines.append(f"at N={prediction.proposal} the peak is held by: {held}")
    if not visible_gpus():  # the target device is not here: say what the estimate leaves out
        lines.append(f"assumes: {ASSUMPTIONS}")
    return lines
