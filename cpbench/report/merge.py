"""Merge runs (the job folders of a sweep, or any run folders) into one results.csv, cp_benchmark.md and
plots; runs that failed are listed with their error, also when they measured nothing."""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
from omegaconf import OmegaConf

import cpbench
from cpbench.record import run_record
from cpbench.record.run_record import RunRecord
from cpbench.report.analysis import labelled
from cpbench.report.markdown import render_sweep
from cpbench.report.plots import convergence_png, write_plots
from cpbench.report.sections.runs import RunOutcome
from cpbench.results.folder import RunFolder
from cpbench.results.row import BASELINE, COLUMNS

# Hydra's job folders (hydra.sweep.subdir = ${hydra.job.num}_cp${topology.cp}); also a job that died
# before it wrote anything.
JOB_DIR = re.compile(r"^(\d+)_")
PUBLISHED_CSV = "cp_benchmark.csv"
DOCS_DIR = Path(cpbench.__file__).resolve().parent.parent / "docs"


@dataclass
class MergedRun:
    """One run folder: its rows, metadata and how it ended."""

    name: str
    path: Path
    frame: pd.DataFrame
    record: RunRecord
    failure: dict[str, Any] | None
    in_flight: dict[str, Any] | None
    submitted: dict[str, Any] | None
    stale: int = 0  # rows of an earlier configuration in the same folder, left out
    curve: pd.DataFrame = field(default_factory=pd.DataFrame)  # workflow=convergence: its convergence.csv

    @property
    def cp(self) -> int | None:
        """From run.json, which every run writes first, else from failure.json (a job that failed
        before it started its ranks)."""
        cp = self.record.metadata.cp
        cp = (self.failure or {}).get("cp") if cp is None else cp
        return None if cp is None else int(cp)

    @property
    def topology(self) -> str:
        if not self.frame.empty:
            return str(self.frame["topology"].iloc[0])
        return self.record.metadata.topology or ""

    @property
    def error(self) -> str:
        """Empty for a run that finished; else why not, in one line."""
        if self.failure:  # its first line; failure.json keeps the rest
            return (str(self.failure.get("error") or "failed").strip().splitlines() or ["failed"])[0]
        if self.in_flight:
            return (
                f"stopped while measuring N={self.in_flight.get('N_tokens')}: killed, or still running "
                "(run it again to resume)"
            )
        if self.frame.empty and self.curve.empty:
            if self.submitted:
                return (
                    f"no results yet from {self.submitted.get('cluster')} job {self.submitted.get('job_id')}"
                )
            return "no results: the job ended before measuring anything"
        return ""

    def outcome(self) -> RunOutcome:
        ok = int((self.frame["status"] == "ok").sum()) if not self.frame.empty else 0
        return RunOutcome(
            self.name,
            self.topology,
            self.cp,
            len(self.frame),
            ok,
            self.error,
            self.stale,
            self.record.metadata,
        )


def _job_order(path: Path) -> tuple[int, str]:
    match = JOB_DIR.match(path.name)
    return (int(match.group(1)) if match else 1 << 30, path.name)


def _jobs(folder: Path) -> list[Path]:
    """The run folders inside a sweep folder, in job order (none: not a sweep)."""
    children = (
        c for c in folder.iterdir() if c.is_dir() and (JOB_DIR.match(c.name) or RunFolder(c).is_run())
    )
    return sorted(children, key=_job_order)


def discover(dirs: Sequence[Path]) -> list[tuple[str, Path]]:
    """(name, folder) of every run: a sweep folder gives its job folders in job order, a run folder
    itself."""
    found: list[tuple[str, Path]] = []
    for given in dirs:
        folder = Path(given)
        if not folder.is_dir():
            raise FileNotFoundError(f"{folder}: no such folder")
        jobs = _jobs(folder)
        prefix = f"{folder.resolve().name}/" if len(dirs) > 1 else ""
        if jobs:
            found += [(prefix + job.name, job) for job in jobs]
        elif RunFolder(folder).is_run():
            found.append((folder.resolve().name, folder))
        else:
            raise ValueError(
                f"{folder}: neither a run folder (results.csv, run.json) nor a sweep of run folders"
            )
    names = [name for name, _ in found]
    return [(f"{name}#{i}" if names.count(name) > 1 else name, path) for i, (name, path) in enumerate(found)]


