"""The SLURM launcher: one cpbench run as one SLURM job through submitit (`slurm.enabled=true`),
`nodes x tasks_per_node` tasks sized from `topology.cp`, each task one rank; and what cpbench does
inside a job of a Hydra submitit launcher (`-m hydra/launcher=cpbench_slurm`). The only package that
knows submitit or SLURM: `layout.py` sizes the job, `script.py` writes its sbatch script (dry run),
`job.py` submits it and runs its tasks, `state.py` follows it and finds the task at the root of a
failure."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import submitit
from omegaconf import DictConfig

from cpbench.core import ConfigError, Topology
from cpbench.launch.base import JobFailed, JobState, Launcher, Notify, ScriptWritten, Submitted, Waiting
from cpbench.launch.slurm.job import (
    build_executor,
    export_torch_environment,
    interrupt,
    restart_count,
    submit,
)
from cpbench.launch.slurm.layout import Layout, executor_parameters, layout
from cpbench.launch.slurm.quiet import children_stderr_to_log, log_submitit_to
from cpbench.launch.slurm.script import sbatch_script
from cpbench.launch.slurm.state import failure_of, root_failure, wait, watch_folder
from cpbench.launch.torchrun import TorchrunLauncher
from cpbench.rank import RunSpec
from cpbench.results.folder import RunFolder
from cpbench.results.lock import take_turn
from cpbench.results.paths import RunPaths
from cpbench.settings.schema import BenchConfig
from cpbench.settings.slurm import SlurmConfig
from cpbench.workloads.base import Workload

__all__ = [
    "JobTasksLauncher", "Layout", "SlurmLauncher", "build_executor", "executor_parameters", "failure_of",
    "hydra_job_turn", "layout", "log_submitit_to", "sbatch_script", "submit", "watch_hydra_jobs",
]  # fmt: skip


def in_submitit_job() -> bool:
    return "SUBMITIT_EXECUTOR" in os.environ


@dataclass(frozen=True)
class SlurmLaunch:
    """The SLURM launcher's settings: the `slurm.*` keys, the ranks, and when the app waits."""

    slurm: SlurmConfig
    cp: int
    waiting: Waiting

    @classmethod
    def of(cls, settings: BenchConfig, in_sweep: bool) -> SlurmLaunch:
        """A multirun under Hydra's basic launcher leaves the waiting to the end of the sweep, so its
        jobs run side by side; a job of a Hydra submitit launcher waits for what it submitted."""
        if not settings.slurm.wait:
            waiting = Waiting.never
        elif in_sweep and not in_submitit_job():
            waiting = Waiting.sweep_end
        else:
            waiting = Waiting.now
        return cls(settings.slurm, settings.topology.cp, waiting)


class SlurmLauncher(Launcher):
    """Submit the run's ranks as one SLURM job (or its sbatch script only: `slurm.dry_run`)."""

    named = "slurm.enabled=true"

    def __init__(self, settings: SlurmLaunch):
        self.settings = settings

    @classmethod
    def chosen(cls, settings: BenchConfig) -> bool:
        return settings.slurm.enabled

    @classmethod
    def from_settings(cls, settings: BenchConfig, in_sweep: bool) -> SlurmLauncher:
        return cls(SlurmLaunch.of(settings, in_sweep))

    def validate(self, topology: Topology, ranks_run: bool = True) -> None:
        layout(topology.cp, self.settings.slurm)

    @property
    def runs_here(self) -> bool:
        return False

    @property
    def starts_runs(self) -> bool:
        return False

    def start(self, spec: RunSpec, workload: Workload | None, notify: Notify) -> Submitted | ScriptWritten:
        folder, cp = RunFolder(spec.output_dir), self.settings.cp
        if self.settings.slurm.dry_run:  # the script lands where the job's files would
            folder.write_text(folder.sbatch_script, sbatch_script(spec.settings, folder.slurm_job("%j"), cp))
            return ScriptWritten(folder.sbatch_script)
        job = submit(spec, cp)
        what = f"{self.settings.slurm.cluster} job {job.job_id} ({layout(cp, self.settings.slurm)})"
        logs, waiting = folder.slurm_job(job.job_id), self.settings.waiting
        return Submitted(job.job_id, what, logs, spec.output_dir, cp, waiting, job)

    def wait(self, jobs: Sequence[Submitted], notify: Notify) -> list[JobFailed | None]:
        """Wait for the jobs together; each one's root failure, or None. A job that SLURM stopped (out
        of requeues, cancelled, killed) was interrupted: its point stays in flight for the next run."""
        wait([job.handle for job in jobs], notify)
        return [self._failed(job) for job in jobs]

    @staticmethod
    def _failed(job: Submitted) -> JobFailed | None:
        failure = root_failure(job.handle)
        if failure is None:
            return None
        if failure.how == "stopped":  # the checkpoint marked it so already, unless there was none to call
            interrupt(RunFolder(job.output_dir))
        status = {"raised": "error", "stopped": "interrupted", "killed": "crashed"}[failure.how]
        return JobFailed(f"SLURM job {job.job_id} task {failure.task}: {failure.message}", status, job.logs)


class JobTasksLauncher(TorchrunLauncher):
    """Inside a job of a Hydra submitit launcher whose every task runs the whole Hydra job: exactly cp
    tasks are the ranks themselves, taking their torch.distributed environment from the job. (A job of
    one task launches its own ranks: the local launcher.)"""

    named = "a submitit job's tasks as ranks"

    @classmethod
    def chosen(cls, settings: BenchConfig) -> bool:
        return in_submitit_job() and submitit.JobEnvironment().num_tasks > 1

    def validate(self, topology: Topology, ranks_run: bool = True) -> None:
        tasks = submitit.JobEnvironment().num_tasks
        if tasks != topology.cp:
            raise ConfigError(
                f"topology.cp={topology.cp}: this submitit job has {tasks} tasks; give each job one task "
                "(hydra.launcher.tasks_per_node=1, nodes=1: it launches its own ranks) or exactly cp tasks"
            )
        export_torch_environment()
        super().validate(topology, ranks_run)

    @property
    def restart(self) -> int:
        return restart_count()


def hydra_job_turn(job_dir: Path) -> contextlib.AbstractContextManager:
    """submitit_local starts every job of a sweep at once, on the same cores: each job (its first task:
    a job's tasks may be its ranks, which must start together) waits its turn on the sweep folder."""
    if os.environ.get("SUBMITIT_EXECUTOR") != "local" or submitit.JobEnvironment().global_rank != 0:
        return contextlib.nullcontext()
    return take_turn(RunPaths(job_dir.parent))


@contextlib.contextmanager
def watch_hydra_jobs(hydra: DictConfig, notify: Callable[[JobState], None]) -> Iterator[None]:
    """While a Hydra submitit SLURM launcher waits for its jobs (it polls sacct and says nothing), each
    change of their state, from the folders it makes for them, and sacct's own complaints off the
    console; nothing under any other launcher."""
    target = str(hydra.launcher.get("_target_", ""))
    if target != "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher":
        yield
        return
    stop = threading.Event()
    folder = Path(str(hydra.launcher.submitit_folder)).parent
    watcher = threading.Thread(target=watch_folder, args=(folder, notify, stop), daemon=True)
    watcher.start()
    try:
        with children_stderr_to_log():
            yield
    finally:
        stop.set()
        watcher.join(timeout=60)
