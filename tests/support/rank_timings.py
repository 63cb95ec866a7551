"""Fixed per-rank timings (`RANKS`, made by `timings`) and the point's figures they reduce to
(`EXPECTED`): the walltime statistics of a results row pinned."""

from __future__ import annotations

from cpbench.measure.stats import PointTimes, RepeatTiming

MS = 1e-3


def timings(total_ms: list[float], comm_ms: list[float]) -> list[RepeatTiming]:
    """Repeats whose phases split the total 1/2 forward, 1/4 backward, 1/4 optimizer."""
    return [
        RepeatTiming(t * MS, t / 2 * MS, t / 4 * MS, t / 4 * MS, c * MS)
        for t, c in zip(total_ms, comm_ms, strict=True)
    ]


# Rank 0 is fastest in two repeats and much slower in the third. Per repeat the slowest rank is
# [2, 2, 10] ms: median 2 and IQR 4 (inclusive quartiles 2 and 6). The fastest rank would give
# [1, 1, 2] (median 1); the mean of the slowest 4.67, of all six values 3.
RANKS = [timings([1, 1, 10], comm_ms=[0.5, 0.5, 5]), timings([2, 2, 2], comm_ms=[1, 1, 1])]
EXPECTED = PointTimes(
    walltime_ms=2, walltime_iqr_ms=4, forward_ms=1, backward_ms=0.5, optimizer_ms=0.5, comm_ms=1
)
