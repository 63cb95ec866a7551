"""A like-for-like group's walltime vs N, one column per CP size, and the share of it in collectives."""

from __future__ import annotations

import pandas as pd

from cpbench.report.analysis import comm_share, walltime_table
from cpbench.report.cells import table


def _series_label(topology: str, cp: int, grid: str, grids: bool) -> str:
    return f"{topology} cp={cp}" + (f" ({grid})" if grids else "")


def lines(group: pd.DataFrame) -> list[str]:
    walltimes = walltime_table(group)
    out = ["", "### Walltime (ms, median over repeats of the slowest rank) vs N per cp", ""]
    if walltimes.empty:
        return [*out, "No point finished."]
    columns = walltimes.columns
    grids = columns.get_level_values(2).nunique() > columns.droplevel(2).nunique()
    header = ["N_tokens", "N_atoms", "MSA"] + [_series_label(t, c, g, grids) for t, c, g in columns]
    rows = [
        (*index, *(f"{v:.4g}" if pd.notna(v) else "" for v in values))
        for index, values in walltimes.iterrows()
    ]
    out += table(header, rows)
    shares = comm_share(group)
    if not shares.empty:
        out += ["", "Share of walltime in collectives (median over points): "]
        out[-1] += ", ".join(f"{r.topology} cp={r.cp}: {r.share:.0%}" for r in shares.itertuples()) + "."
    return out