def load(name: str, path: Path) -> MergedRun:
    """A run folder's rows of its current configuration (run.json's config hash): rows an earlier run
    in the same folder measured under other settings are not like-for-like, and are left out."""
    folder = RunFolder(path)
    record = run_record.read(folder)
    frame, config = folder.read_results(), record.metadata.config_hash
    stale = 0
    if config and "config_hash" in frame.columns:
        current = frame["config_hash"] == config
        frame, stale = frame[current].reset_index(drop=True), int((~current).sum())
    return MergedRun(
        name=name,
        path=path,
        frame=labelled(frame, record.metadata),
        record=record,
        failure=folder.read_failure(),
        in_flight=folder.point_in_flight.row(),
        submitted=folder.read_json(folder.submitted),
        stale=stale,
        curve=folder.read_convergence(),
    )


def combine(runs: Sequence[MergedRun]) -> pd.DataFrame:
    """Every row of every run, in run order, with a `run` column naming its folder."""
    frames = [run.frame.assign(run=run.name) for run in runs if not run.frame.empty]
    if not frames:
        return pd.DataFrame(columns=[*COLUMNS, "run"])
    frame = pd.concat(frames, ignore_index=True)
    if "source" in frame.columns:  # every CP job of a sweep carries the one cp=1 baseline: keep it once
        same = [c for c in frame.columns if c not in ("config_hash", "run")]
        copies = (frame["source"] == BASELINE) & frame.duplicated(subset=same)
        frame = frame[~copies].reset_index(drop=True)
    extras = [c for c in frame.columns if c not in COLUMNS and c != "run"]
    return frame[[c for c in COLUMNS if c in frame.columns] + extras + ["run"]]


def sweep_command(folder: Path) -> str | None:
    """The command line that made a sweep folder, from the multirun.yaml Hydra keeps there."""
    path = Path(folder) / "multirun.yaml"
    if not path.exists():
        return None
    overrides = OmegaConf.load(path).hydra.overrides
    args = [a for a in overrides.hydra if a != "hydra.mode=MULTIRUN"] + list(overrides.task)
    return shlex.join(["python", "-m", "cpbench", "-m", *args])


@dataclass
class Merged:
    runs: list[MergedRun]
    frame: pd.DataFrame
    commands: list[str]
    report: Path | None = None

    @property
    def failed(self) -> list[MergedRun]:
        return [run for run in self.runs if run.error]


def collect(dirs: Sequence[Path]) -> Merged:
    runs = [load(name, path) for name, path in discover(dirs)]
    commands = [c for c in (sweep_command(Path(d)) for d in dirs) if c]
    return Merged(runs, combine(runs), commands)


def overlapping(runs: Sequence[MergedRun]) -> list[tuple[str, str, str]]:
    """Pairs of runs (and their host) whose start (`date`) to end (`finished`) spans overlap on one host:
    they shared its devices or cores, so their walltimes do not compare."""
    spans = [
        (run.name, meta.host, meta.date, run.record.finished)
        for run in runs
        if None not in ((meta := run.record.metadata).host, meta.date, run.record.finished)
    ]  # the timestamps are UTC "%Y-%m-%d %H:%M:%S": they order as text
    return [
        (a[0], b[0], a[1])
        for i, a in enumerate(spans)
        for b in spans[i + 1 :]
        if a[1] == b[1] and a[2] < b[3] and b[2] < a[3]
    ]


