"""cp_benchmark.md, as its sections in order: one run's report (written by the driver) and a sweep's
merged report. Each section renders itself (`cpbench.report.sections`); rows that measure different
things (another preset or sizes, workflow, dtype, device or memory cap) are never put side by side."""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from cpbench.record.run_record import RunRecord
from cpbench.report.analysis import like_for_like
from cpbench.report.sections import (
    capacity,
    efficiency,
    footprint,
    memory_cap,
    plot_links,
    repeat_check,
    results,
    rows,
    run_metadata,
    runs,
    time_budget,
    walltime,
    what_changed,
)
from cpbench.report.sections.readout import oversubscribed_runs, readout
from cpbench.results.folder import RunFolder


def render(
    frame: pd.DataFrame,
    record: RunRecord,
    title: str = "cpbench results",
    plots: dict[str, str] | None = None,
) -> str:
    """One run's report, with the plots of its current configuration ({alt text: file})."""
    meta = record.metadata
    lines = [f"# {title}", "", *run_metadata.run_lines(meta)]
    lines += memory_cap.lines(meta.memory)
    lines += what_changed.lines(frame, record.what_changed)
    lines += time_budget.lines(record.time_budget)
    lines += footprint.lines(record.footprint)
    lines += results.lines(frame, meta)
    if frame.empty:
        return "\n".join([*lines, ""])
    links = plot_links.lines(plots or {})
    if len(results.configurations(frame)) > 1:  # its last block ends in a blank line already
        links = links[1:]
    else:
        lines += efficiency.lines(frame, {"": meta})
    return "\n".join([*lines, *repeat_check.lines(record.repeat_check), *links, ""])


def render_sweep(
    frame: pd.DataFrame,
    outcomes: Sequence[runs.RunOutcome],
    plots: dict[str, str],
    csv_name: str = RunFolder.RESULTS,
    title: str = "cpbench: CP sweep",
    note: str = "",
) -> str:
    """The merged report of several runs (a sweep's jobs): per like-for-like group the CP curve (max N
    vs cp, walltime vs N per cp), its readout, the plots, the failed runs, every run's metadata."""
    metas = [o.metadata for o in outcomes]
    finished = sum(not o.error for o in outcomes)
    lines = [f"# {title}", "", f"Hardware: {run_metadata.hardware(metas)}.", ""]
    lines += [note, ""] if note else []
    lines += [
        f"{len(frame)} row(s) from {len(outcomes)} run(s), {finished} finished; "
        f"every row is in [{csv_name}]({csv_name}).",
        "",
        *runs.lines(outcomes),
        *plot_links.lines(plots),
    ]
    for label, group in like_for_like(frame):
        lines += ["", f"## {label}", "", "### Readout", "", readout(group) + oversubscribed_runs(group)]
        lines += efficiency.lines(group, {o.name: o.metadata for o in outcomes})
        lines += capacity.lines(group) + walltime.lines(group)
    lines += run_metadata.runs_table([o.name for o in outcomes], metas)
    lines += ["", "## All rows", ""]
    lines += rows.table_lines(frame, extra=["run"]) if not frame.empty else ["No rows."]
    lines += rows.error_lines(frame, with_run=True)
    return "\n".join(lines) + "\n"
