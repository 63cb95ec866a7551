"""The one interface every launcher implements, and what a launch ends with.

A launcher knows how the ranks of one run start (in this process, as local processes, as a rank of a
world started by someone else, as a scheduler's job) and nothing else: it validates its settings before
any rank starts (ConfigError, one line), starts the ranks of a RunSpec and returns a typed outcome, waits
for a job that runs elsewhere, and says what this process may do beside the ranks (hold the run
folder, start the cp=1 baseline). It prints nothing and chooses no exit code: it raises the typed
errors below, and the app (`cpbench/app/`) tells the user."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

from cpbench.core import ConfigError, Topology
from cpbench.rank import RunSpec
from cpbench.runtime.rank import pick_backend, visible_gpus
from cpbench.settings.schema import BenchConfig
from cpbench.workloads.base import Workload

# Messages of ranks (or tasks) that failed only because a peer had died first.
CONSEQUENCES = ("closed by peer", "reset by peer", "remote worker", "socket timeout", "timed out")


def is_consequence(message: str) -> bool:
    """The failure followed from a peer's, rather than being a root cause of its own."""
    return any(c in message.lower() for c in CONSEQUENCES)


def check_gpus(backend: str | None, cp: int, local: int, bound_apart: bool = False) -> None:
    """One rank per GPU (NCCL only): the `local` ranks of this node see this process's GPUs (they inherit
    its environment) and need that many. `bound_apart`: this process is one of them, started on its own
    (a SLURM task), where a site may bind each task its own GPU (CUDA_VISIBLE_DEVICES=<k>): one visible
    is its own (`gpu_index`). Counted without initialising CUDA: this process may fork the ranks."""
    if pick_backend(backend) != "nccl":
        return
    visible = visible_gpus()
    if local > visible and not (bound_apart and visible == 1):
        raise ConfigError(
            f"topology.cp={cp}: needs {local} GPUs on this node, {visible} visible (one rank per GPU)"
        )


class Waiting(Enum):
    """When the app waits for a submitted job."""

    now = "now"  # before the run returns
    sweep_end = "sweep_end"  # at the end of the multirun, so that the sweep's jobs run side by side
    never = "never"  # the user asked not to wait (the job id is printed)


@dataclass(frozen=True)
class Finished:
    """The ranks ran to their end (in this process or in processes it waited for)."""


@dataclass(frozen=True)
class Submitted:
    """The ranks run elsewhere as a job: its id, what it holds, where its logs land, when to wait."""

    job_id: str
    what: str  # e.g. "slurm job 42 (1 node(s) x 2 rank(s) (CPU ranks))"
    logs: Path
    output_dir: str  # the run's folder
    cp: int
    waiting: Waiting
    handle: Any  # the launcher's own handle on the job, for its `wait`


@dataclass(frozen=True)
class ScriptWritten:
    """Nothing started: the job script was written (a dry run)."""

    path: Path


Outcome = Finished | Submitted | ScriptWritten


@dataclass(frozen=True)
class JobState:
    """A change of a submitted job's state, as its scheduler reports it."""

    job_id: str
    state: str  # e.g. PENDING, RUNNING, COMPLETED
    reason: str = ""  # why it waits, when the scheduler says
    restarts: int = 0
    logs: Path | None = None

    def __str__(self) -> str:
        why = f" ({self.reason})" if self.reason else ""
        restarts = f", restart {self.restarts}" if self.restarts else ""
        logs = f"; logs: {self.logs}" if self.logs else ""
        return f"job {self.job_id} {self.state}{why}{restarts}{logs}"


class LaunchError(Exception):
    """The ranks of a run did not end well; subclasses say how."""


@dataclass
class RankFailure(LaunchError):
    """A rank failed: which one, why, and the head of its traceback."""

    rank: int
    reason: str
    traceback: str
    crashed: bool  # killed, or lost to a dead peer or a collective timeout, rather than raising

    def __str__(self) -> str:
        return f"rank {self.rank} {'crashed' if self.crashed else 'failed'}: {self.reason}"

    @property
    def error_type(self) -> str:
        """The name of the exception the rank raised ('' when it was killed)."""
        head, _, _ = self.reason.partition(":")
        return head if head.isidentifier() else ""

    @property
    def message(self) -> str:
        """The rank's error message without its exception's name."""
        return self.reason.removeprefix(f"{self.error_type}:").strip() if self.error_type else self.reason


@dataclass
class ShapeDoesNotFit(LaunchError):
    """A run of one fixed shape (workflow=convergence) ran out of memory: its rank raised DoesNotFit."""

    message: str

    def __str__(self) -> str:
        return self.message


@dataclass
class JobFailed(LaunchError):
    """A submitted job ended without every task's success: the task at the root of it, in one line.
    `status` is how its point in flight is recorded: `error` (a rank raised), `interrupted` (the
    scheduler stopped it: the next run measures the point again) or `crashed` (killed)."""

    line: str
    status: str
    logs: Path

    def __str__(self) -> str:
        return self.line


@dataclass(frozen=True)
class Restarting:
    """The local ranks crashed and start again (the run resumes); `line` says why, for the user."""

    line: str

    def __str__(self) -> str:
        return self.line


@dataclass(frozen=True)
class Caution:
    """What a launcher found in its environment that can end the run, said before the ranks start."""

    line: str

    def __str__(self) -> str:
        return self.line


# What a launcher tells while it works: a job's state changed, the ranks restart, a caution.
Notice = JobState | Restarting | Caution
Notify = Callable[[Notice], None]


class Launcher(ABC):
    """How the ranks of one run start. `chosen` says, from the validated settings (and, for the
    launcher that owns it, the environment), whether this is the launcher of the run; the registry
    (`cpbench/launch/registry.py`) asks each in turn."""

    # Shown in the refusals of what this launcher cannot do, e.g. "torchrun", "slurm.enabled=true".
    named: str = ""

    @classmethod
    @abstractmethod
    def chosen(cls, settings: BenchConfig) -> bool: ...

    @classmethod
    @abstractmethod
    def from_settings(cls, settings: BenchConfig, in_sweep: bool) -> Launcher:
        """This launcher with its own typed settings, taken from the run's."""

    @abstractmethod
    def validate(self, topology: Topology, ranks_run: bool = True) -> None:
        """Before any rank starts: raise ConfigError naming the setting. `ranks_run` false: no rank
        will start (a command that starts none: app/commands.py), so neither its world nor its devices
        matter."""

    @property
    def leads(self) -> bool:
        """This process owns the run folder: its lock, the what-changed table, the closing."""
        return True

    @property
    def runs_here(self) -> bool:
        """The ranks run on this machine (what they leave behind is checked here)."""
        return True

    @property
    def starts_runs(self) -> bool:
        """Runs of their own (the cp=1 baseline, mode=accuracy's reference, repeat_check's repeats)
        start from here."""
        return True

    @abstractmethod
    def start(self, spec: RunSpec, workload: Workload | None, notify: Notify) -> Outcome:
        """Start the ranks of `spec` (`workload`: the one built by the checks, for a rank in this
        process). Raises RankFailure or ShapeDoesNotFit; a rank of a world started elsewhere raises
        what it raises."""

    def wait(self, jobs: Sequence[Submitted], notify: Notify) -> list[JobFailed | None]:
        """Until the jobs this launcher submitted end, together: each one's failure, or None. Only a
        launcher that submits has jobs to wait for."""
        raise NotImplementedError(f"{type(self).__name__} submits no jobs")