def write(
    merged: Merged,
    out_dir: Path,
    csv_name: str = RunFolder.RESULTS,
    title: str = "cpbench: CP sweep",
    note: str = "",
) -> Path:
    """The merged CSV, the plots and the markdown that links both, side by side in `out_dir`."""
    if any(out_dir.resolve() == run.path.resolve() for run in merged.runs):
        raise ValueError(f"{out_dir}: is one of the runs merged; write the merge elsewhere (--out)")
    out_dir.mkdir(parents=True, exist_ok=True)
    out = RunFolder(out_dir)
    out.write_text(out_dir / csv_name, merged.frame.to_csv(index=False))
    plots = write_plots(merged.frame, out_dir)
    if merged.commands:
        made = "Measured with " + "; ".join(f"`{c}`" for c in merged.commands) + "."
        note = f"{note}\n\n{made}" if note else made
    for a, b, host in overlapping(merged.runs):
        clash = f"`{a}` and `{b}` ran at the same time on {host}: their walltimes do not compare."
        note = f"{note}\n\n{clash}" if note else clash
    if curves := _write_curves(merged.runs, out):
        note = f"{note}\n\n{curves}" if note else curves
    text = render_sweep(merged.frame, [run.outcome() for run in merged.runs], plots, csv_name, title, note)
    merged.report = out.report
    out.write_text(merged.report, text)
    return merged.report


def _write_curves(runs: Sequence[MergedRun], out: RunFolder) -> str:
    """The convergence curves of every run side by side (convergence.csv with a `run` column, one plot),
    and a sentence with each run's comparison with its reference; empty without curves."""
    with_curves = [run for run in runs if not run.curve.empty]
    if not with_curves:
        return ""
    out.write_convergence(pd.concat([run.curve.assign(run=run.name) for run in with_curves]))
    convergence_png(
        {f"{run.name} ({run.topology} cp={run.cp})": run.curve for run in with_curves}, out.convergence_plot
    )
    said = [f"{run.name}: {_compared(run.record)}" for run in with_curves]
    return (
        f"Convergence curves of {len(with_curves)} run(s) in [{out.CONVERGENCE}]({out.CONVERGENCE}), "
        f"plotted in [{out.CONVERGENCE_PLOT}]({out.CONVERGENCE_PLOT}); against the reference: "
        + "; ".join(said)
        + "."
    )


def _compared(record: RunRecord) -> str:
    convergence = record.convergence
    return convergence.summary if convergence and convergence.summary is not None else "no reference curve"


def default_out(dirs: Sequence[Path]) -> Path | None:
    """A single sweep folder holds its own merge; anything else needs a place to be named."""
    if len(dirs) == 1 and Path(dirs[0]).is_dir() and _jobs(Path(dirs[0])):
        return Path(dirs[0])
    return None


def merge(dirs: Sequence[Path], out_dir: Path | None = None) -> Merged:
    """Collect the runs under `dirs` and write their merge to `out_dir` (default: the one sweep folder)."""
    out_dir = out_dir or default_out(dirs)
    if out_dir is None:
        raise ValueError("several folders, or a run folder, were given: name where the merge goes (--out)")
    merged = collect(dirs)
    write(merged, out_dir)
    return merged


def publish(dirs: Sequence[Path], docs_dir: Path = DOCS_DIR) -> Merged:
    """docs/cp_benchmark.md with cp_benchmark.csv and the plots beside it, labelled with the hardware
    (results on CPU say they stand in until GPU results replace them)."""
    merged = collect(dirs)
    metas = [run.record.metadata for run in merged.runs if run.record.metadata.recorded()]
    on_cpu = bool(metas) and all(m.on_cpu for m in metas)
    sources = ", ".join(f"`{Path(d).name}`" for d in dirs)
    note = (
        f"Published with `python -m cpbench.report <dirs> --publish` from {sources}; "
        f"the runs' metadata is at the end."
    )
    if on_cpu:
        note += (
            " These numbers come from CPU ranks (gloo) on a small machine: they show the shape of the "
            "report and of the CP curve, not GPU performance, and stand until GPU results replace them."
        )
    write(merged, docs_dir, csv_name=PUBLISHED_CSV, title="cpbench: published CP benchmark", note=note)
    return merged
