"""A plan's outputs: experiments.csv (one row per experiment of the plan), experiments.md (the table
a person reads, with the plan and the noise rule) and one plot of each walltime change with its
confidence interval."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from cpbench.report.cells import cell, table
from cpbench.results.folder import RunFolder

COLUMNS = [
    "id", "change", "priority", "rationale", "group", "after", "only_if", "ran_on", "applied", "verdict",
    "judged_on", "N_tokens", "walltime_ms", "ref_walltime_ms", "walltime_change_pct", "ci_low_pct",
    "ci_high_pct", "drift_pct", "first_step_ms", "ref_first_step_ms", "first_step_change_pct",
    "peak_mem_gib", "ref_peak_mem_gib", "peak_mem_change_pct", "max_n", "ref_max_n", "note", "run",
    "references",
]  # fmt: skip
_COLOURS = {"better": "tab:green", "worse": "tab:red", "within noise": "0.45"}


def _num(value: object, fmt: str) -> str:
    return "" if value is None or pd.isna(value) else format(value, fmt)


def _walltime(row: pd.Series) -> str:
    if pd.isna(row["walltime_change_pct"]):
        return ""
    return f"{row['walltime_change_pct']:+.1f} [{row['ci_low_pct']:+.1f}, {row['ci_high_pct']:+.1f}]"


def _against(value: object, reference: object, fmt: str) -> str:
    mine = _num(value, fmt)
    return f"{mine} ({_num(reference, fmt)})" if mine and _num(reference, fmt) else mine


def plot_changes(frame: pd.DataFrame, path: Path) -> Path | None:
    """Each measured experiment's walltime change with its interval, coloured by verdict; None when no
    experiment was judged on walltime."""
    shown = frame[frame["walltime_change_pct"].notna()]
    if shown.empty:
        return None
    from matplotlib.figure import Figure  # here: matplotlib is start-up time for ranks that never draw

    fig = Figure(figsize=(7.0, 1.2 + 0.45 * len(shown)), layout="constrained")
    ax = fig.subplots()
    ys = list(range(len(shown)))[::-1]
    for y, (_, row) in zip(ys, shown.iterrows(), strict=True):
        pct, low, high = row["walltime_change_pct"], row["ci_low_pct"], row["ci_high_pct"]
        ax.errorbar(pct, y, xerr=[[pct - low], [high - pct]], fmt="o", capsize=4,
                    color=_COLOURS.get(row["verdict"], "k"))  # fmt: skip
    ax.axvline(0, color="k", lw=0.8)
    ax.set_yticks(ys, [f"{i} ({v})" for i, v in zip(shown["id"], shown["verdict"], strict=True)])
    ax.set_xlabel("walltime change % vs its reference (median, 95% CI); negative is faster")
    ax.grid(alpha=0.3, axis="x")
    fig.savefig(path, dpi=110)
    return path


def render(frame: pd.DataFrame, title: str, intro: Sequence[str], plot: str | None) -> str:
    """experiments.md from the rows of experiments.csv."""
    header = ["id", "change", "priority", "rationale", "walltime change % [95% CI]", "first step ms (ref)",
              "peak GiB (ref)", "max N (ref)", "verdict", "ran on"]  # fmt: skip
    rows = [
        [
            r["id"],
            f"`{r['change']}`",
            r["priority"],
            r["rationale"],
            _walltime(r),
            _against(r["first_step_ms"], r["ref_first_step_ms"], ".1f"),
            _against(r["peak_mem_gib"], r["ref_peak_mem_gib"], ".3f"),
            _against(r["max_n"], r["ref_max_n"], ".0f"),
            r["verdict"],
            r["ran_on"],
        ]  # fmt: skip
        for _, r in frame.iterrows()
    ]
    lines = [f"# {title}", "", *intro, "", *table(header, [[cell(c) for c in row] for row in rows])]
    noted = frame[frame["note"].fillna("") != ""]
    notes = [f"- {r['id']}: {r['note']}" for _, r in noted.iterrows()]
    if notes:
        lines += ["", "Notes:", "", *notes]
    if plot:
        lines += ["", f"![walltime change per experiment]({plot})"]
    return "\n".join(lines) + "\n"


def write_experiments(folder: RunFolder, rows: Sequence[dict], title: str, intro: Sequence[str]) -> None:
    """Write experiments.csv, the plot and experiments.md, each atomically (rewritten as the plan goes)."""
    frame = pd.DataFrame(list(rows)).reindex(columns=COLUMNS)
    folder.write_text(folder.experiments_csv, frame.to_csv(index=False))
    plot = plot_changes(frame, folder.experiments_png)
    if plot is None:
        folder.experiments_png.unlink(missing_ok=True)
    name = folder.experiments_png.name if plot else None
    folder.write_text(folder.experiments_md, render(frame, title, intro, name))
