"""Drive the search with real steps: one step per N on every rank, all ranks agreeing on the outcome."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from typing import NamedTuple

from cpbench.core import Shape, Topology
from cpbench.measure.point import PointResult
from cpbench.probe.search import SearchConfig, Trial, bounds, next_trial
from cpbench.probe.state import ProbeState
from cpbench.results.row import KERNEL, LOWER_BOUND, OOM, Measured, ResultRow
from cpbench.runtime.logs import LOG
from cpbench.settings.schema import ProbeConfig


def search_config(
    p: ProbeConfig, topology: Topology, cap_gib: float | None, predicted: int | None = None
) -> SearchConfig:
    return SearchConfig(p, topology.tiling.multiple, cap_gib, predicted)


def run_probe(
    search: Callable[[], SearchConfig],
    state: ProbeState | None,
    trials: list[Trial],
    shape_at: Callable[[int], Shape],
    step_at: Callable[[Shape], PointResult],
    predicted_at: Callable[[int], float | None] = lambda n: None,
    warm_at: Callable[[Shape], PointResult | None] = lambda shape: None,
    stop_before: Callable[[int], str | None] = lambda n: None,
) -> ProbeEnd:
    """Try N after N until the search is done, or `stop_before` gives a reason not to take the next
    step (the time budget: agreed on every rank); `state` (rank 0 only) persists each. Every rank
    computes the same proposals from the same (agreed) outcomes; `search` is asked again before each
    step (a calibrated estimate moves its proposal). `warm_at` runs the warm-up steps before a step,
    outside its seconds; what it returns (warming up did not fit) is the step's outcome."""
    started, steps, stopped = time.perf_counter(), 0, ""
    while (proposal := next_trial(search(), trials)) is not None:
        if why := stop_before(proposal.n):
            stopped = why
            LOG.warning("probe: stopped before N=%d: %s", proposal.n, why)
            break
        shape = shape_at(proposal.n)
        if state is not None:
            state.start(proposal.n)
        warm = warm_at(shape)
        t0 = time.perf_counter()
        result = warm if warm is not None else step_at(shape)
        trial = Trial(
            n=proposal.n,
            fits=result.status == "ok",
            status=result.status,
            peak_gib=result.peak_mem_gib,
            peak_min_gib=result.peak_mem_min_gib,
            seconds=time.perf_counter() - t0,
            guided=proposal.guided,
            predicted_gib=predicted_at(proposal.n),
            failure=result.failure,
        )
        trials.append(trial)
        steps += 1
        if state is not None:
            state.finish(trial)
        LOG.info(
            "probe N=%d%s: %s, peak %.3f GiB%s (%.1f s)",
            trial.n,
            " (guided)" if trial.guided else "",
            "fits" if trial.fits else f"does not fit ({result.error})",
            trial.peak_gib,
            "" if trial.predicted_gib is None else f" (predicted {trial.predicted_gib:.3f})",
            trial.seconds,
        )
    best, fail = bounds(trials)
    LOG.info(
        "probe done: %d step(s) since these ranks started, %d in all, %.1f s; max fit %s, first failure %s",
        steps,
        len(trials),
        time.perf_counter() - started,
        best.n if best else "none",
        fail.n if fail else "none",
    )
    return ProbeEnd(best, fail, stopped)


class ProbeEnd(NamedTuple):
    """Where the probe ended: its largest fit and first failure, and why it stopped short of the edge
    ("": it did not)."""

    best: Trial | None
    fail: Trial | None
    stopped: str = ""


def max_fit_row(row: ResultRow, best: Trial | None, fail: Trial | None, stopped: str = "") -> ResultRow:
    """The headline row: the largest N that fits, its peak, and the first N that did not, named by why:
    `oom_at` where it ran out of memory, `kernel_fault_at` where a kernel faulted (no memory answer:
    the edge is the kernel's). With nothing that fits, the row is that first N's failure. A probe
    `stopped` short of the edge (the time budget) gives its largest fit as a bound, in its note."""
    kernel = fail is not None and fail.failure == KERNEL
    if best:
        measured = Measured(status="ok", peak_mem_gib=best.peak_gib, peak_mem_min_gib=best.peak_min_gib,
                            error=_bound(best, fail, stopped))  # fmt: skip
    elif kernel:
        measured = Measured(status="error", failure=KERNEL, error=f"nothing ran: kernel fault at N={fail.n}")
    else:
        measured = Measured(status="oom", failure=OOM, error=f"nothing fits: N={fail.n} already does not")
    edge = fail.n if fail else None
    return replace(row.with_measured(measured), oom_at=None if kernel else edge,
                   kernel_fault_at=edge if kernel else None)  # fmt: skip


def _bound(best: Trial, fail: Trial | None, stopped: str) -> str:
    """`max fit >= 1,026; the edge not reached: N=2,048's step would take ~4 min, past the 8-minute
    budget (1.2 min left)`; "" for a probe that ended at its edge."""
    if not stopped:
        return ""
    gap = "the edge not reached" if fail is None else f"the gap to N={fail.n:,} not narrowed"
    return f"{LOWER_BOUND}{best.n:,}; {gap}: {stopped}"
