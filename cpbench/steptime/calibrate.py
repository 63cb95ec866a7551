"""The time model's figures fitted to a machine's own measurements: each aten op's fixed cost and
rate from its timed runs inside real steps at a few N (`op_timer.py`), and the link's alpha-beta
from the collectives a CP run measured per op (comm_ops.csv). Each fit is a non-negative least
squares of two figures over the points, one op at a time: what the op timer separates, the fit
never has to."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from cpbench.measure.tally import MEMORY, op_class
from cpbench.steptime.model import INTRA, Hardware, Link, OpCost
from cpbench.steptime.op_timer import OpTimes


def nonnegative_lstsq(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """min |a x - b| with x >= 0, exactly: the best unconstrained fit over each subset of free
    columns whose solution is non-negative (a handful of columns: 2^k small solves)."""
    best, best_residual = np.zeros(a.shape[1]), float(np.sum(b**2))
    for k in range(1, a.shape[1] + 1):
        for free in itertools.combinations(range(a.shape[1]), k):
            x, *_ = np.linalg.lstsq(a[:, free], b, rcond=None)
            if np.all(x >= 0):
                residual = float(np.sum((a[:, free] @ x - b) ** 2))
                if residual < best_residual:
                    best, best_residual = np.zeros(a.shape[1]), residual
                    best[list(free)] = x
    return best


# A class's rate is fitted at the largest N calibrated, this many: an op's rate on a CPU still grows
# with its size there (fold_small, one rank: a matmul's from 25 GFLOP/s at N=128 to 33 at N=384, a
# layer norm's from 2.3 GB/s at N=128 to 2.8 at N=256), so the marginal cost between the largest N
# is the nearest to the sizes a forecast asks for. Fitted over N=32-128, the small N's slower rates
# put one rank's op times at N=256-384 13-18 % over the times measured there in three sets of op
# times; over N=96-128, 2-13 %.
NEAREST = 2


def fit_cost(runs: Sequence[float], work: Sequence[float], seconds: Sequence[float]) -> OpCost:
    """seconds = runs x kernel_s + work / per_s over the points, least squares in seconds. A rate
    the points cannot tell from free is infinite."""
    a = np.array([runs, work], dtype=float).T
    y = np.array(seconds, dtype=float)
    scale = np.where(a.max(axis=0) > 0, a.max(axis=0), 1.0)
    kernel, per_unit = nonnegative_lstsq(a / scale, y) / scale
    return OpCost(float(kernel), float(1 / per_unit) if per_unit > 0 else float("inf"))


def measured_cost(runs: Sequence[float], work: Sequence[float], seconds: Sequence[float]) -> OpCost:
    """An op's measured runs, (work, seconds) of a run at each point by work, each taking at least
    as long as a smaller one (noise can make a larger run look quicker); beyond the largest, the
    marginal rate between the two largest (a single run, or none faster: the largest's own rate)."""
    by_work = sorted((w / n, s / n) for n, w, s in zip(runs, work, seconds, strict=True))
    work_at = [float(w) for w, _ in by_work]
    seconds_at = [float(s) for s in np.maximum.accumulate([s for _, s in by_work])]
    w1, s1 = (work_at[-2], seconds_at[-2]) if len(by_work) > 1 else (0.0, 0.0)
    w2, s2 = work_at[-1], seconds_at[-1]
    rate = (w2 - w1) / (s2 - s1) if s2 > s1 and w2 > w1 else w2 / s2
    return OpCost(0.0, rate, tuple(zip(work_at, seconds_at, strict=True)))


def fit_ops(points: Sequence[OpTimes]) -> tuple[dict[str, OpCost], dict[str, OpCost]]:
    """Each op's measured runs (`measured_cost`), or for an op that does no work its fixed cost over
    the points; and each class's linear cost over its ops' sums in the last `NEAREST` points (points
    in order of N), for an op no point ran."""
    ops = sorted({op for p in points for op in p.runs})
    flop_ops = set().union(*(p.flop_ops for p in points))
    kind = {op: op_class(op) if op in flop_ops else MEMORY for op in ops}
    costs = {}
    for op in ops:
        seen = [p for p in points if p.seconds[op] > 0]
        runs, work, seconds = ([getattr(p, f)[op] for p in seen] for f in ("runs", "work", "seconds"))
        costs[op] = measured_cost(runs, work, seconds) if all(work) else fit_cost(runs, work, seconds)
    classes = {}
    for c in sorted(set(kind.values())):
        members = [op for op in ops if kind[op] == c]
        totals = [
            [sum(getattr(p, f)[op] for op in members) for p in points[-NEAREST:]]
            for f in ("runs", "work", "seconds")
        ]
        classes[c] = fit_cost(*totals)
    return costs, classes


@dataclass(frozen=True)
class CommPoint:
    """One op label's collectives in one measured point: calls and bytes sent per step, and their seconds."""

    calls: float
    sent: float
    seconds: float


def fit_link(points: Sequence[CommPoint]) -> Link:
    """A link's alpha (seconds a call) and bandwidth from ops' measured collective seconds, on
    absolute error: the step's comm time is their sum, which the large ops hold."""
    a = np.array([[p.calls, p.sent] for p in points], dtype=float)
    y = np.array([p.seconds for p in points])
    scale = np.where(a.max(axis=0) > 0, a.max(axis=0), 1.0)
    alpha, per_byte = nonnegative_lstsq(a / scale, y) / scale
    return Link(float(alpha), float(1 / per_byte) if per_byte > 0 else float("inf"))


def calibrated(name: str, timed: Sequence[OpTimes], comm: Sequence[CommPoint], devices_per_node: int,
               dtype: str, memory_gib: float | None, source: str) -> Hardware:  # fmt: skip
    """The machine's figures from its timed ops and its measured collectives (none: no link)."""
    ops, classes = fit_ops(timed)
    links = {INTRA: fit_link(comm)} if comm else {}
    rates = {c: cost.per_s for c, cost in classes.items()}
    kernel = classes[MEMORY].kernel_s if MEMORY in classes else 0.0
    figures = ["ops", "rates", "kernel_s", *(f"links.{link}" for link in links)]
    return Hardware(name, rates, kernel, links, devices_per_node, dtype, memory_gib, ops,
                    dict.fromkeys(figures, source))  # fmt: skip
