"""One cpbench run as one SLURM job through submitit: the executor, and what every task runs (one rank
that takes its torch.distributed environment from the job).

A rank that runs out of memory alone (its peers wait in a collective it never joins) records its N as
oom and requeues the job (`requeue_job`), which resumes past it: the ranks restart within the job, as
the local launcher relaunches them.

The job is checkpointable: on timeout submitit calls `checkpoint`, which marks the point being measured
as interrupted (not broken) and requeues the same callable; SIGTERM (a preemption, scancel) marks it so
too. The requeued ranks skip every point already in results.csv, so nothing measured is lost or measured
twice. When there is no requeue left, the end of the job reaches submitit past every `except Exception`
of the rank and of the workload's step (see `JobEnds`).

A rank that cannot join the job's process group (rank 0's address does not resolve or cannot be reached
from its node) fails in one line that names the address and what to set (`RendezvousFailed`), rather
than in torch's connect timeout, which only the task's log held."""

from __future__ import annotations

import functools
import logging
import os
import signal
import subprocess
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, replace

import submitit
import torch.distributed as dist
from submitit.core.utils import UncompletedJobError
from submitit.helpers import Checkpointable, DelayedSubmission, TorchDistributedEnvironment

from cpbench.launch.slurm.layout import executor_parameters, layout
from cpbench.launch.slurm.quiet import log_submitit_to
from cpbench.probe.in_flight import InFlight
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
    InFlight(folder).interrupt()


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
    port). A MASTER_ADDR or MASTER_PORT the user exported is kept: where the first node's name does not
    resolve on every node, MASTER_ADDR is the way out (submitit's export would overwrite it)."""
    os.environ.setdefault("MASTER_PORT", str(master_port(submitit.JobEnvironment().job_id)))
    env = TorchDistributedEnvironment()
    env.master_addr = os.environ.get("MASTER_ADDR", env.master_addr)
    return env.export(set_cuda_visible_devices=False, overwrite=True)


class RendezvousFailed(RuntimeError):
    """A rank could not join the job's process group at MASTER_ADDR:MASTER_PORT."""


def _in_rendezvous(error: BaseException) -> bool:
    """The error rose in torch's env:// rendezvous (joining the process group), not in later work."""
    trace = error.__traceback__
    while trace is not None:
        if trace.tb_frame.f_globals.get("__name__") == "torch.distributed.rendezvous":
            return True
        trace = trace.tb_next
    return False


def _what_to_set(master_addr: str) -> str:
    """What makes rank 0's address reachable: the first node's name (submitit's MASTER_ADDR), or the
    one the user exported."""
    if master_addr == submitit.JobEnvironment().hostnames[0]:
        return (
            "the job's first node name must resolve on every node (DNS or /etc/hosts), "
            "or export MASTER_ADDR=<an address every node reaches>"
        )
    return f"MASTER_ADDR={master_addr} was exported: export an address every node reaches"


def _rendezvous_message(
    error: dist.DistError, env: TorchDistributedEnvironment, timeout_s: float
) -> str | None:
    """One line for a failure to meet at rank 0's address, naming it and what to set; None for any
    other error of the rendezvous (a port rank 0 cannot listen on, ...). Rank 0 connects to its own
    address too. Rank 0 that timed out waiting for peers that never came says so: a consequence
    (`is_consequence`) of their failure, which the launcher names first when it has it."""
    at, within = f"{env.master_addr}:{env.master_port}", f"within dist.timeout_s={timeout_s:g}"
    if isinstance(error, dist.DistNetworkError) and "connect" in str(error):
        whom = "rank 0" if env.rank else "its own address"
        return f"rank {env.rank} could not reach {whom} at {at} {within}: {_what_to_set(env.master_addr)}"
    if isinstance(error, dist.DistStoreError) and "waiting for clients" in str(error):
        fix = _what_to_set(env.master_addr)
        return f"rank 0 timed out at {at} waiting for its peers {within}; if they could not reach it, {fix}"
    return None


@contextmanager
def rendezvous_failures(env: TorchDistributedEnvironment, timeout_s: float) -> Iterator[None]:
    """Within it, a rank's failure to meet its peers at MASTER_ADDR:MASTER_PORT leaves as one line
    (`RendezvousFailed`), the task's result: the launcher reports it as the job's failure."""
    try:
        yield
    except dist.DistError as err:
        if not _in_rendezvous(err) or (message := _rendezvous_message(err, env, timeout_s)) is None:
            raise
        raise RendezvousFailed(message) from err


def requeue_job() -> None:
    """The job runs again from its start, as a preemption makes it (`scontrol requeue`: SIGTERM to
    every task, then SLURM_RESTART_COUNT + 1): what a rank that ran out of memory alone asks for, its N
    recorded as oom. Each such requeue is a finding, bounded by the probe's steps like the local
    launcher's restarts for it; neither `launch.max_restarts` nor `slurm.max_requeues` (timeouts)
    counts it."""
    job_id = submitit.JobEnvironment().job_id
    done = subprocess.run(
        ["scontrol", "requeue", job_id], capture_output=True, text=True, timeout=60, check=False
    )
    if done.returncode:  # the job then fails with the rank's own error, which names the N
        logging.getLogger(__name__).error("scontrol requeue %s: %s", job_id, done.stderr.strip())


def restart_count() -> int:
    """How many times SLURM started this job before (a requeue after a preemption or a timeout)."""
    return int(os.environ.get("SLURM_RESTART_COUNT", "0"))


class SlurmRanks(Checkpointable):
    """What every task of the job runs: export the torch.distributed environment of this task
    (rank, world size, master address and port from SLURM's variables), then run one rank."""

    def __call__(self, spec: RunSpec) -> None:
        freeze_loaded()  # what unpickling this callable imported: torch, the rank loop
        # A rank sees all GPUs of its node and picks cuda:LOCAL_RANK, as under torchrun, or cuda:0 where
        # the site binds one GPU per task (runtime/rank.py `gpu_index`).
        env = export_torch_environment()
        # After submitit's own handlers, which let SIGTERM pass (it waits for USR2 to checkpoint).
        signal.signal(signal.SIGTERM, functools.partial(_end_interrupted, spec.output_dir, env.rank))
        with job_end_escapes(), rendezvous_failures(env, spec.settings.dist.timeout_s):
            requeues = spec.settings.slurm.max_requeues  # the job's own bound on starting again
            run_rank(replace(spec, restart=restart_count(), max_restarts=requeues), relaunch=requeue_job)

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
