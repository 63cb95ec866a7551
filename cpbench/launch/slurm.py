"""One cpbench run as one SLURM job through submitit: `nodes x tasks_per_node` tasks sized from
`topology.cp`, each task one rank that takes its torch.distributed environment from the job.

The job is checkpointable: on timeout submitit calls `checkpoint`, which marks the point being measured
as interrupted (not broken) and requeues the same callable; SIGTERM (a preemption, scancel) marks it so
too. The requeued ranks skip every point already in results.csv, so nothing measured is lost or measured
twice. The submitting process waits on the controller's view of the job (no accounting needed) and
closes the run: a rank that raised records its point as error; a job SLURM stopped leaves it in flight."""

from __future__ import annotations

import functools
import logging
import math
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import submitit
from submitit.core.utils import FailedJobError, UncompletedJobError
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
        "slurm_exclusive": s.exclusive or None,
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


def _interrupt(output_dir: str) -> None:
    """The point (or probe step) being measured was interrupted, not broken: the requeued job (or the
    next run) measures it again, and does not count it as a crash."""
    folder = RunFolder(output_dir)
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
        _interrupt(spec.output_dir)
        return DelayedSubmission(self, spec)


def _end_interrupted(output_dir: str, rank: int, signum: int, frame: object) -> None:
    """SLURM ends a job's tasks with SIGTERM, then SIGKILL `KillWait` later: `scontrol requeue` (a
    preemption), scancel, a time limit reached. Each is an interruption; rank 0 marks the point in
    flight so, and every rank leaves at once (a rank that went on could start the next point)."""
    if rank == 0:
        _interrupt(output_dir)
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
    log_submitit_to(folder.submitted.parent / "submitit.log")
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


@dataclass(frozen=True)
class TaskFailure:
    """How one task of a job ended, other than in success. `how`: `raised` (the rank's code raised),
    `stopped` (submitit's signal handler ended it without a requeue: timed out too often, preempted with
    nothing to requeue) or `killed` (it left no result: scancel, a signal, its peer's failure, a node
    lost). `first`: srun names it as the first task that failed."""

    task: int
    message: str
    how: str
    first: bool = False

    @property
    def consequence(self) -> bool:
        """It failed because a peer had gone, not on its own."""
        killed_after = self.how == "killed" and not self.first
        return killed_after or any(c in self.message.lower() for c in _CONSEQUENCES)


def _task_failure(task: int, error: Exception) -> TaskFailure:
    message = _summary(error)
    if not isinstance(error, FailedJobError):  # its parent class, UncompletedJobError: no result
        return TaskFailure(task, message, "killed")
    # submitit's signal handler raises UncompletedJobError in the task when it will not requeue.
    if message.startswith(f"{UncompletedJobError.__module__}.{UncompletedJobError.__name__}: "):
        return TaskFailure(task, message.split(": ", 1)[1], "stopped")
    return TaskFailure(task, message, "raised")


# Job states in which SLURM runs the job no more (a requeued job passes through REQUEUED and PENDING);
# ENDED: the controller has forgotten it (MinJobAge after its end).
_ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "DEADLINE", "ENDED"}
_POLL_S = 2.0


