"""The local launcher: `cp` ranks on this machine through torch's elastic launch API (rendezvous on a
free localhost port), relaunched after a crash; or one rank in this process (cp=1 outside a sweep)."""

from __future__ import annotations

import gc
import json
import logging
import os
import signal
import tempfile
import time
import uuid
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.launcher.api import LaunchConfig, elastic_launch

from cpbench.core import DoesNotFit, Topology
from cpbench.launch import rank_server
from cpbench.launch.base import (
    Finished,
    Launcher,
    Notify,
    RankFailure,
    Restarting,
    ShapeDoesNotFit,
    check_gpus,
    is_consequence,
)
from cpbench.measure.oom import KernelFault
from cpbench.measure.point import OutOfMemoryAlone
from cpbench.rank import RunSpec, run_rank
from cpbench.results.folder import RunFolder
from cpbench.settings.schema import BenchConfig
from cpbench.workloads.base import Workload

# How long a rank that failed only because a peer died waits before it ends (`_rank`).
_CONSEQUENCE_GRACE_S = 2.0


@dataclass(frozen=True)
class LocalSettings:
    """The local launcher's settings: how many ranks, how often they relaunch, and whether one rank
    runs in this very process (cp=1 outside a sweep: in a sweep every job's ranks are processes of
    their own, so that one job leaves nothing behind in the next)."""

    cp: int
    max_restarts: int
    in_process: bool
    backend: str | None


class LocalLauncher(Launcher):
    """The default: cpbench starts the ranks itself, on this machine."""

    def __init__(self, settings: LocalSettings):
        self.settings = settings
        # This process forks the ranks (through the rank server, started again when it died, and for
        # each launch of a sweep) and must never initialise CUDA. cpbench's own checks ask NVML
        # (`visible_gpus`); torch's own, here before any launch (the fake-tensor estimate's FakeTensorMode
        # and DeviceMesh, LaunchConfig since torch 2.9), call torch.cuda.is_available(), which runs cuInit
        # unless told to ask NVML.
        os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")

    @classmethod
    def chosen(cls, settings: BenchConfig) -> bool:
        return True  # the last in the registry: what runs when no other launcher is chosen

    @classmethod
    def from_settings(cls, settings: BenchConfig, in_sweep: bool) -> LocalLauncher:
        cp = settings.topology.cp
        return cls(LocalSettings(cp, settings.launch.max_restarts, cp == 1 and not in_sweep,
                                 settings.dist.backend))  # fmt: skip

    def validate(self, topology: Topology, ranks_run: bool = True) -> None:
        if ranks_run:
            check_gpus(self.settings.backend, topology.cp, topology.cp)

    def start(self, spec: RunSpec, workload: Workload | None, notify: Notify) -> Finished:
        """Raises ShapeDoesNotFit (a run of one fixed shape out of memory) or RankFailure."""
        try:
            if self.settings.in_process:
                run_rank(spec, workload)
            else:
                launch_local(spec, self.settings.cp, self.settings.max_restarts, notify)
        except DoesNotFit as err:  # in this process
            raise ShapeDoesNotFit(str(err)) from None
        except KernelFault as err:  # in this process, whose CUDA context is dead: no restart here
            reason = f"{KernelFault.__name__}: {err}; recorded, run the same command to go on"
            raise RankFailure(0, reason, "", crashed=False) from None
        return Finished()


def _reported(err: ChildFailedError) -> dict[int, tuple[Any, int]]:
    """(message, exit code) per failed rank: those the agent saw, plus ranks whose error file was
    written while the agent was already ending the job (the root cause is often among them).
    A file still being written when the agent killed its rank is skipped."""
    found = {rank: (f.message, f.exitcode) for rank, f in err.failures.items()}
    for failure in err.failures.values():
        attempt = Path(failure.error_file).parent.parent
        for path in attempt.glob("*/error.json"):
            rank = int(path.parent.name)
            if rank in found:
                continue
            try:  # a rank killed while writing it leaves the file empty or cut short
                found[rank] = (json.loads(path.read_text())["message"], 1)
            except (OSError, ValueError, KeyError):
                continue
    return found


def _failure(err: ChildFailedError) -> RankFailure:
    """The root cause: the first rank to fail on its own, not a peer that lost its connection to it."""
    reported = _reported(err)

    def consequence(rank: int) -> bool:
        message = reported[rank][0]
        return is_consequence(message.get("message", "") if isinstance(message, dict) else str(message))

    rank = min(reported, key=lambda r: (consequence(r), r))
    message, exitcode = reported[rank]
    if isinstance(message, dict):
        stack = message.get("extraInfo", {}).get("py_callstack", "")
        head = "\n".join(stack.strip().splitlines()[-4:])
        reason = message.get("message", "").strip()
        restart = consequence(rank) or reason.startswith((OutOfMemoryAlone.__name__, KernelFault.__name__))
        return RankFailure(rank, reason, head, crashed=restart)
    return RankFailure(rank, str(message or f"exit code {exitcode}"), "", crashed=True)


