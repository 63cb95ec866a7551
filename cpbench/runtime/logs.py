"""Logging: rank 0 speaks on the console (every rank with log.all_ranks); every rank keeps a file."""

from __future__ import annotations

import logging
import sys
import threading
import time
from pathlib import Path
from types import TracebackType

from rich.console import Console
from rich.logging import RichHandler

CONSOLE = Console(stderr=True)
LOG = logging.getLogger("cpbench")


def setup(rank: int, all_ranks: bool, log_file: Path) -> None:
    LOG.handlers.clear()
    LOG.setLevel(logging.DEBUG)
    LOG.propagate = False
    if rank == 0 or all_ranks:
        # Rich on a terminal; plain lines where output goes to a file or a SLURM log.
        console = (
            RichHandler(console=CONSOLE, show_path=False, markup=False)
            if CONSOLE.is_terminal
            else logging.StreamHandler(sys.stderr)
        )
        console.setLevel(logging.INFO)
        console.setFormatter(logging.Formatter(f"[rank {rank}] %(message)s" if all_ranks else "%(message)s"))
        LOG.addHandler(console)
    log_file.parent.mkdir(parents=True, exist_ok=True)
    file = logging.FileHandler(log_file)
    file.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    LOG.addHandler(file)


class Heartbeat:
    """Says what rank 0 is measuring, and for how long, every `every_s` seconds: a run piped to a
    file or a SLURM log is never silent for longer, however long a probe step or point takes."""

    def __init__(self, every_s: float | None):
        self.every_s = every_s
        self._what: str | None = None
        self._step = ""  # where inside it: the warm-up or timed step under way
        self._since = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="cpbench-heartbeat", daemon=True)

    def __enter__(self) -> Heartbeat:
        if self.every_s:
            self._thread.start()
        return self

    def __exit__(self, kind: type | None, error: BaseException | None, tb: TracebackType | None) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def now(self, what: str) -> None:
        self._what, self._step, self._since = what, "", time.monotonic()

    def step(self, where: str) -> None:
        self._step = where

    def _beat(self) -> None:
        while not self._stop.wait(self.every_s):
            if self._what:
                where = f" ({self._step})" if self._step else ""
                LOG.info("... %s%s, %.0f s so far", self._what, where, time.monotonic() - self._since)
