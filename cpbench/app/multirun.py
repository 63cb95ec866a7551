"""A job of a Hydra multirun or of an experiment plan: its own folder, its failure recorded there
instead of ending the sweep, its turn on a machine shared with the other jobs."""

from __future__ import annotations

import sys
import traceback
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from cpbench.app.campaign import run
from cpbench.app.outcome import close_failed
from cpbench.launch.registry import leads_here
from cpbench.launch.slurm import hydra_job_turn
from cpbench.measure.oom import classify
from cpbench.results.folder import RunFolder


def sweep_job_dir() -> Path | None:
    """In a multirun, the job's own folder under the sweep dir; None for a single run."""
    hydra_cfg = HydraConfig.get()
    return Path(hydra_cfg.runtime.output_dir) if hydra_cfg.mode == RunMode.MULTIRUN else None


def plan_run(cfg: DictConfig) -> int:
    """One run of an experiment plan, in this process; a run that raised is a failed run (exit 1)."""
    cfg.baseline = False  # a plan compares its runs with its own reference, not with cp=1
    try:
        return run(cfg)
    except Exception as err:
        print(f"cpbench: {type(err).__name__}: {err}".splitlines()[0], file=sys.stderr)
        return 1


def run_job(cfg: DictConfig, job_dir: Path) -> None:
    """One job of a multirun. Every job of the sweep shares one cp=1 baseline, cached in the sweep
    folder (cfg.output_dir); its failure is recorded in its own folder instead of ending the sweep,
    and the end of the sweep lists it (cpbench.callbacks.MergeSweep). Interrupted, the sweep stops too."""
    baseline_root = Path(cfg.output_dir).resolve()
    cfg.output_dir = str(job_dir)
    try:
        with hydra_job_turn(job_dir):
            code = run(cfg, in_sweep=True, baseline_root=baseline_root)
        if code >= 128:  # interrupted: the sweep stops too
            raise SystemExit(code)
    except Exception as err:  # a rank of this process raised: record it like any failed job
        error = f"{type(err).__name__}: {err}".strip().splitlines()[0]
        folder, detail, cp = RunFolder(job_dir), traceback.format_exc(limit=-4), cfg.topology.cp
        if leads_here():
            close_failed(folder, cp, "error", error, 1, detail, first=True)
        else:
            folder.record_failure(1, error, detail, first=True, cp=cp, failure=classify(error))
        print(f"cpbench: job failed: {error}", file=sys.stderr)
