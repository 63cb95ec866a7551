"""A submitted job's course, from SLURM's own account: its state changes while it runs, and the task
at the root of its failure once it ended.

submitit learns a job's end from sacct, which fails on a cluster without accounting (no slurmdbd): it
would wait for ever, and warn on each poll. The controller's view (`scontrol show job`) needs no
accounting."""

from __future__ import annotations

import re
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import submitit
from submitit.core.utils import FailedJobError, UncompletedJobError

from cpbench.launch.base import JobState, is_consequence

# Job states in which SLURM runs the job no more (a requeued job passes through REQUEUED and PENDING);
# ENDED: the controller has forgotten it (MinJobAge after its end).
_ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "DEADLINE", "ENDED"}
POLL_S = 2.0
# How long the watch of a Hydra sweep's jobs waits, once the sweep has their results, for SLURM to end them.
END_GRACE_S = 20.0


def slurm_state(job_id: str) -> dict[str, str]:
    """The controller's own view of the job (`scontrol show job`): JobState, Reason, Restarts, ExitCode."""
    proc = subprocess.run(
        ["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True, timeout=60
    )
    if proc.returncode != 0:
        return {"JobState": "ENDED"} if "Invalid job id" in proc.stderr else {}
    return dict(item.split("=", 1) for item in proc.stdout.split() if "=" in item)


def _job_state(job_id: str, logs: Path) -> JobState:
    info = slurm_state(job_id)
    reason = info.get("Reason", "None")
    return JobState(
        job_id, info.get("JobState", "UNKNOWN"), "" if reason == "None" else reason,
        int(info.get("Restarts", "0")), logs,
    )  # fmt: skip


class Changes:
    """Each job's state as last told; `tell` passes on a state only when it differs."""

    def __init__(self, notify: Callable[[JobState], None]):
        self.notify, self.seen = notify, {}

    def tell(self, state: JobState) -> None:
        key = (state.state, state.restarts)
        if self.seen.get(state.job_id) != key and state.state != "ENDED":
            self.notify(state)
        self.seen[state.job_id] = key


def _has_result(job: submitit.Job, task: int) -> bool:
    return job.task(task).paths.result_pickle.exists()


def _finished(job: submitit.Job) -> bool:
    return all(_has_result(job, t) for t in range(job.num_tasks))


def wait(jobs: Sequence[submitit.Job], notify: Callable[[JobState], None]) -> None:
    """Until every task of every job has left its result, or SLURM says the job ended (a killed task
    leaves none); `notify` hears each change of a job's state."""
    local = [job for job in jobs if not isinstance(job, submitit.SlurmJob)]
    for job in local:  # submitit's local executor knows its own processes
        job.wait()
    changes, left = Changes(notify), [job for job in jobs if job not in local]
    while left:
        for job in list(left):
            if _finished(job):
                left.remove(job)
                continue
            state = _job_state(str(job.job_id), job.paths.folder)
            changes.tell(state)
            if state.state in _ENDED:
                time.sleep(POLL_S)  # the results a task wrote as it ended may take a moment to show
                left.remove(job)
        if left:
            time.sleep(POLL_S)


def _job_folders(folder: Path) -> list[Path]:
    """The folders submitit names by job id: `42`, or `42_3` for a job of an array (whose own `42`
    holds only the array's script)."""
    found = [p for p in folder.iterdir() if re.fullmatch(r"\d+(_\d+)?", p.name)] if folder.is_dir() else []
    arrays = {p.name.split("_")[0] for p in found if "_" in p.name}
    return sorted(p for p in found if p.name not in arrays)


def watch_folder(folder: Path, notify: Callable[[JobState], None], stop: threading.Event) -> None:
    """The jobs whose folders submitit makes under `folder` (a Hydra submitit launcher's, which waits
    for them itself): each change of their state, until `stop` is set and, for a few seconds more,
    until each has ended (a job leaves its result a moment before SLURM ends it)."""
    changes, deadline = Changes(notify), None
    while True:
        if stop.wait(POLL_S) and deadline is None:
            deadline = time.monotonic() + END_GRACE_S
        running = [job for job in _job_folders(folder) if changes.seen.get(job.name, ("",))[0] not in _ENDED]
        for job in running:
            changes.tell(_job_state(job.name, job))
        left = [job for job in running if changes.seen[job.name][0] not in _ENDED]
        if deadline is not None and (not left or time.monotonic() > deadline):
            return


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
        return killed_after or is_consequence(self.message)


def _task_failure(task: int, error: Exception) -> TaskFailure:
    message = _summary(error)
    if not isinstance(error, FailedJobError):  # its parent class, UncompletedJobError: no result
        return TaskFailure(task, message, "killed")
    # submitit's signal handler raises UncompletedJobError in the task when it will not requeue.
    if message.startswith(f"{UncompletedJobError.__module__}.{UncompletedJobError.__name__}: "):
        return TaskFailure(task, message.split(": ", 1)[1], "stopped")
    return TaskFailure(task, message, "raised")


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


def root_failure(job: submitit.Job) -> TaskFailure | None:
    """Once the job ended: None if every task succeeded, else the root cause: a task stopped by SLURM's
    time limit, or the first task to fail on its own rather than because a peer had gone."""
    found = []
    for task in range(job.num_tasks):
        if not _has_result(job, task):
            found.append(_no_result(job, task))
        elif (error := job.task(task).exception()) is not None:
            found.append(_task_failure(task, error))
    if not found:
        return None
    return min(found, key=lambda f: (f.how != "stopped", f.consequence, f.task))


def _ignore(state: JobState) -> None:
    """No one to tell."""


def failure_of(job: submitit.Job, notify: Callable[[JobState], None] = _ignore) -> TaskFailure | None:
    """Wait for the job, then its root failure (None: every task succeeded)."""
    wait([job], notify)
    return root_failure(job)
