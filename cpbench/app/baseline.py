"""The cp=1 baseline beside a CP run: the same workload on one rank under the same per-rank budget,
so the readout can say how much larger an input CP fits and at what walltime cost.

It runs once per configuration in a cache folder inside the run's `output_dir` (a sweep's: inside the
sweep folder), `baseline/<key>/`, a run folder of its own, so a run still writes in one place. The key
hashes every setting that changes the cp=1 answer (workload, workflow, dtype, shapes and sweep, probe,
timing, memory, seed, the topology's kind, ...) and none that does not (cp and grid, output_dir,
logging, launch, SLURM). A later run at another cp into the same folder, and every job of a CP sweep,
reuse it. Its rows are copied into the run's results.csv with `source=baseline`. In mode=accuracy it is
also the reference each point is checked against."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from cpbench.app.outcome import close_failed
from cpbench.app.peak_holders import record_peak_holders
from cpbench.launch.base import Notify, RankFailure, ShapeDoesNotFit
from cpbench.launch.local import LocalLauncher, LocalSettings
from cpbench.rank import RunSpec, walltime_points
from cpbench.record import run_record
from cpbench.report.single import write_report
from cpbench.results import lock
from cpbench.results.folder import RunFolder
from cpbench.results.row import BASELINE, shape_key
from cpbench.settings.cp1 import cp1_settings
from cpbench.settings.identity import baseline_key, config_hash
from cpbench.settings.schema import BenchConfig, Mode, Workflow


def baseline_settings(settings: BenchConfig) -> BenchConfig | None:
    """The baseline's settings (`cp1_settings`), or None when the run has none: in speed mode, it is
    off or the run is itself cp=1. mode=accuracy always has one: its points are checked against it.
    (Only a launcher that starts runs from this process starts it: `Launcher.starts_runs`.)"""
    if settings.mode is not Mode.accuracy and (not settings.baseline or settings.topology.cp == 1):
        return None
    return cp1_settings(settings)


def compared(settings: BenchConfig) -> bool:
    """Whether the baseline's rows go into the run's results and readout (a CP run with baseline on)."""
    return settings.baseline and settings.topology.cp > 1


def cache_key(settings: BenchConfig) -> str:
    """The hash of every setting that changes the cp=1 answer: those of `cp1_settings`."""
    return baseline_key(cp1_settings(settings))


def cache_folder(settings: BenchConfig, root: Path) -> RunFolder:
    """Where the baseline of `settings` lives: `<root>/baseline/<key>` (root: the run's output_dir,
    or the sweep folder)."""
    return RunFolder(root).baseline_run(cache_key(settings))


def _complete(folder: RunFolder, base: BenchConfig) -> bool:
    """Every walltime point has a row, the probe (when on) its max-fit row, and the run did not fail;
    a convergence baseline, its curve's every step; a refused plan, its refusal (it stays refused)."""
    if folder.read_failure() is not None:
        return False
    if refusal(folder):
        return True
    if base.workflow is Workflow.convergence:
        return len(folder.read_convergence()) >= base.convergence.steps
    done = folder.done_keys(config_hash(base))
    points = walltime_points(base)
    if any(shape_key("point", s) not in done for s in points):
        return False
    return not base.probe.enabled or any(key.startswith("max-fit:") for key in done)


@dataclass(frozen=True)
class Baseline:
    """The baseline a run is compared with: its folder (None: the run has none, or it failed) and the
    seconds this command spent measuring it (0 from the cache), which the run's time budget loses."""

    folder: RunFolder | None
    seconds: float = 0.0


def run_baseline(settings: BenchConfig, root: Path, notify: Notify) -> Baseline:
    """Measure the baseline of `settings` in its cache folder unless it is there already (a run that
    stopped part-way resumes), as one rank in its own process (the local launcher's); its folder is
    None when the run has no baseline or it failed (the CP run goes on without it)."""
    base = baseline_settings(settings)
    if base is None:
        return Baseline(None)
    folder = cache_folder(settings, root)
    if _complete(folder, base):
        print(f"cpbench: cp=1 baseline from the cache: {folder.root}", file=sys.stderr)
        return Baseline(folder)
    began = time.monotonic()
    print(f"cpbench: measuring the cp=1 baseline first -> {folder.root}", file=sys.stderr)
    with lock.hold(folder):
        folder.clear_failure()
        try:
            alone = LocalSettings(1, base.launch.max_restarts, in_process=False, backend=base.dist.backend)
            spec = RunSpec(settings=base, output_dir=str(folder.root))
            LocalLauncher(alone).start(spec, None, notify)
        except ShapeDoesNotFit as failure:  # what CP is for: the CP run may fit it
            close_failed(folder, 1, "oom", failure.message)
            print(f"cpbench: the cp=1 baseline: {failure.message}; going on without it", file=sys.stderr)
            return Baseline(None, time.monotonic() - began)
        except RankFailure as failure:
            close_failed(folder, 1, "crashed" if failure.crashed else "error", str(failure))
            print(f"cpbench: the cp=1 baseline failed ({failure}); going on without it", file=sys.stderr)
            return Baseline(None, time.monotonic() - began)
        if base.probe.enabled:
            record_peak_holders(folder, base, spec.topology)
            write_report(folder.root)
    return Baseline(folder, time.monotonic() - began)


def refusal(folder: RunFolder) -> str | None:
    """The time budget's refusal of a run's plan (nothing was measured), or None."""
    planned = run_record.read(folder).time_budget
    return planned.refusal if planned is not None else None


def baseline_rows(folder: RunFolder, settings: BenchConfig) -> pd.DataFrame:
    """The baseline's rows for a run of `settings`: those of its configuration, marked
    `source=baseline` and carrying the run's config hash (they belong to its report)."""
    base = baseline_settings(settings)
    frame = folder.read_results()
    if base is None or frame.empty:
        return frame.iloc[0:0]
    rows = frame[frame["config_hash"] == config_hash(base)].copy()
    return rows.assign(source=BASELINE, config_hash=config_hash(settings))


def attach_baseline(run: RunFolder, settings: BenchConfig, root: Path, notify: Notify) -> Baseline:
    """Run (or find) the baseline of `settings` and put its rows into `run`'s results.csv, replacing
    any it held."""
    baseline = run_baseline(settings, root, notify)
    if baseline.folder is not None and compared(settings):
        run.set_baseline(baseline_rows(baseline.folder, settings), config_hash(settings))
    return baseline
