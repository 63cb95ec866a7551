"""One cpbench run as one SLURM job through submitit: `nodes x tasks_per_node` tasks sized from
`topology.cp`, each task one rank that takes its torch.distributed environment from the job.

The job is checkpointable: on timeout or preemption submitit calls `checkpoint`, which forgets the
point being measured (it was interrupted, not broken) and requeues the same callable; the requeued
ranks skip every point already in results.csv, so nothing measured is lost or measured twice."""

from __future__ import annotations

import math
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import submitit
from submitit.core.utils import FailedJobError
from submitit.helpers import Checkpointable, DelayedSubmission, TorchDistributedEnvironment
from submitit.slurm.slurm import SlurmExecutor

from cpbench.core import ConfigError
from cpbench.launch.local import _CONSEQUENCES
from cpbench.launch.outcome import close_failed
from cpbench.probe.state import ProbeState
from cpbench.rank import RunSpec, run_rank
from cpbench.results.folder import RunFolder
from cpbench.settings.schema import BenchConfig
from cpbench.settings.slurm import SlurmConfig

# One failing rank ends the job: its peers would otherwise wait in a collective until the timeout.
SRUN_ARGS = ["--kill-on-bad-exit=1"]


@dataclass(frozen=True)
class Layout:
    """How `cp` ranks sit on nodes: one task (and one GPU, if any) per rank."""

    nodes: int
    tasks_per_node: int
    gpus_per_node: int  # 0: CPU ranks

    def __str__(self) -> str:
        gpus = f", {self.gpus_per_node} GPU(s) per node" if self.gpus_per_node else " (CPU ranks)"
        return f"{self.nodes} node(s) x {self.tasks_per_node} rank(s){gpus}"


def layout(cp: int, slurm: SlurmConfig) -> Layout:
    """Fewest nodes that hold `cp` ranks, the same number on each node."""
    if slurm.cluster not in ("slurm", "local"):
        raise ConfigError(f"slurm.cluster={slurm.cluster}: allowed values are slurm, local")
    if slurm.gpus_per_node < 0:
        raise ConfigError(f"slurm.gpus_per_node={slurm.gpus_per_node}: must be >= 0 (0: CPU ranks)")
    if slurm.ranks_per_node is not None and slurm.ranks_per_node < 1:
        raise ConfigError(f"slurm.ranks_per_node={slurm.ranks_per_node}: must be >= 1 or null")
    per_node = slurm.ranks_per_node or slurm.gpus_per_node or cp
    if slurm.gpus_per_node and per_node > slurm.gpus_per_node:
        raise ConfigError(
            f"slurm.ranks_per_node={per_node}: more ranks than slurm.gpus_per_node={slurm.gpus_per_node}"
        )
    nodes = math.ceil(cp / per_node)
    if cp % nodes:
        raise ConfigError(
            f"topology.cp={cp}: does not split evenly over {nodes} nodes of at most {per_node} ranks "
            "(slurm.gpus_per_node / slurm.ranks_per_node)"
        )
    if slurm.cluster == "local" and nodes > 1:
        raise ConfigError(
            f"topology.cp={cp}: slurm.cluster=local runs on this one machine; {nodes} nodes were needed"
        )
    tasks = cp // nodes
    return Layout(nodes, tasks, tasks if slurm.gpus_per_node else 0)


def executor_parameters(cfg: BenchConfig, cp: int) -> dict[str, Any]:
    """The submitit AutoExecutor parameters of the job (generic ones, and `slurm_` ones for sbatch)."""
    s, shape = cfg.slurm, layout(cp, cfg.slurm)
    params: dict[str, Any] = {
        "name": f"cpbench-cp{cp}",
        "timeout_min": s.time_min,
        "nodes": shape.nodes,
        "tasks_per_node": shape.tasks_per_node,
        "gpus_per_node": shape.gpus_per_node or None,
        "cpus_per_task": s.cpus_per_task,
        "mem_gb": s.mem_gb,
        "slurm_partition": s.partition,
        "slurm_account": s.account,
        "slurm_qos": s.qos,
        "slurm_constraint": s.constraint,
        "slurm_signal_delay_s": s.signal_delay_s,
        "slurm_setup": list(s.setup) or None,
        "slurm_additional_parameters": dict(s.additional_parameters) or None,
        "slurm_srun_args": SRUN_ARGS,
    }
    return {k: v for k, v in params.items() if v is not None}


def build_executor(cfg: BenchConfig, folder: RunFolder, cp: int) -> submitit.AutoExecutor:
    cluster = cfg.slurm.cluster
    executor = submitit.AutoExecutor(
        folder=folder.slurm_job("%j"),
        cluster=cluster,
        **{f"{cluster}_max_num_timeout": cfg.slurm.max_requeues},
    )
    executor.update_parameters(**executor_parameters(cfg, cp))
    return executor


