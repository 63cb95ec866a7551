"""A like-for-like group's max N_tokens that fits at each CP size, against cp=1 and the sqrt(cp) ideal."""

from __future__ import annotations

import pandas as pd

from cpbench.report.analysis import max_fit
from cpbench.report.cells import table


def lines(group: pd.DataFrame) -> list[str]:
    fits = max_fit(group)
    out = ["", "### Max N_tokens that fits vs cp", ""]
    if fits.empty:
        return [*out, "No max-fit rows: the max-token probe did not run (probe.enabled=true runs it)."]
    return out + table(
        ["topology", "cp", "grid", "max N_tokens", "vs cp=1", "ideal sqrt(cp)", "probe stopped at"],
        [
            (r.topology, r.cp, r.grid, r.max_n, "" if pd.isna(r.vs_cp1) else f"{r.vs_cp1:.2f}x",
             f"{r.ideal:.2f}x", r.note)
            for r in fits.itertuples()
        ],
    )  # fmt: skip
