"""Check results against cpbench's rules: one verdict per rule (pass, fail, or n/a when the rule's
inputs are absent), for run folders, sweep folders or a published report (docs/cp_benchmark.md with
the cp_benchmark.csv beside it). `python -m cpbench.check DIR...` exits 0 only if no rule fails."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from cpbench.checks import reference_curve
from cpbench.measure.convergence import compare
from cpbench.record import run_record
from cpbench.record.run_record import RunMetadata, RunRecord
from cpbench.report import merge
from cpbench.report.analysis import NOISY_IQR, noisy
from cpbench.report.sections.run_metadata import LABELS
from cpbench.results.folder import RunFolder
from cpbench.results.paths import RunPaths
from cpbench.results.store import read_results

MIN_WARMUP = 1  # discarded steps before the timed ones
MIN_REPEATS = 3  # timed steps: the median and IQR of fewer say little
REQUIRED_META = ("device", "clocks_locked", "devices_shared", "budget_gib")
LIKE_FOR_LIKE = ("workload", "workflow", "dtype")
CHECKSUM_RTOL = 1e-6  # same configuration and point: the same output, up to printing digits
NOISY_MARK = "ok, noisy"


@dataclass
class RunUnderCheck:
    """What the rules read of one run."""

    name: str
    frame: pd.DataFrame  # its results rows (empty: none)
    record: RunRecord
    folder: RunFolder | None  # None: a run known only from a published report
    report: str = ""  # the markdown that shows its rows


@dataclass
class RuleVerdict:
    rule: str
    status: str  # pass | fail | n/a
    detail: str

    def line(self) -> str:
        return f"{self.status.upper():4}  {self.rule}: {self.detail}"


@dataclass
class Results:
    """Everything given to the check: runs, and the files of each folder given."""

    runs: list[RunUnderCheck]
    folders: list[Path] = field(default_factory=list)  # run and sweep folders (not published reports)


def _published(md: Path) -> list[RunUnderCheck]:
    """The runs of a published report: its CSV's rows by run, and its metadata table read back."""
    frame = read_results(md.with_name(merge.PUBLISHED_CSV))
    text = md.read_text()
    labels = {label: key for key, label in LABELS.items()}
    metas: dict[str, dict[str, Any]] = {}
    section = text.split("## Run metadata", 1)[1].split("\n## ", 1)[0] if "## Run metadata" in text else ""
    rows = [line for line in section.splitlines() if line.startswith("|")]
    if rows:
        names = [c.strip() for c in rows[0].strip("|").split("|")][1:]
        metas = {name: {} for name in names}
        for line in rows[2:]:
            label, *cells = [c.strip() for c in line.strip("|").split("|")]
            for name, cell in zip(names, cells, strict=False):
                metas[name][labels.get(label, label)] = cell
    runs = frame.groupby("run", sort=False) if "run" in frame.columns else [(md.stem, frame)]
    return [
        RunUnderCheck(
            str(name),
            rows.drop(columns="run", errors="ignore"),
            _read_back(metas.get(str(name), {})),
            None,
            text,
        )
        for name, rows in runs
    ]


def _read_back(cells: dict[str, str]) -> RunRecord:
    """A published run's metadata from its column of the table: each figure as its cell's text."""
    return RunRecord(metadata=RunMetadata.from_json(cells))


def collect(paths: Sequence[Path]) -> Results:
    """Raises FileNotFoundError or ValueError for a path that holds no results."""
    results = Results([])
    for path in map(Path, paths):
        if path.is_file() and path.suffix == ".md":
            results.runs += _published(path)
            continue
        for name, run_dir in merge.discover([path]):
            folder = RunFolder(run_dir)
            report = folder.report.read_text() if folder.report.exists() else ""
            results.runs.append(
                RunUnderCheck(name, folder.read_results(), run_record.read(folder), folder, report)
            )
        results.folders.append(path)
    return results


