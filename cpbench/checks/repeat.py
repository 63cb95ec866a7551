"""repeat_check: the same configuration run several times with the same seed. The spread of each
figure over the runs is the run's own tolerance: a later comparison that moves a figure by less has
measured noise, not a change."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any

import pandas as pd

from cpbench.checks.accuracy import CHECKED
from cpbench.record.run_record import PointSpread, RepeatCheck, Spread
from cpbench.results.row import row_key, samples_of

FIGURES = ("walltime_ms", *CHECKED)
POINT = ("N_tokens", "N_atoms", "MSA_depth")


def _ok_points(frame: pd.DataFrame, config_hash: str) -> dict[str, dict[str, Any]]:
    if frame.empty:
        return {}
    rows = frame[
        (frame["kind"] == "point") & (frame["status"] == "ok") & (frame["config_hash"] == config_hash)
    ]
    return {row_key(r): r for r in rows.to_dict("records")}


def spread(values: Sequence[float]) -> Spread:
    """min, max, their difference and that difference relative to the median's magnitude (0 when
    every value is 0)."""
    low, high, median = min(values), max(values), statistics.median(values)
    relative = (high - low) / abs(median) if median else (0.0 if high == low else math.inf)
    return Spread(low, high, high - low, relative)


def repeat_spread(frames: Sequence[pd.DataFrame], config_hash: str) -> RepeatCheck:
    """Per point measured ok in every run, the spread of each figure; and per figure the largest
    relative spread over the points: the tolerance. A figure blank in any run is left out."""
    runs = [_ok_points(frame, config_hash) for frame in frames]
    points, tolerance = [], {}
    for key in sorted(
        set.intersection(*(set(r) for r in runs)), key=lambda k: [int(p) for p in k.split(":")[1:]]
    ):
        rows = [run[key] for run in runs]
        figures = {}
        for name in FIGURES:
            values = [row.get(name) for row in rows]
            if any(v is None or (isinstance(v, float) and math.isnan(v)) for v in values):
                continue
            figures[name] = spread([float(v) for v in values])
            tolerance[name] = max(tolerance.get(name, 0.0), figures[name].relative)
        size = (int(rows[0][k]) for k in POINT)
        points.append(PointSpread(*size, figures, samples_of(rows[0].get("diffusion_samples"))))
    return RepeatCheck(len(frames), tolerance, tuple(points))
