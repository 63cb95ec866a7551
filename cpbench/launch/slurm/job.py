"""One cpbench run as one SLURM job through submitit: the executor, and what every task runs (one rank
that takes its torch.distributed environment from the job).

The job is checkpointable: on timeout submitit calls `checkpoint`, which marks the point being measured
as interrupted (not broken) and requeues the same callable; SIGTERM (a preemption, scancel) marks it so
too. The requeued ranks skip every point already in results.csv, so nothing measured is lost or measured
twice. When there is no requeue left, the end of the job reaches submitit past every `except Exception`
of the rank and of the workload's step (see `JobEnds`)."""

from __future__ import annotations

import functools
import logging
import os
import signal
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, replace

import submitit
from submitit.core.utils import UncompletedJobError
from submitit.helpers import Checkpointable, DelayedSubmission, TorchDistributedEnvironment

from cpbench.launch.slurm.layout import executor_parameters, layout
from cpbench.launch.slurm.quiet import log_submitit_to
from cpbench.probe.in_flight import WorkInFlight
from cpbench.rank import RunSpec, run_rank
from cpbench.results.folder import RunFolder
from cpbench.runtime.startup import freeze_loaded
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
    WorkInFlight(folder).interrupt()


# Where rank 0 of a job listens for its peers (MASTER_PORT). submitit picks 20000-60000 from the job id,
# which overlaps Linux's ephemeral range (net.ipv4.ip_local_port_range, 32768-60999 by default), where
# the kernel numbers every outgoing connection's port: on the one-node test cluster a job's pick was
# such a port already in use, and its rank 0 failed with EADDRINUSE. Below that range only a service
# bound on purpose can hold it.
MASTER_PORTS = range(20000, 32768)


def master_port(job_id: str) -> int:
    """The job's MASTER_PORT: the same for every task and every requeue of one job (its id)."""
    return MASTER_PORTS[zlib.crc32(job_id.encode()) % len(MASTER_PORTS)]


def export_torch_environment() -> TorchDistributedEnvironment:
    """This task's torch.distributed environment from the job (rank, world size, master address and
    port); a MASTER_PORT the user exported is kept."""
    os.environ.setdefault("MASTER_PORT", str(master_port(submitit.JobEnvironment().job_id)))
    return TorchDistributedEnvironment().export(set_cuda_visible_devices=False, overwrite=True)


def restart_count() -> int:
    """How many times SLURM started this job before (a requeue after a preemption or a timeout)."""
    return int(os.environ.get("SLURM_RESTART_COUNT", "0"))


class SlurmRanks(Checkpointable):
    """What every task of the job runs: export the torch.distributed environment of this task
    (rank, world size, master address and port from SLURM's variables), then run one rank."""

    def __call__(self, spec: RunSpec) -> None:
        freeze_loaded()  # what unpickling this callable imported: torch, the rank loop
        # Every rank sees all GPUs of its node and picks cuda:LOCAL_RANK, as under torchrun.
        env = export_torch_environment()
        # After submitit's own handlers, which let SIGTERM pass (it waits for USR2 to checkpoint).
        signal.signal(signal.SIGTERM, functools.partial(_end_interrupted, spec.output_dir, env.rank))
        with job_end_escapes():
            run_rank(replace(spec, restart=restart_count()))

    def checkpoint(self, spec: RunSpec) -> DelayedSubmission:
        """Called on task 0 when the job is timed out or preempted, just before it is requeued."""
        interrupt(RunFolder(spec.output_dir))
        return DelayedSubmission(self, spec)


class JobEnds(BaseException):
    """The job ends here: submitit's warning-signal handler will not requeue it (timed out too many
    times) and raised UncompletedJobError wherever the rank was. That error is a RuntimeError, which an
    `except Exception` can take for its own: the FLOP count's (a step it cannot trace) did, and the
    rank went on measuring until SLURM killed it, leaving no result. As a BaseException it passes them."""

    def __init__(self, error: UncompletedJobError):
        super().__init__(str(error))
        self.error = error


@contextmanager
def job_end_escapes(signum: int = signal.SIGUSR2) -> Iterator[None]:
    """Within it, the UncompletedJobError of submitit's handler for `signum` travels as `JobEnds`, and
    leaves as itself: submitit writes it as the task's result, as it would have."""
    handler = signal.getsignal(signum)
    if not callable(handler):  # not under submitit: nothing to carry
        yield
        return

    def escaping(number: int, frame: object) -> None:
        try:
            handler(number, frame)
        except UncompletedJobError as err:
            raise JobEnds(err) from None

    signal.signal(signum, escaping)
    try:
        yield
    except JobEnds as end:
        raise end.error from None
    finally:
        signal.signal(signum, handler)


def _end_interrupted(output_dir: str, rank: int, signum: int, frame: object) -> None:
    """SLURM ends a job's tasks with SIGTERM, then SIGKILL `KillWait` later: `scontrol requeue` (a
    preemption), scancel, a time limit reached. Each is an interruption; rank 0 marks the point in
    flight so, and every rank leaves at once (a rank that went on could start the next point)."""
    if rank == 0:
        interrupt(RunFolder(output_dir))
    logging.shutdown()
    os._exit(128 + signum)


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