def _timed(frame: pd.DataFrame) -> pd.DataFrame:
    if frame.empty or "kind" not in frame.columns:
        return frame.iloc[0:0]
    return frame[(frame["kind"] == "point") & (frame["status"] == "ok")]


def rule_repeats(results: Results) -> RuleVerdict:
    rule = f"warm-up >= {MIN_WARMUP} and repeats >= {MIN_REPEATS}"
    timed = [(run.name, _timed(run.frame)) for run in results.runs]
    timed = [(name, rows) for name, rows in timed if not rows.empty]
    if not timed:
        return RuleVerdict(rule, "n/a", "no timed point")
    short = [f"{name} N={r.N_tokens} (warm-up {r.warmup}, repeats {r.repeats})" for name, rows in timed
             for r in rows.itertuples() if r.warmup < MIN_WARMUP or r.repeats < MIN_REPEATS]  # fmt: skip
    if short:
        return RuleVerdict(rule, "fail", f"{len(short)} point(s) below: " + "; ".join(short[:5]))
    return RuleVerdict(rule, "pass", f"{sum(len(rows) for _, rows in timed)} timed point(s)")


def _lacking(meta: RunMetadata) -> list[str]:
    recorded = dict(meta.recorded())
    return [name for name in REQUIRED_META if name not in recorded]


def rule_metadata(results: Results) -> RuleVerdict:
    rule = "metadata complete (" + ", ".join(REQUIRED_META) + ")"
    if not results.runs:
        return RuleVerdict(rule, "n/a", "no run")
    lacking = [(run.name, _lacking(run.record.metadata)) for run in results.runs]
    missing = [f"{name}: {', '.join(names)}" for name, names in lacking if names]
    if missing:
        return RuleVerdict(rule, "fail", "missing " + "; ".join(missing))
    return RuleVerdict(rule, "pass", f"{len(results.runs)} run(s)")


def rule_like_for_like(results: Results) -> RuleVerdict:
    rule = "like-for-like (one " + ", ".join(LIKE_FOR_LIKE) + " and config per run)"
    runs = [run for run in results.runs if not run.frame.empty]
    if not runs:
        return RuleVerdict(rule, "n/a", "no results rows")
    mixed = []
    for run in runs:
        for column in (*LIKE_FOR_LIKE, "config_hash"):
            values = sorted(set(run.frame[column].dropna().astype(str))) if column in run.frame else []
            if len(values) > 1:
                mixed.append(f"{run.name} mixes {column} {', '.join(values)}")
    if mixed:
        return RuleVerdict(rule, "fail", "; ".join(mixed))
    return RuleVerdict(rule, "pass", f"{len(runs)} run(s), each of one configuration")


def rule_noise(results: Results) -> RuleVerdict:
    rule = f"noisy points flagged (IQR over {NOISY_IQR:.0%} of the median)"
    runs = [(run, int(noisy(run.frame).sum())) for run in results.runs if not _timed(run.frame).empty]
    if not runs:
        return RuleVerdict(rule, "n/a", "no timed point")
    unflagged = []
    for run, count in runs:
        table = run.report.split("## All rows", 1)[-1] if run.report else ""
        # A published report shows every run's rows in one table: each row names its run.
        flagged = sum(1 for line in table.splitlines() if f"| {NOISY_MARK} |" in line
                      and (run.folder is not None or line.startswith(f"| {run.name} |")))  # fmt: skip
        if flagged < count:
            unflagged.append(f"{run.name}: {count} noisy, {flagged} flagged in its report")
    if unflagged:
        return RuleVerdict(rule, "fail", "; ".join(unflagged))
    total = sum(count for _, count in runs)
    return RuleVerdict(rule, "pass", f"{total} noisy point(s), each flagged")


