"""Same answer twice: every random generator a workload may draw from, seeded from `seed`; and in
mode=accuracy, deterministic algorithms."""

from __future__ import annotations

import os
import random

import numpy as np
import torch

# cuBLAS needs a fixed workspace to be deterministic, set before CUDA initialises (torch's docs on
# reproducibility); without it use_deterministic_algorithms(True) makes cuBLAS calls raise.
CUBLAS_WORKSPACE_CONFIG = ":4096:8"


def seed_all(seed: int) -> None:
    """Seed torch (every device), numpy and `random`; called before build_model and every build_batch."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def deterministic(on: bool) -> None:
    """mode=accuracy: deterministic algorithms only (an op without one raises rather than answer
    differently); mode=speed: off, as they cost speed. Call before CUDA initialises."""
    if on:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE_CONFIG)
    # Only a change is set: the call imports torch's compiler stack (about 1.5 s of every process's
    # start-up), and off is torch's default.
    if torch.are_deterministic_algorithms_enabled() != on:
        torch.use_deterministic_algorithms(on)
