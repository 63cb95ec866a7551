"""Ctrl-C and SIGTERM end a run cleanly: the point in flight marked to be measured again, the report
from the rows so far, one line, exit 128 + the signal."""

from __future__ import annotations

import contextlib
import signal
import sys
from collections.abc import Iterator

from cpbench.app.outcome import close_failed
from cpbench.probe.in_flight import InFlight
from cpbench.results.folder import RunFolder


class Interrupted(BaseException):
    """SIGTERM, raised in the main thread like SIGINT's KeyboardInterrupt, so the run can close."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def _raise_interrupted(signum: int, frame: object) -> None:
    raise Interrupted(signum)


@contextlib.contextmanager
def signals_end_the_run() -> Iterator[None]:
    """SIGTERM (a scheduler's preemption, `kill`) ends the run as Ctrl-C does. While ranks run,
    torch's elastic agent has its own handlers (SignalException); it stops the ranks first."""
    previous = signal.signal(signal.SIGTERM, _raise_interrupted)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def in_flight(folder: RunFolder) -> str | None:
    """The point or probe N being measured, as a person reads it (for a run whose ranks crashed)."""
    return InFlight(folder).where()


def close_interrupted(folder: RunFolder, cp: int, stop: BaseException, leads: bool) -> int:
    """Close an interrupted run: its point in flight marked `interrupted` (measured again on resume,
    not counted as a crash), the report written from the rows so far, failure.json; one line. Only
    the process that `leads` the run closes it (under torchrun, rank 0)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C does not cut the closing short
    signum = getattr(stop, "signum", None) or getattr(stop, "sigval", None) or signal.SIGINT
    if not leads:
        return 128 + signum
    where = InFlight(folder).interrupt()
    where = f"at {where}" if where else ("between points" if folder.results.exists() else "at start-up")
    line = f"interrupted {where}; run the same command to resume"
    close_failed(folder, cp, "interrupted", line, 128 + signum)
    print(f"cpbench: {line}", file=sys.stderr)
    return 128 + signum