def rule_same_answer(results: Results) -> RuleVerdict:
    rule = f"same answer twice (checksums of a repeated point within rtol {CHECKSUM_RTOL:g})"
    rows = [run.frame.assign(_run=run.name) for run in results.runs if not _timed(run.frame).empty]
    frame = _timed(pd.concat(rows, ignore_index=True)) if rows else pd.DataFrame()
    if frame.empty or "checksum" not in frame.columns:
        return RuleVerdict(rule, "n/a", "no repeated run")
    # A run's cp=1 baseline rows carry the run's config hash: the topology tells them apart.
    identity = (
        "config_hash",
        "topology",
        "cp",
        "grid",
        "N_tokens",
        "N_atoms",
        "MSA_depth",
        "diffusion_samples",
    )
    key = [c for c in identity if c in frame]
    groups = [g for _, g in frame.dropna(subset=["checksum"]).groupby(key, dropna=False) if len(g) > 1]
    if not groups:
        return RuleVerdict(rule, "n/a", "no point measured twice under one configuration")
    differ = [f"N={g['N_tokens'].iloc[0]} ({', '.join(map(str, g['_run']))}): {list(g['checksum'])}"
              for g in groups if not np.allclose(g["checksum"], g["checksum"].iloc[0], rtol=CHECKSUM_RTOL,
                                                 atol=0)]  # fmt: skip
    if differ:
        return RuleVerdict(rule, "fail", "checksums differ: " + "; ".join(differ))
    return RuleVerdict(rule, "pass", f"{len(groups)} repeated point(s) agree")


def rule_convergence(results: Results) -> RuleVerdict:
    rule = "convergence within tolerance of the reference"
    checked, failed = [], []
    for run in results.runs:
        if run.folder is None or not run.folder.convergence.exists():
            continue
        summary = run.record.convergence
        given = summary.reference if summary else None
        path = Path(given) if given else reference_curve.find(summary.curve_key if summary else "")
        if path is None or not path.exists():
            continue
        rtol = summary.rtol if summary and summary.rtol is not None else 1e-4
        atol = summary.atol if summary and summary.atol is not None else 1e-6
        comparison = compare(pd.read_csv(run.folder.convergence), pd.read_csv(path), rtol, atol)
        (checked if comparison.match else failed).append(f"{run.name} vs {path.name}: {comparison.line()}")
    if failed:
        return RuleVerdict(rule, "fail", "; ".join(failed))
    if not checked:
        return RuleVerdict(rule, "n/a", "no convergence curve with a reference")
    return RuleVerdict(rule, "pass", "; ".join(checked))


def _allowed() -> set[str]:
    """Every name a run or sweep folder may hold: RunPaths's names (the files, the plots, the lock files),
    and Hydra's record of a sweep."""
    return {v for k, v in vars(RunPaths).items() if k.isupper() and isinstance(v, str)} | {"multirun.yaml"}


def rule_stray_files(results: Results) -> RuleVerdict:
    rule = "no stray files"
    if not results.folders:
        return RuleVerdict(rule, "n/a", "a published report: its folder holds other documents")
    allowed, stray = _allowed(), []
    for given in results.folders:
        jobs = {path.resolve() for _, path in merge.discover([given])} - {given.resolve()}
        for folder in [given, *jobs]:
            stray += [str(p) for p in folder.iterdir() if p.name not in allowed and p.resolve() not in jobs]
    if stray:
        return RuleVerdict(rule, "fail", f"{len(stray)} unknown: " + ", ".join(sorted(stray)[:5]))
    return RuleVerdict(rule, "pass", f"{len(results.folders)} folder(s)")


RULES: tuple[Callable[[Results], RuleVerdict], ...] = (
    rule_repeats,
    rule_metadata,
    rule_like_for_like,
    rule_noise,
    rule_same_answer,
    rule_convergence,
    rule_stray_files,
)


def check(paths: Sequence[Path]) -> list[RuleVerdict]:
    results = collect(paths)
    return [rule(results) for rule in RULES]


def passed(verdicts: Sequence[RuleVerdict]) -> bool:
    return all(v.status != "fail" for v in verdicts)
