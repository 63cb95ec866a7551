"""What the report computes from results rows, as pure functions over frames: the like-for-like
groups, the largest N that fits per CP size, the share of time in collectives, the walltime table,
noisy points and the estimate's error. The sentences that say them are in sections/."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import pandas as pd

from cpbench.results.row import BASELINE, LOWER_BOUND

if TYPE_CHECKING:
    from cpbench.record.run_record import RunMetadata

# Rows differing in any of these are different experiments: each gets its own tables, plots, readout.
# The workload's preset and a hash of its settings, the device model, the memory cap as set, and the
# diffusion samples per trunk pass (they move the peak and the step: a max N at 1 sample is no answer
# at 5), and the attention kernels (the logits written or not: models/pairformer/kernels.py)
# (cpbench/results/row.py); rows written before a column existed group by the others.
LIKE_FOR_LIKE = [
    "workload", "preset", "sizes_hash", "workflow", "dtype", "device", "memory_budget", "diffusion_samples",
    "kernels",
]  # fmt: skip
# Above this share of walltime in collectives, a run is communication-bound.
BOUND_SHARE = 0.5
# A point whose IQR over repeats exceeds this share of its median walltime is noisy.
NOISY_IQR = 0.10


def like_for_like(frame: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """The groups of rows that may be compared, each with its label (`group_label`): one workload
    preset with one set of sizes, workflow, dtype, device model and memory cap, and one input file
    where rows have one (two complexes of one size are different experiments)."""
    if frame.empty:
        return []
    keys = [c for c in LIKE_FOR_LIKE if c in frame.columns]
    if "input" in frame.columns and frame["input"].replace("", None).notna().any():
        keys.append("input")
    return [(group_label(group), group) for _, group in frame.groupby(keys, sort=False, dropna=False)]


def _first(group: pd.DataFrame, column: str) -> str:
    """The group's value of a label column as text; blank where the rows have none."""
    if column not in group.columns or pd.isna(value := group[column].iloc[0]):
        return ""
    return str(value)


def experiment_label(group: pd.DataFrame) -> str:
    """What a group measured, e.g. `fold_small [sizes a90614e6], sdpa kernels, inference, float32, 2
    diffusion sample(s), cap 0.5 GiB/rank` (the kernels where the workload records them, samples per
    trunk pass where it has a diffusion batch): the model's own name follows a preset that does not
    start with it (`adapter (my.module)`)."""
    preset, workload, sizes = (_first(group, c) for c in ("preset", "workload", "sizes_hash"))
    name = preset or workload
    name += f" ({workload})" if preset and workload and not preset.startswith(workload) else ""
    name += f" [sizes {sizes}]" if sizes else ""
    cap = _first(group, "memory_budget")
    cap = {"": "", "none": "uncapped", "device memory": "cap: device memory"}.get(cap, f"cap {cap}/rank")
    samples = _first(group, "diffusion_samples")
    samples = f"{int(float(samples))} diffusion sample(s)" if samples else ""
    kernels = _first(group, "kernels")
    kernels = f"{kernels} kernels" if kernels else ""
    parts = [name, kernels, _first(group, "workflow"), _first(group, "dtype"), samples, cap]
    parts += [f"input {_first(group, 'input')}"] if _first(group, "input") else []
    return ", ".join(part for part in parts if part)


def group_label(group: pd.DataFrame) -> str:
    """A group's heading: what it measured and on which device."""
    device = _first(group, "device")
    return experiment_label(group) + (f" on {device}" if device else "")


def hardware_label(group: pd.DataFrame) -> str:
    """What a group ran on: the device model and the ranks (cp) its rows span, e.g. `NVIDIA H100 80GB
    HBM3, 1-8 ranks`."""
    cps = sorted(int(cp) for cp in group["cp"].dropna().unique())
    ranks = "" if not cps else f"{cps[0]} rank(s)" if len(cps) == 1 else f"{cps[0]}-{cps[-1]} ranks"
    return ", ".join(part for part in (_first(group, "device") or "device not recorded", ranks) if part)


def oversubscribed_rows(frame: pd.DataFrame) -> pd.Series:
    """Rows of runs whose ranks outnumbered their devices or cores (the `oversubscribed` column a
    report adds from run.json: `yes (4 ranks on 2 CPU core(s))`)."""
    if "oversubscribed" not in frame.columns:
        return pd.Series(False, index=frame.index)
    return frame["oversubscribed"].fillna("").astype(str).str.startswith("yes")


def labelled(frame: pd.DataFrame, meta: RunMetadata) -> pd.DataFrame:
    """A run's rows with what a merge groups and marks them by: the label columns a folder written
    before them lacks (the preset: the workload's name; the device: run.json's; the cap: budget_gib),
    and whether the run was oversubscribed (run.json's `oversubscribed`; the cp=1 baseline's rows beside
    it ran alone)."""
    if frame.empty:
        return frame
    budget = frame.get("budget_gib", pd.Series(math.nan, index=frame.index))
    fallback = {
        "preset": frame["workload"],
        "device": pd.Series(meta.device, index=frame.index, dtype=object),
        "memory_budget": budget.map(lambda gib: "none" if pd.isna(gib) else f"{gib:g} GiB"),
    }
    filled = {c: frame[c].fillna(value) if c in frame else value for c, value in fallback.items()}
    crowded = pd.Series(meta.oversubscribed or "", index=frame.index)
    if "source" in frame:
        crowded = crowded.where(frame["source"] != BASELINE, "")
    return frame.assign(**filled, oversubscribed=crowded)


def ok_points(frame: pd.DataFrame) -> pd.DataFrame:
    """Walltime points that finished: the only rows whose times may be compared."""
    points = frame[(frame["kind"] == "point") & (frame["status"] == "ok")]
    return points[points["walltime_ms"].notna() & (points["walltime_ms"] > 0)]


def max_fit(frame: pd.DataFrame) -> pd.DataFrame:
    """Largest N_tokens that fits per (topology, cp), against cp=1 and against the ideal for memory
    growing as N^2 (N growing as sqrt(cp)), with the first N that did not fit (`oom_at`) or that a
    kernel fault stopped (`kernel_fault_at`) and whether its run was oversubscribed. The cp=1 baseline
    is the same whatever the topology."""
    columns = ["topology", "cp", "grid", "max_n", "vs_cp1", "ideal", "note", "oom_at", "kernel_fault_at",
               "oversubscribed", "bound"]  # fmt: skip
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
            "oom_at": best["oom_at"].astype(float).to_numpy() if "oom_at" in best else math.nan,
            "kernel_fault_at": (
                best["kernel_fault_at"].astype(float).to_numpy() if "kernel_fault_at" in best else math.nan
            ),
            "oversubscribed": oversubscribed_rows(best).to_numpy(),
            # the probe stopped short of the edge (the time budget): max_n is a lower bound
            "bound": [_fit_note(r).startswith(LOWER_BOUND) for r in best.itertuples()],
        }
    ).sort_values(["cp", "topology"], ignore_index=True)


def _fit_note(row: Any) -> str:
    """Where the probe stopped: the first N that did not fit (`oom_at`) or that a kernel fault stopped
    (`kernel_fault_at`: no answer about memory), else any note it left."""
    oom_at = getattr(row, "oom_at", None)
    if oom_at is not None and pd.notna(oom_at):
        return f"N={int(oom_at)} does not fit"
    fault_at = getattr(row, "kernel_fault_at", None)
    if fault_at is not None and pd.notna(fault_at):
        return f"kernel fault at N={int(fault_at)}"
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
