"""Peak memory of one rank, reset per point: CUDA allocator stats, or the CPU process's peak RSS."""

from __future__ import annotations

import gc
from pathlib import Path

import torch

_CLEAR_REFS = Path("/proc/self/clear_refs")
_STATUS = Path("/proc/self/status")


def release(device: torch.device) -> None:
    """Return freed memory so the next point starts clean (call outside any `except` block)."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    else:
        _CLEAR_REFS.write_text("5")  # resets VmHWM to the current resident set


def read_peak_gib(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    for line in _STATUS.read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 2**20  # kB
    raise RuntimeError("VmHWM missing from /proc/self/status")