def launch_local(spec: RunSpec, nprocs: int, max_restarts: int, notify: Notify) -> None:
    """Run `run_rank(spec)` in `nprocs` local processes. When a rank crashes (killed, or stuck
    behind a dead peer until the collective timeout) relaunch them all, up to `max_restarts` times:
    the run resumes from its persisted state. A rank that ran out of memory alone is a finding, not a
    crash: its N is recorded as oom and never tried again, so such restarts are bounded by the probe's
    steps and spend none of `max_restarts` (a probe near the edge would otherwise use it up with
    answers). A kernel fault is a finding too: the rank recorded it at its N, which bounds the probe
    from above, so that no N from it up is tried again. A rank that raises ends the job: raise
    RankFailure, or ShapeDoesNotFit when what it raised was DoesNotFit (a run of one fixed shape out of
    memory)."""
    crashes = findings = faults = 0
    while True:
        try:
            restarted = replace(spec, restart=crashes + findings + faults, max_restarts=max_restarts)
            return _launch_once(restarted, nprocs)
        except RankFailure as failure:
            if failure.error_type == DoesNotFit.__name__:
                raise ShapeDoesNotFit(failure.message) from None
            if not failure.crashed:
                raise
            if failure.error_type == OutOfMemoryAlone.__name__:
                findings += 1
                line = (
                    f"rank {failure.rank}: {failure.message}; recorded as oom, the ranks restart to go on "
                    f"(out-of-memory restart {findings}, not counted against launch.max_restarts)"
                )
            elif failure.error_type == KernelFault.__name__:
                faults += 1
                line = (
                    f"rank {failure.rank}: {failure.message}; recorded as a kernel fault, the ranks restart "
                    f"to go on (kernel-fault restart {faults}, not counted against launch.max_restarts)"
                )
            else:
                crashes += 1
                if crashes > max_restarts:
                    raise
                line = f"{failure}; relaunching, the run resumes (restart {crashes} of {max_restarts})"
            notify(Restarting(line))


def _launch_once(spec: RunSpec, nprocs: int) -> None:
    log_dir = RunFolder(spec.output_dir).launch_logs
    log_dir.mkdir(parents=True, exist_ok=True)
    rank_server.ensure_running("cpbench.launch.rank_image")
    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=nprocs,
        rdzv_backend="c10d",
        rdzv_endpoint="localhost:0",
        run_id=str(uuid.uuid4()),
        max_restarts=0,
        monitor_interval=0.1,
        start_method="forkserver",
        logs_specs=DefaultLogsSpecs(log_dir=str(log_dir)),
    )
    # The agent logs each failure at length; cpbench reports it in one message instead.
    # Some of its loggers set their own level (e.g. the agent's "Received 2 death signal" warning).
    names = [
        n
        for n in logging.root.manager.loggerDict
        if n.startswith(("torch.distributed.elastic", "torch.multiprocessing"))
    ]
    for name in ("torch.distributed.elastic", "torch.multiprocessing", *names):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    # torch's launch leaves an error file per failed rank in the temporary folder: keep them in the logs.
    tempdir, tempfile.tempdir = tempfile.tempdir, str(log_dir)
    try:
        elastic_launch(config, _rank)(spec)
    except ChildFailedError as err:
        raise _failure(err) from None
    finally:
        tempfile.tempdir = tempdir
        # The agent's rendezvous keeps a heartbeat thread whose weakref.finalize joins it. Left to a later
        # collection, an interrupted run's agent could be collected on that very thread, which then
        # printed "cannot join current thread" with a traceback (seen once under SIGTERM): collected here,
        # on the main thread, at once.
        gc.collect()


def _rank(spec: RunSpec) -> None:
    """A rank of this launcher: Ctrl-C reaches every process of the terminal's group, and the agent
    passes SIGTERM on; either ends a rank silently (the launching process reports it in one line)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        run_rank(spec)
    except Exception as err:
        # The agent reports the first failed rank it sees, and a rank killed outright leaves no error
        # file: a rank that only lost its peer waits, so that the peer's own end is the one seen.
        if is_consequence(str(err)):
            time.sleep(_CONSEQUENCE_GRACE_S)
        raise
