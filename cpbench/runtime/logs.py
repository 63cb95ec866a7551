"""Logging: rank 0 speaks on the console (every rank with log.all_ranks); every rank keeps a file."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

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
