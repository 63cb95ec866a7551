"""One run folder's report: cp_benchmark.md from results.csv and run.json, with the plots of the run's
current configuration beside it (the merge of many runs is merge.py)."""

from __future__ import annotations

from pathlib import Path

from cpbench.record import run_record
from cpbench.report.analysis import labelled
from cpbench.report.markdown import render
from cpbench.report.plots import drawn_plots, write_plots
from cpbench.results.folder import RunFolder


def write_report(output_dir: Path, plots: bool = True, redraw: bool = True) -> Path:
    """Render `cp_benchmark.md` and its plots in `output_dir`; rows an earlier run in the folder measured
    under other settings (another config hash) keep their table but stay out of the plots. Without
    `plots`, the markdown alone (a launching process that may fork ranks afterwards draws nothing).
    Without `redraw`, the plots already beside the report are linked as they are: for a caller that
    changed run.json but no row since the run drew them (drawing costs a second of CPU)."""
    folder = RunFolder(output_dir)
    record = run_record.read(folder)
    frame = labelled(folder.read_results(), record.metadata)
    current, config = frame, record.metadata.config_hash
    if config and "config_hash" in frame.columns:
        current = frame[frame["config_hash"] == config]
    drawn = {}
    if plots:
        drawn = write_plots(current, folder.root) if redraw else drawn_plots(folder.root)
    folder.write_text(folder.report, render(frame, record, plots=drawn))
    return folder.report