class _ScriptOnly(SlurmExecutor):
    """submitit's SLURM executor where no SLURM is installed: it can still write the sbatch script."""

    @classmethod
    def affinity(cls) -> int:
        return 1


def sbatch_script(cfg: BenchConfig, folder: RunFolder, cp: int) -> str:
    """The sbatch script submitit would submit for this run, built by submitit itself."""
    executor = _ScriptOnly(folder.slurm_job("%j"), max_num_timeout=cfg.slurm.max_requeues)
    params = executor_parameters(cfg, cp)
    generic = {k: v for k, v in params.items() if not k.startswith("slurm_")}
    specific = {k.removeprefix("slurm_"): v for k, v in params.items() if k.startswith("slurm_")}
    executor.update_parameters(**executor._convert_parameters(generic), **specific)
    return executor._make_submission_file_text(executor._submitit_command_str, "preview")


class SlurmRanks(Checkpointable):
    """What every task of the job runs: export the torch.distributed environment of this task
    (rank, world size, master address and port from SLURM's variables), then run one rank."""

    def __call__(self, spec: RunSpec) -> None:
        # Every rank sees all GPUs of its node and picks cuda:LOCAL_RANK, as under torchrun.
        TorchDistributedEnvironment().export(set_cuda_visible_devices=False, overwrite=True)
        run_rank(spec)

    def checkpoint(self, spec: RunSpec) -> DelayedSubmission:
        """Called on task 0 when the job is timed out or preempted, just before it is requeued."""
        # The point (or probe step) being measured was interrupted, not broken: the requeued job
        # measures it again, and does not count it as a crash.
        folder = RunFolder(spec.output_dir)
        folder.in_flight.interrupt()
        ProbeState(folder).interrupt()
        return DelayedSubmission(self, spec)


def submit(spec: RunSpec, cp: int) -> submitit.Job:
    """Submit the run as one job; note its id under output_dir/slurm for reports and people."""
    folder, cfg = RunFolder(spec.output_dir), spec.settings
    job = build_executor(cfg, folder, cp).submit(SlurmRanks(), spec)
    note = {
        "job_id": job.job_id,
        "cluster": cfg.slurm.cluster,
        "layout": asdict(layout(cp, cfg.slurm)),
        "folder": str(folder.slurm_job(job.job_id)),
    }
    folder.write_json(folder.submitted, note)
    return job


def write_script(cfg: BenchConfig, folder: RunFolder, cp: int) -> Path:
    """`slurm.dry_run`: the script lands where the job's files would, and nothing is submitted."""
    folder.write_text(folder.sbatch_script, sbatch_script(cfg, folder, cp))
    return folder.sbatch_script


def _summary(error: Exception) -> str:
    """One line out of submitit's error: the last line of the task's traceback, else its first lines."""
    lines = str(error).splitlines()
    if isinstance(error, FailedJobError):
        marks = [i for i, line in enumerate(lines) if line == "-" * 22]  # submitit frames the trace so
        trace = [line.strip() for line in lines[marks[0] + 1 : marks[-1]] if line.strip()] if marks else []
        if trace:
            return trace[-1]
    return " ".join(line.strip() for line in lines[:2]) or type(error).__name__


def failure_of(job: submitit.Job) -> str | None:
    """Wait for the job; None if every task succeeded, else the root cause: the first task to fail on
    its own rather than because a peer had gone."""
    job.wait()
    found = []
    for task in range(job.num_tasks):
        error = job.task(task).exception()
        if error is not None:
            found.append((task, _summary(error)))
    if not found:
        return None
    task, message = min(found, key=lambda f: (any(c.lower() in f[1].lower() for c in _CONSEQUENCES), f[0]))
    return f"SLURM job {job.job_id} task {task}: {message}"


def finish(job: submitit.Job, folder: RunFolder, cp: int) -> int:
    """Wait for the job; on failure record its in-flight point, the report and failure.json."""
    problem = failure_of(job)
    if problem is None:
        print(f"cpbench: job {job.job_id} done: {folder.root}", file=sys.stderr)
        return 0
    logs = folder.slurm_job(str(job.job_id))
    close_failed(folder, cp, "error", problem, 1, f"task logs: {logs}")
    print(f"cpbench: {problem}\ncpbench: task logs are in {logs}", file=sys.stderr)
    return 1


# Jobs a multirun submitted without waiting (the basic launcher runs its jobs one after another); the
# end of the sweep waits for them all, so they run side by side on the cluster.
_PENDING: list[tuple[submitit.Job, RunFolder, int]] = []


def defer(job: submitit.Job, folder: RunFolder, cp: int) -> None:
    _PENDING.append((job, folder, cp))


def finish_pending() -> int:
    """Wait for every deferred job; the number that failed."""
    failed = 0
    while _PENDING:
        job, folder, cp = _PENDING.pop(0)
        failed += finish(job, folder, cp) != 0
    return failed