def slurm_state(job_id: str) -> dict[str, str]:
    """The controller's own view of the job (`scontrol show job`): JobState, Reason, Restarts, ExitCode."""
    proc = subprocess.run(
        ["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True, timeout=60
    )
    if proc.returncode != 0:
        return {"JobState": "ENDED"} if "Invalid job id" in proc.stderr else {}
    return dict(item.split("=", 1) for item in proc.stdout.split() if "=" in item)


def _has_result(job: submitit.Job, task: int) -> bool:
    return job.task(task).paths.result_pickle.exists()


def wait(job: submitit.Job) -> None:
    """Until every task has left its result, or SLURM says the job ended (a killed task leaves none);
    one line on stderr per change of the job's state. submitit learns a job's end from sacct, which
    fails on a cluster without accounting (no slurmdbd): it would wait for ever, and warn on each poll.
    The controller's own view needs no accounting."""
    if not isinstance(job, submitit.SlurmJob):  # submitit's local executor knows its own processes
        job.wait()
        return
    seen: tuple[str, str] | None = None
    while not all(_has_result(job, t) for t in range(job.num_tasks)):
        info = slurm_state(str(job.job_id))
        state = (info.get("JobState", "UNKNOWN"), info.get("Restarts", "0"))
        if state != seen and state[0] != "ENDED":
            restarts = f", restart {state[1]}" if state[1] != "0" else ""
            reason = info.get("Reason", "None")
            why = f" ({reason})" if reason != "None" else ""
            print(f"cpbench: job {job.job_id} {state[0]}{why}{restarts}", file=sys.stderr)
            seen = state
        if state[0] in _ENDED:
            time.sleep(_POLL_S)  # the results a task wrote as it ended may take a moment to show
            return
        time.sleep(_POLL_S)


def _srun_first_failure(job: submitit.Job) -> tuple[int | None, str]:
    """srun's first line about a failed task in the job's log (the batch script's stderr, which task 0
    shares), e.g. "srun: error: node1: task 1: Killed": the task and the line."""
    log = job.task(0).paths.stderr
    text = log.read_text(errors="replace") if log.exists() else ""
    for line in text.splitlines():
        if found := re.match(r"srun: error: \S+: tasks? (\d+)", line):
            return int(found.group(1)), line.strip()
    return None, ""


def _no_result(job: submitit.Job, task: int) -> TaskFailure:
    """A task that left no result was killed: SLURM's own account of it (its state, srun's line)."""
    first, srun = _srun_first_failure(job)
    info = slurm_state(str(job.job_id)) if isinstance(job, submitit.SlurmJob) else {}
    state = " ".join(f"{k}={info[k]}" for k in ("JobState", "Reason", "ExitCode") if k in info)
    detail = "; ".join(filter(None, [state, srun if first == task else ""]))
    message = f"left no result ({detail})" if detail else "left no result"
    return TaskFailure(task, message, "killed", first == task)


def failure_of(job: submitit.Job) -> TaskFailure | None:
    """Wait for the job; None if every task succeeded, else the root cause: a task stopped by SLURM's
    time limit, or the first task to fail on its own rather than because a peer had gone."""
    wait(job)
    found = []
    for task in range(job.num_tasks):
        if not _has_result(job, task):
            found.append(_no_result(job, task))
        elif (error := job.task(task).exception()) is not None:
            found.append(_task_failure(task, error))
    if not found:
        return None
    return min(found, key=lambda f: (f.how != "stopped", f.consequence, f.task))


def finish(job: submitit.Job, folder: RunFolder, cp: int) -> int:
    """Wait for the job, then close the run. A rank that raised records its point in flight as `error`.
    A job that SLURM stopped (out of requeues, cancelled, killed) was interrupted: its point stays in
    flight, and the next run of the same command measures it."""
    failure = failure_of(job)
    if failure is None:
        print(f"cpbench: job {job.job_id} done: {folder.root}", file=sys.stderr)
        return 0
    logs = folder.slurm_job(str(job.job_id))
    if failure.how == "stopped":  # the checkpoint marked it so already, unless there was none to call
        folder.in_flight.interrupt()
        ProbeState(folder).interrupt()
    status = {"raised": "error", "stopped": "interrupted", "killed": "crashed"}[failure.how]
    line = f"SLURM job {job.job_id} task {failure.task}: {failure.message}"
    if status != "error":
        line += f" ({'; '.join(filter(None, [_where(folder), 'run the same command to resume']))})"
    close_failed(folder, cp, status, line, 1, f"task logs: {logs}")
    print(f"cpbench: {line}; task logs are in {logs}", file=sys.stderr)
    return 1


def _where(folder: RunFolder) -> str | None:
    """The point (or probe step) in flight, which the next run measures again."""
    if (row := folder.in_flight.row()) is not None:
        return f"at N={row['N_tokens']}"
    if (n := ProbeState(folder).in_flight) is not None:
        return f"at probe N={n}"
    return None


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
