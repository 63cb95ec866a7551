"""Same answer twice: every random generator a workload may draw from, seeded from `seed`."""

from __future__ import annotations

import random

import numpy as np
import torch


def seed_all(seed: int) -> None:
    """Seed torch (every device), numpy and `random`; called before build_model and every build_batch."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
