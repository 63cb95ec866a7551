"""A per-rank memory cap that makes allocations really fail: a smaller GPU emulated on a big one,
or on CPU an RLIMIT_DATA set over the rank's baseline after start-up."""

from __future__ import annotations

import ctypes
import re
import resource
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

from cpbench.measure.memory import read_peak_gib, release
from cpbench.settings.schema import MemoryConfig

GIB = 2**30
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc mallopt parameters


def _status_bytes(field: str) -> int:
    text = Path("/proc/self/status").read_text()
    return int(re.search(rf"^{field}:\s+(\d+) kB", text, re.MULTILINE).group(1)) * 1024


def budget_gib(memory: MemoryConfig, device_type: str) -> float | None:
    """The per-rank cap of a run whose ranks run on `device_type`: memory.budget_gib, or on CPU, where
    the machine's RAM is no device memory worth probing to its end, memory.cpu_budget_gib when that is
    null. The ranks apply it and the fake-tensor estimate is held against it: one rule for both."""
    if memory.budget_gib is None and device_type == "cpu":
        return memory.cpu_budget_gib
    return memory.budget_gib


@dataclass(frozen=True)
class Budget:
    """A rank's cap, applied."""

    gib: float  # per rank, over the baseline
    baseline_gib: float  # what the rank held after start-up (CPU); 0 on CUDA


def cap_rank(memory: MemoryConfig, device: torch.device) -> Budget | None:
    """This rank capped at `budget_gib`'s answer for its device, or None where there is no cap."""
    gib = budget_gib(memory, device.type)
    return None if gib is None else Budget(gib, _apply_budget(gib, device))


def _apply_budget(budget_gib: float, device: torch.device) -> float:
    """Cap this rank at `budget_gib` and return the baseline the cap sits on (GiB), which the
    fits-check subtracts from the measured peak (0 on CUDA, whose stats count only tensors).
    `lift_budget` takes the cap off again: it is for the measured steps, not what follows them."""
    if device.type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, budget_gib * GIB / total), device)
        return 0.0
    # Large blocks from mmap go back to the OS when freed; glibc's dynamic threshold would otherwise
    # move them onto the heap, whose fragments count against the cap and make a point that fits
    # once fail when it is repeated.
    libc = ctypes.CDLL(None)
    libc.mallopt(_M_MMAP_THRESHOLD, 1 << 20)
    libc.mallopt(_M_TRIM_THRESHOLD, 1 << 20)
    limit = _status_bytes("VmData") + int(budget_gib * GIB)
    _, hard = resource.getrlimit(resource.RLIMIT_DATA)
    resource.setrlimit(resource.RLIMIT_DATA, (limit, hard))
    return read_peak_gib(device)


def lift_budget(device: torch.device) -> None:
    """No cap: the report, its plots and anything else after the measured steps must not fail for
    want of memory the steps were denied (a cp=1 run measures in the launching process itself)."""
    if device.type == "cuda":
        torch.cuda.set_per_process_memory_fraction(1.0, device)
        return
    _, hard = resource.getrlimit(resource.RLIMIT_DATA)
    resource.setrlimit(resource.RLIMIT_DATA, (hard, hard))


@contextmanager
def cap_lifted(device: torch.device) -> Iterator[None]:
    """The cap off for work that is no measured step (counting FLOPs on fake tensors: its Python
    objects would count against a CPU cap), then back at the same limit, what that work freed given
    back first. Fake tensors hold no device memory, so a CUDA cap stays."""
    if device.type == "cuda":
        yield
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
    lift_budget(device)
    try:
        yield
    finally:
        release(device)
        ctypes.CDLL(None).malloc_trim(0)
        resource.setrlimit(resource.RLIMIT_DATA, (soft, hard))
