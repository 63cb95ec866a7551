"""One cpbench run as one SLURM job through submitit: the executor, what every task runs (one rank
that takes its torch.distributed environment from the job), and submitit's own log.

The job is checkpointable: on timeout submitit calls `checkpoint`, which marks the point being measured
as interrupted (not broken) and requeues the same callable; SIGTERM (a preemption, scancel) marks it so
too. The requeued ranks skip every point already in results.csv, so nothing measured is lost or measured
twice."""

from __future__ import annotations

import functools
import logging
import os
import re
import signal
from dataclasses import asdict
from pathlib import Path
from typing import Any

import submitit
from submitit.helpers import Checkpointable, DelayedSubmission, TorchDistributedEnvironment

from cpbench.launch.slurm.layout import executor_parameters, layout
from cpbench.probe.state import ProbeState
from cpbench.rank import RunSpec, run_rank
from cpbench.results.folder import RunFolder
from cpbench.settings.schema import BenchConfig


def build_executor(cfg: BenchConfig, folder: RunFolder, cp: int) -> submitit.AutoExecutor:
    cluster = cfg.slurm.cluster
    executor = submitit.AutoExecutor(
        folder=folder.slurm_job("%j"),
        cluster=cluster,
        **{f"{cluster}_max_num_timeout": cfg.slurm.max_requeues},
    )
    executor.update_parameters(**executor_parameters(cfg, cp))
    return executor


def interrupt(folder: RunFolder) -> None:
    """The point (or probe step) being measured was interrupted, not broken: the requeued job (or the
    next run) measures it again, and does not count it as a crash."""
    folder.in_flight.interrupt()
    ProbeState(folder).interrupt()


class SlurmRanks(Checkpointable):
    """What every task of the job runs: export the torch.distributed environment of this task
    (rank, world size, master address and port from SLURM's variables), then run one rank."""

    def __call__(self, spec: RunSpec) -> None:
        # Every rank sees all GPUs of its node and picks cuda:LOCAL_RANK, as under torchrun.
        env = TorchDistributedEnvironment().export(set_cuda_visible_devices=False, overwrite=True)
        # After submitit's own handlers, which let SIGTERM pass (it waits for USR2 to checkpoint).
        signal.signal(signal.SIGTERM, functools.partial(_end_interrupted, spec.output_dir, env.rank))
        run_rank(spec)

    def checkpoint(self, spec: RunSpec) -> DelayedSubmission:
        """Called on task 0 when the job is timed out or preempted, just before it is requeued."""
        interrupt(RunFolder(spec.output_dir))
        return DelayedSubmission(self, spec)


def _end_interrupted(output_dir: str, rank: int, signum: int, frame: object) -> None:
    """SLURM ends a job's tasks with SIGTERM, then SIGKILL `KillWait` later: `scontrol requeue` (a
    preemption), scancel, a time limit reached. Each is an interruption; rank 0 marks the point in
    flight so, and every rank leaves at once (a rank that went on could start the next point)."""
    if rank == 0:
        interrupt(RunFolder(output_dir))
    logging.shutdown()
    os._exit(128 + signum)


class _Once(logging.Filter):
    """Each message once: submitit repeats its warning on every poll ("Call #N - Bypassing sacct error")."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        key = re.sub(r"^Call #\d+ - ", "", record.getMessage())
        new = key not in self.seen
        self.seen.add(key)
        return new


class _FileOnDemand(logging.FileHandler):
    """A log file (and its folder) made by its first message only."""

    def __init__(self, path: Path) -> None:
        super().__init__(path, delay=True)

    def _open(self) -> Any:
        Path(self.baseFilename).parent.mkdir(parents=True, exist_ok=True)
        return super()._open()


def log_submitit_to(path: Path) -> None:
    """In the submitting process, submitit's own log goes to `path` alone, each message once: it prints
    each warning on stdout and stderr, and Hydra's root logger prints it a third time."""
    handler = _FileOnDemand(path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    handler.addFilter(_Once())
    logger = logging.getLogger("submitit")
    for old in list(logger.handlers):
        logger.removeHandler(old)
    logger.addHandler(handler)
    logger.propagate = False


def submit(spec: RunSpec, cp: int) -> submitit.Job:
    """Submit the run as one job; note its id under output_dir/slurm for reports and people."""
    folder, cfg = RunFolder(spec.output_dir), spec.settings
    log_submitit_to(folder.slurm / "submitit.log")
    job = build_executor(cfg, folder, cp).submit(SlurmRanks(), spec)
    note = {
        "job_id": job.job_id,
        "cluster": cfg.slurm.cluster,
        "layout": asdict(layout(cp, cfg.slurm)),
        "folder": str(folder.slurm_job(job.job_id)),
    }
    folder.write_json(folder.submitted, note)
    return job
