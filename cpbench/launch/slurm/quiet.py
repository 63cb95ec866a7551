"""What the submitting process hears from submitit and the commands it runs, kept off the console:
submitit prints each warning on stdout and stderr and Hydra's root logger a third time, on every poll
("Call #N - Bypassing sacct error ..."), and sacct, which fails on a cluster without accounting,
writes its own line to the inherited stderr each time. Both go to a log file beside the jobs' folders,
each line once."""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any


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


@contextlib.contextmanager
def children_stderr_to_log() -> Iterator[None]:
    """While inside: what child processes write to the inherited stderr (sacct, which submitit runs to
    poll its jobs) goes into submitit's log (`log_submitit_to`), each line once; this process's own
    `sys.stderr` stays the console."""
    sys.stderr.flush()
    console, (read, write) = os.dup(2), os.pipe()
    os.dup2(write, 2)
    os.close(write)
    previous, sys.stderr = sys.stderr, open(console, "w", buffering=1, closefd=False)  # noqa: SIM115
    reader = threading.Thread(target=_log_lines, args=(read,), daemon=True)
    reader.start()
    try:
        yield
    finally:
        ours, sys.stderr = sys.stderr, previous
        ours.close()  # flushed; the console's descriptor stays open (closefd=False)
        os.dup2(console, 2)  # the pipe's last writer closes: the reader ends
        os.close(console)
        reader.join(timeout=10)


def _log_lines(read: int) -> None:
    log = logging.getLogger("submitit.stderr")
    with os.fdopen(read, errors="replace") as lines:
        for line in lines:
            if line.strip():
                log.warning("a command's stderr: %s", line.rstrip())
