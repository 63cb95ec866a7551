"""Out of memory in each of its faces, told apart from every other failure."""

from __future__ import annotations

import torch

# oneDNN reports an allocation that failed under the cap as a primitive it could not create.
_CPU_OOM = ("DefaultCPUAllocator: can't allocate memory", "CPU out of memory", "could not create a primitive")


class BudgetExceeded(RuntimeError):
    """A rank's peak went over the configured `memory.budget_gib`."""


def is_oom(err: BaseException) -> bool:
    if isinstance(err, (torch.OutOfMemoryError, MemoryError, BudgetExceeded)):
        return True
    return isinstance(err, RuntimeError) and any(text in str(err) for text in _CPU_OOM)


def describe(err: BaseException) -> str:
    """One line: the exception type and the first line of its message."""
    lines = str(err).strip().splitlines()
    return f"{type(err).__name__}: {lines[0] if lines else ''}"
