"""Holding a run folder: one run writes it at a time (`hold`), and jobs of a sweep on one machine take
turns (`take_turn`). flock locks, so the kernel drops a lock when its holder dies."""

from __future__ import annotations

import fcntl
import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager

from cpbench.core import ConfigError
from cpbench.results.paths import RunPaths


class FolderLocked(ConfigError):
    """Another run holds the folder."""


def check_writable(folder: RunPaths) -> None:
    """Fail before anything starts when the folder cannot hold a run (a file, no permission)."""
    if folder.root.exists() and not folder.root.is_dir():
        raise ConfigError(f"output_dir={folder.root}: is a file; give a folder")
    try:
        folder.root.mkdir(parents=True, exist_ok=True)
        with open(folder.root / f".cpbench-write-test-{os.getpid()}", "w") as probe:
            os.unlink(probe.name)
    except OSError as err:
        raise ConfigError(f"output_dir={folder.root}: cannot be written ({err.strerror})") from None


@contextmanager
def hold(folder: RunPaths) -> Iterator[None]:
    """One run per folder: two runs appending to one results.csv lose rows. A later run takes a stale
    lock file (its holder died) over."""
    folder.root.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder.lock_file, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.read(fd, 200).decode(errors="replace").strip() or "another process"
        os.close(fd)
        raise FolderLocked(
            f"output_dir={folder.root}: another run writes there ({holder}); "
            "wait for it to end, or give this run another output_dir"
        ) from None
    try:
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode())
        yield
    finally:
        folder.lock_file.unlink(missing_ok=True)  # still held: a run that opens it now finds it locked
        os.close(fd)  # releases the lock


@contextmanager
def take_turn(folder: RunPaths) -> Iterator[None]:
    """Wait for the folder's turn lock, then hold it: jobs of a sweep sharing one machine run one after
    another, not timing each other."""
    folder.root.mkdir(parents=True, exist_ok=True)
    with open(folder.turn_file, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield
