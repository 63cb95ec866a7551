"""A per-rank memory cap set over what the rank holds after start-up: on a GPU the caching
allocator's limit (the card, or a smaller one emulated on it), which makes allocations really fail; on
CPU the measured peak resident set, which is what a point's peak is measured in, with an RLIMIT_DATA
(address space) above it as a backstop that ends a runaway step early."""

from __future__ import annotations

import ctypes
import re
import resource
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from cpbench.measure.memory import GIB, read_peak_gib, release
from cpbench.runtime.logs import LOG
from cpbench.settings.schema import MemoryConfig

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc mallopt parameters
# CPU: address space allowed beyond the budget. A cap on address space is not one on resident memory
# (reserved, untouched and freed-but-mapped pages count in one, not the other): the fit is judged on
# the measured resident peak, the figure a row reports, and the backstop stays out of its way.
BACKSTOP_FACTOR, BACKSTOP_GIB = 2.0, 0.25
# CPU: what a full measurement's later steps add to its first step's resident peak (allocations of gloo
# and of Python that outlive a step). fold_small at cp=2: a probe step at N=266 peaked 1.6 MiB under a
# 0.05 GiB cap and its full measurement then went over it on rank 1; over 30 steps at N=128 the peak
# rose 1.8 MiB. A single step that stands for a full measurement (a probe step) is held to the cap
# less this; a GPU's caching allocator repeats its peak step after step.
CPU_CREEP_GIB = 2 / 1024


def _status_bytes(field: str) -> int:
    text = Path("/proc/self/status").read_text()
    return int(re.search(rf"^{field}:\s+(\d+) kB", text, re.MULTILINE).group(1)) * 1024


def cap_gib(memory: MemoryConfig, device_type: str) -> float | None:
    """The per-rank cap of a run whose ranks run on `device_type`: memory.budget_gib, or on CPU, where
    the machine's RAM is no device memory worth probing to its end, memory.cpu_budget_gib when that is
    null. The ranks apply it and the fake-tensor estimate is held against it: one rule for both. Null
    on CUDA: the card less what a rank holds after start-up, which only the rank can measure
    (`cap_rank`); the launching process, which never touches CUDA, has no figure for it."""
    if memory.budget_gib is None and device_type == "cpu":
        return memory.cpu_budget_gib
    return memory.budget_gib


@dataclass(frozen=True)
class Cap:
    """A rank's cap, applied: a point fits while its peak less `baseline_gib` stays within `gib`."""

    gib: float  # per rank, over the baseline
    baseline_gib: float  # the part of the peak held before any step (CPU: VmHWM; CUDA: tensors)
    # CUDA: what the device held when the cap was set (the CUDA context, NCCL's buffers, tensors and
    # anything else on the card), which the card's memory less it leaves for the rank; None on CPU.
    held_gib: float | None = None
    note: str = ""  # how `gib` was derived from the cap, when it is not the cap itself

    def over(self, peak_over_gib: float) -> str:
        """What a BudgetExceeded says."""
        return f"peak {peak_over_gib:.3f} GiB over the baseline exceeds {self.gib:.3g} GiB{self.note}"

    def for_one_step(self) -> Cap:
        """The cap for a single step that stands for a full measurement: on CPU less CPU_CREEP_GIB."""
        if self.held_gib is not None:
            return self
        note = f" (the {self.gib:g} GiB cap less {CPU_CREEP_GIB * 1024:g} MiB a full measurement adds)"
        return replace(self, gib=self.gib - CPU_CREEP_GIB, note=note)


def cap_rank(memory: MemoryConfig, device: torch.device) -> Cap | None:
    """This rank capped at `budget_gib`'s answer for its device, or None where there is no cap. On a
    GPU there always is one: with budget_gib null, the card's memory less what the rank holds now."""
    gib = cap_gib(memory, device.type)
    if device.type == "cuda":
        return _cap_gpu(gib, device)
    return None if gib is None else Cap(gib, _cap_cpu(gib, device))


def gpu_cap(requested_gib: float | None, free: int, total: int, allocated: int) -> tuple[float, float]:
    """(budget GiB, the caching allocator's fraction of the card) for a rank that sees `free` of `total`
    bytes with `allocated` in its tensors: what was asked, never more than is free (an "80 GB" card
    holds about 79.1-79.6 GiB, less its context), and the allocator's limit on its segments set at its
    tensors plus that budget, so that a peak of tensors over the baseline stays within the budget."""
    gib = free / GIB if requested_gib is None else min(requested_gib, free / GIB)
    return gib, min(1.0, (allocated + gib * GIB) / total)


def _cap_gpu(requested_gib: float | None, device: torch.device) -> Cap:
    """The caching allocator limited by `gpu_cap` (`set_per_process_memory_fraction` limits only its
    own segments: the context and NCCL's buffers are what mem_get_info finds held already)."""
    release(device)  # cached segments hold nothing yet: they are the rank's to use, not start-up's
    free, total = torch.cuda.mem_get_info(device)
    allocated = torch.cuda.memory_allocated(device)
    gib, fraction = gpu_cap(requested_gib, free, total, allocated)
    if requested_gib is not None and gib < requested_gib:
        LOG.warning(
            "memory.budget_gib=%g: the device has %.2f GiB free after start-up (%.2f of %.2f GiB held): "
            "capped at that", requested_gib, gib, (total - free) / GIB, total / GIB,
        )  # fmt: skip
    torch.cuda.set_per_process_memory_fraction(fraction, device)
    return Cap(gib, allocated / GIB, (total - free) / GIB)


def _cap_cpu(budget_gib: float, device: torch.device) -> float:
    """Cap this rank's data segment at the backstop over what it holds now and return its baseline
    (GiB: the resident set so far, which the fits-check subtracts from the measured peak, held to
    `budget_gib`). `lift_cap` takes the cap off again: it is for the measured steps, not what
    follows them."""
    # Blocks from mmap go back to the OS when freed; glibc's dynamic threshold would otherwise move
    # them onto the heap, whose fragments count against the cap and make a point that fits once fail
    # when it is repeated. At 128 KiB (glibc's initial threshold, held) a fold_small step's peak at
    # N=300 repeated within 1 MB over 8 steps; at 1 MiB it moved over 6 MB and crept up from step to
    # step, at a step about a quarter faster (page faults of fresh mappings).
    libc = ctypes.CDLL(None)
    libc.mallopt(_M_MMAP_THRESHOLD, 128 << 10)
    libc.mallopt(_M_TRIM_THRESHOLD, 1 << 20)
    limit = _status_bytes("VmData") + int((BACKSTOP_FACTOR * budget_gib + BACKSTOP_GIB) * GIB)
    _, hard = resource.getrlimit(resource.RLIMIT_DATA)
    resource.setrlimit(resource.RLIMIT_DATA, (limit, hard))
    return read_peak_gib(device)


def lift_cap(device: torch.device) -> None:
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
    lift_cap(device)
    try:
        yield
    finally:
        release(device)
        ctypes.CDLL(None).malloc_trim(0)
        resource.setrlimit(resource.RLIMIT_DATA, (soft, hard))
