"""The statistics of a point, as pure functions of per-rank, per-repeat timings.

A repeat's time is the slowest rank's (the slowest rank sets the pace); a point reports the median
over repeats and the IQR, never the mean. Communication time and bytes are the largest over ranks.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class RepeatTiming:
    """One timed repeat on one rank, in seconds."""

    total: float
    forward: float
    backward: float
    optimizer: float
    comm: float  # in collectives (cpbench's ledger)

    def as_list(self) -> list[float]:
        return list(dataclasses.astuple(self))


def slowest(per_rank: Sequence[Sequence[RepeatTiming]]) -> list[RepeatTiming]:
    """Per repeat and field, the largest value over ranks: a step is as fast as its slowest rank."""
    return [
        RepeatTiming(*(max(values) for values in zip(*(t.as_list() for t in repeat), strict=True)))
        for repeat in zip(*per_rank, strict=True)
    ]


def repeat_totals_ms(per_rank: Sequence[Sequence[RepeatTiming]]) -> list[float]:
    """Each timed repeat's walltime in ms, the slowest rank's: the samples behind the median."""
    return [r.total * 1e3 for r in slowest(per_rank)]


def first_step_ms(per_rank: Sequence[float | None]) -> float | None:
    """The first warm-up step in ms, the slowest rank's; None with no warm-up (a probe step)."""
    seconds = [s for s in per_rank if s is not None]
    return max(seconds) * 1e3 if seconds else None


def median_iqr(samples: Sequence[float]) -> tuple[float, float]:
    """Median and interquartile range (inclusive quartiles); one sample has no spread."""
    if len(samples) == 1:
        return samples[0], 0.0
    q1, _, q3 = statistics.quantiles(samples, n=4, method="inclusive")
    return statistics.median(samples), q3 - q1


@dataclass(frozen=True)
class PointTimes:
    """A point's walltime figures in milliseconds, from the slowest rank of each repeat."""

    walltime_ms: float
    walltime_iqr_ms: float
    forward_ms: float
    backward_ms: float
    optimizer_ms: float
    comm_ms: float

    @classmethod
    def of(cls, repeats: Sequence[RepeatTiming]) -> PointTimes:
        total, iqr = median_iqr([r.total * 1e3 for r in repeats])

        def median(name: str) -> float:
            return statistics.median(getattr(r, name) * 1e3 for r in repeats)

        return cls(total, iqr, median("forward"), median("backward"), median("optimizer"), median("comm"))

    @classmethod
    def across_ranks(cls, per_rank: Sequence[Sequence[RepeatTiming]]) -> PointTimes:
        """The figures of a point from every rank's repeats: the slowest rank per repeat, then the median."""
        return cls.of(slowest(per_rank))


SETTLE_STEPS = 3  # the fewest warm-up steps that can show the step time has stopped falling


def settled(step_ms: Sequence[float], pct: float) -> bool:
    """The step time has stopped falling: neither of the last SETTLE_STEPS - 1 steps is over `pct` %
    faster than the fastest step before them. One-off costs (compilation, autotuning, the allocator's
    first requests) make the first steps slow; a step slower than the others is noise, which the
    repeats measure, not a cost still being paid (waiting for steps to agree spent warm-ups on it)."""
    if len(step_ms) < SETTLE_STEPS:
        return False
    before, last = step_ms[: 1 - SETTLE_STEPS], step_ms[1 - SETTLE_STEPS :]
    return min(last) >= (1 - pct / 100) * min(before)


def spread_wide(step_ms: Sequence[float], pct: float) -> bool:
    """The IQR of the timed steps is over `pct` % of their median: more repeats are worth taking."""
    median, iqr = median_iqr(step_ms)
    return iqr > pct / 100 * median


def comm_mib_per_step(bytes_per_step: Sequence[float]) -> float:
    """MiB sent per step by the rank that sends the most (ranks of a 2d grid send unequal amounts)."""
    return max(bytes_per_step) / 2**20
