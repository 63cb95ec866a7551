"""One run's `## Results`: its rows and readout; rows of several configurations (a rerun into the
same folder with other settings) each get their own table and readout, never compared or mixed."""

from __future__ import annotations

import pandas as pd

from cpbench.record.run_record import RunMetadata
from cpbench.report.sections import rows
from cpbench.report.sections.readout import oversubscribed, readout


def configurations(frame: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    return list(frame.groupby("config_hash", sort=False)) if "config_hash" in frame.columns else []


def lines(frame: pd.DataFrame, meta: RunMetadata) -> list[str]:
    """The rows and readout; with several configurations each block ends in a blank line."""
    out = ["", "## Results", ""]
    if frame.empty:
        return [*out, "No rows.", "", "## Readout", "", readout(frame)]
    configs = configurations(frame)
    if len(configs) <= 1:
        out += rows.table_lines(frame) + rows.error_lines(frame)
        return out + ["", "## Readout", "", readout(frame) + oversubscribed(meta)]
    for config, group in configs:
        seeds = ", ".join(str(s) for s in group["seed"].unique()) if "seed" in group else "?"
        current = " (this run's)" if config == meta.config_hash else ""
        out += [f"### config `{config}`{current}, seed {seeds}", ""]
        out += rows.table_lines(group) + rows.error_lines(group)
        out += ["", "Readout: " + readout(group) + (oversubscribed(meta) if current else ""), ""]
    return out
