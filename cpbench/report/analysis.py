"""What the report computes from results rows, as pure functions over frames: the like-for-like
groups, the largest N that fits per CP size, the share of time in collectives, the walltime table,
noisy points and the estimate's error. The sentences that say them are in sections/."""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

# Rows differing in any of these are different experiments: each gets its own tables, plots, readout.
LIKE_FOR_LIKE = ["workload", "workflow", "dtype"]
# Above this share of walltime in collectives, a run is communication-bound.
BOUND_SHARE = 0.5
# A point whose IQR over repeats exceeds this share of its median walltime is noisy.
NOISY_IQR = 0.10


def like_for_like(frame: pd.DataFrame) -> list[tuple[tuple[Any, ...], pd.DataFrame]]:
    """The groups of rows that may be compared, each keyed by (workload, workflow, dtype), and by the
    input file where rows have one (two complexes of one size are different experiments)."""
    if frame.empty:
        return []
    keys = [c for c in LIKE_FOR_LIKE if c in frame.columns]
    if "input" in frame.columns and frame["input"].replace("", None).notna().any():
        keys.append("input")
    return [(key, group) for key, group in frame.groupby(keys, sort=False, dropna=False)]


def group_label(key: tuple[Any, ...]) -> str:
    return ", ".join(str(k) for k in key)


def ok_points(frame: pd.DataFrame) -> pd.DataFrame:
    """Walltime points that finished: the only rows whose times may be compared."""
    points = frame[(frame["kind"] == "point") & (frame["status"] == "ok")]
    return points[points["walltime_ms"].notna() & (points["walltime_ms"] > 0)]


def max_fit(frame: pd.DataFrame) -> pd.DataFrame:
    """Largest N_tokens that fits per (topology, cp), against cp=1 and against the ideal for memory
    growing as N^2 (N growing as sqrt(cp)). The cp=1 baseline is the same whatever the topology."""
    columns = ["topology", "cp", "grid", "max_n", "vs_cp1", "ideal", "note"]
    fits = frame[(frame["kind"] == "max-fit") & (frame["status"] == "ok")]
    if fits.empty:
        return pd.DataFrame(columns=columns)
    best = fits.loc[fits.groupby(["topology", "cp"], sort=True)["N_tokens"].idxmax()]
    base = best.loc[best["cp"] == 1, "N_tokens"].max()
    return pd.DataFrame(
        {
            "topology": best["topology"].to_numpy(),
            "cp": best["cp"].astype(int).to_numpy(),
            "grid": best["grid"].to_numpy() if "grid" in best else None,
            "max_n": best["N_tokens"].astype(int).to_numpy(),
            "vs_cp1": (best["N_tokens"] / base).to_numpy() if pd.notna(base) else math.nan,
            "ideal": [math.sqrt(cp) for cp in best["cp"]],
            "note": [_fit_note(r) for r in best.itertuples()],
        }
    ).sort_values(["cp", "topology"], ignore_index=True)


def _fit_note(row: Any) -> str:
    """Where the probe stopped: the first N that did not fit (`oom_at`), else any note it left."""
    oom_at = getattr(row, "oom_at", None)
    if oom_at is not None and pd.notna(oom_at):
        return f"N={int(oom_at)} does not fit"
    error = getattr(row, "error", None)
    return "" if error is None or pd.isna(error) else str(error)


def comm_share(frame: pd.DataFrame) -> pd.DataFrame:
    """Median share of walltime spent in collectives per (topology, cp), over the measured points. One
    rank has no collectives (a blank is 0); above it a blank is not known, and left out."""
    ok = ok_points(frame)
    comm = ok["comm_ms"].astype(float)
    comm = comm.where(ok["cp"] > 1, comm.fillna(0))
    ok = ok.assign(share=comm / ok["walltime_ms"].astype(float)).dropna(subset=["share"])
    if ok.empty:
        return pd.DataFrame(columns=["topology", "cp", "share", "points"])
    grouped = ok.groupby(["topology", "cp"], sort=True)["share"]
    return pd.DataFrame({"share": grouped.median(), "points": grouped.size()}).reset_index()


def walltime_table(frame: pd.DataFrame) -> pd.DataFrame:
    """Walltime (ms, median over repeats of the slowest rank) of each input size, one column per
    (topology, cp, grid); several rows of one cell (reruns) give their median."""
    ok = ok_points(frame)
    if ok.empty:
        return pd.DataFrame()
    table = ok.pivot_table(
        index=["N_tokens", "N_atoms", "MSA_depth"],
        columns=["topology", "cp", "grid"],
        values="walltime_ms",
        aggfunc="median",
    )
    return table.sort_index(axis=1, level=[1, 0])


def noisy(frame: pd.DataFrame) -> pd.Series:
    """Measured points whose IQR exceeds NOISY_IQR of their median walltime."""
    if "walltime_iqr_ms" not in frame.columns:
        return pd.Series(False, index=frame.index)
    iqr, median = frame["walltime_iqr_ms"].astype(float), frame["walltime_ms"].astype(float)
    return (frame["status"] == "ok") & (iqr > NOISY_IQR * median)


def prediction_errors(frame: pd.DataFrame) -> pd.DataFrame:
    """Rows with both a measured and a predicted peak, and the prediction's error relative to the
    measured peak over the start-up baseline (what the budget caps; the baseline itself is not predicted)."""
    needed = ["predicted_peak_gib", "peak_mem_gib"]
    if not set(needed) <= set(frame.columns):
        return frame.iloc[0:0]
    rows = frame[frame["predicted_peak_gib"].notna() & frame["peak_mem_gib"].notna()].copy()
    base = rows["baseline_gib"].fillna(0.0) if "baseline_gib" in rows.columns else 0.0
    measured = (rows["peak_mem_gib"] - base).where(lambda over: over > 0)
    rows["prediction_error"] = (rows["predicted_peak_gib"] - rows["peak_mem_gib"]) / measured
    return rows[rows["prediction_error"].notna()]
