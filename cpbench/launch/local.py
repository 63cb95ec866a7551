"""Launch `cp` ranks on this machine through torch's elastic launch API and wait for them."""

from __future__ import annotations

import json
import logging
import signal
import sys
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.launcher.api import LaunchConfig, elastic_launch

from cpbench.measure.point import OutOfMemoryAlone
from cpbench.rank import RunSpec, run_rank
from cpbench.results.folder import RunFolder


@dataclass
class RankFailure(Exception):
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


# Messages of ranks that failed only because a peer had died first.
_CONSEQUENCES = ("closed by peer", "reset by peer", "remote worker", "socket timeout", "timed out")


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
        text = message.get("message", "") if isinstance(message, dict) else str(message)
        return any(c in text.lower() for c in _CONSEQUENCES)

    rank = min(reported, key=lambda r: (consequence(r), r))
    message, exitcode = reported[rank]
    if isinstance(message, dict):
        stack = message.get("extraInfo", {}).get("py_callstack", "")
        head = "\n".join(stack.strip().splitlines()[-4:])
        reason = message.get("message", "").strip()
        restart = consequence(rank) or reason.startswith(OutOfMemoryAlone.__name__)
        return RankFailure(rank, reason, head, crashed=restart)
    return RankFailure(rank, str(message or f"exit code {exitcode}"), "", crashed=True)


def launch_local(spec: RunSpec, nprocs: int, max_restarts: int = 0) -> None:
    """Run `run_rank(spec)` in `nprocs` local processes. When a rank crashes (killed, or stuck
    behind a dead peer until the collective timeout) relaunch them all, up to `max_restarts` times:
    the run resumes from its persisted state. A rank that raises ends the job: raise RankFailure."""
    for restart in range(max_restarts + 1):
        try:
            return _launch_once(spec, nprocs)
        except RankFailure as failure:
            if not failure.crashed or restart == max_restarts:
                raise
            again = f"restart {restart + 1} of {max_restarts}"
            if failure.error_type == OutOfMemoryAlone.__name__:  # a finding, not a crash
                line = f"rank {failure.rank}: {failure.message}; recorded as oom, the ranks restart to go on"
            else:
                line = f"{failure}; relaunching, the run resumes"
            print(f"cpbench: {line} ({again})", file=sys.stderr)


def _launch_once(spec: RunSpec, nprocs: int) -> None:
    log_dir = RunFolder(spec.output_dir).launch_logs
    log_dir.mkdir(parents=True, exist_ok=True)
    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=nprocs,
        rdzv_backend="c10d",
        rdzv_endpoint="localhost:0",
        run_id=str(uuid.uuid4()),
        max_restarts=0,
        monitor_interval=0.1,
        start_method="spawn",
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
    # torch's spawn leaves an error file per failed rank in the temporary folder: keep them in the logs.
    tempdir, tempfile.tempdir = tempfile.tempdir, str(log_dir)
    try:
        elastic_launch(config, _rank)(spec)
    except ChildFailedError as err:
        raise _failure(err) from None
    finally:
        tempfile.tempdir = tempdir


def _rank(spec: RunSpec) -> None:
    """A rank of this launcher: Ctrl-C reaches every process of the terminal's group, and the agent
    passes SIGTERM on; either ends a rank silently (the launching process reports it in one line)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    run_rank(spec)
