"""A per-rank memory cap set over what the rank holds after start-up: on a GPU the caching allocator's
limit (the card, or a smaller one emulated on it), which makes allocations really fail, taken after
every collective a point uses has run once (NCCL's buffers are then held already); on CPU the measured
peak resident set, which is what a point's peak is measured in, with an RLIMIT_DATA (address space)
above it as a backstop that ends a runaway step early. A point's fit is judged on the memory figure the
cap binds on: on a GPU the allocator's reserved segments, on CPU the resident peak."""

from __future__ import annotations

import ctypes
import re
import resource
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

import torch
import torch.distributed as dist

from cpbench.core import RankContext
from cpbench.distributed.warmup import warm_collectives
from cpbench.measure.memory import GIB, Peaks, read_peak_gib, release
from cpbench.runtime.logs import LOG
from cpbench.settings.schema import MemoryConfig

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc mallopt parameters
# CPU: address space allowed beyond the cap. A cap on address space is not one on resident memory
# (reserved, untouched and freed-but-mapped pages count in one, not the other): the fit is judged on
# the measured resident peak, the figure a row reports, and the backstop stays out of its way.
BACKSTOP_FACTOR, BACKSTOP_GIB = 2.0, 0.25
# CPU: what a full measurement's later steps add to its first step's resident peak (allocations of gloo
# and of Python that outlive a step). fold_small at cp=2: a probe step at N=266 peaked 1.6 MiB under a
# 0.05 GiB cap and its full measurement then went over it on rank 1; over 30 steps at N=128 the peak
# rose 1.8 MiB. A single step that stands for a full measurement (a probe step) is held to the cap
# less this; a GPU's caching allocator repeats its peak step after step.
CPU_CREEP_GIB = 2 / 1024
# What a cap binds on. CUDA: `set_per_process_memory_fraction` limits the caching allocator's own
# segments: its allocation path refuses a new segment when `total_allocated_memory + size >
# allowed_memory_maximum` (c10/cuda/CUDACachingAllocator.cpp `alloc_block`; total_allocated_memory is
# what memory_reserved() reports, and the check comes before the expandable-segments path too), so
# freed blocks it caches and fragments count, tensors alone do not. CPU: the resident peak the rows
# report (VmHWM less RssFile), held to the cap by the fits-check itself.
RESERVED, RESIDENT = "reserved", "resident"
# GPU: the largest warm-up collective's buffers, as a share of the memory a point may use (the card's
# free memory, or memory.budget_gib when smaller). A point's messages are tensors it holds, so none is
# larger than that; half leaves room for the buffers NCCL allocates during the call that first takes
# an algorithm.
WARM_SHARE = 0.5


def _status_bytes(field: str) -> int:
    text = Path("/proc/self/status").read_text()
    return int(re.search(rf"^{field}:\s+(\d+) kB", text, re.MULTILINE).group(1)) * 1024


def cap_gib(memory: MemoryConfig, device_type: str, device_gib: float | None = None) -> float | None:
    """The per-rank cap of a run whose ranks run on `device_type`, the one rule of every part that
    holds memory to a cap: memory.budget_gib; else `device_gib`, the memory of the device a forecast is
    for (a hardware preset's `memory_gib`), where one is given; else on CPU, where the machine's RAM is
    no device memory worth probing to its end, memory.cpu_budget_gib. The ranks apply it, their `auto`
    chunks are sized for it and the fake-tensor estimate is held against it. Null on CUDA: the card
    less what a rank holds after start-up, which only the rank can measure (`cap_rank`); the launching
    process, which never touches CUDA, has no figure for it."""
    if memory.budget_gib is not None:
        return memory.budget_gib
    if device_gib is not None:
        return device_gib
    return memory.cpu_budget_gib if device_type == "cpu" else None


def bound_gib(binds_on: str, allocated_gib: float, reserved_gib: float | None) -> float:
    """Of a peak's figures (`Peaks.gib`, `Peaks.reserved_gib`), the one a cap that binds on `binds_on`
    limits: the one a point's fit and the estimate's calibration are judged on."""
    if binds_on == RESIDENT:
        return allocated_gib
    if binds_on == RESERVED and reserved_gib is not None:
        return reserved_gib
    raise ValueError(f"a cap that binds on {binds_on!r} needs that figure: reserved={reserved_gib}")


def bound_peak_gib(cap: Cap | None, peak_gib: float | None, reserved_gib: float | None) -> float | None:
    """A row's or a step's peak (max over ranks) in the figure `cap` binds on, the one the estimate is
    calibrated by: the reserved peak under a GPU's cap, else the peak the rows report; None where that
    figure was not recorded."""
    return reserved_gib if cap is not None and cap.binds_on == RESERVED else peak_gib


@dataclass(frozen=True)
class Warmed:
    """What the warm-up of the collectives before the cap left. NCCL allocates outside torch's
    allocator, so its memory is the drop in the device's free memory (mem_get_info) across the
    warm-up, the caching allocator's cache emptied on both sides. None where nothing was warmed: CPU
    ranks (gloo connects every pair of a group when the group is made, and holds no device memory)."""

    nccl_gib: float | None = None
    calls: int = 0
    largest_bytes: int = 0  # the largest message warmed


@dataclass(frozen=True)
class Cap:
    """A rank's cap, applied: a point fits while the figure the cap binds on, less that figure's
    baseline, stays within `gib`."""

    gib: float  # per rank, over the baseline
    baseline_gib: float  # the part of the peak held before any step (CPU: VmHWM; CUDA: tensors)
    # CUDA: what the device held when the cap was set (the CUDA context, NCCL's buffers, tensors and
    # anything else on the card), which the card's memory less it leaves for the rank; None on CPU.
    held_gib: float | None = None
    note: str = ""  # how `gib` was derived from the cap, when it is not the cap itself
    binds_on: str = RESIDENT  # RESERVED on a GPU
    reserved_gib: float | None = None  # CUDA: the allocator's segments when the cap was set
    nccl_gib: float | None = None  # CUDA: what the warm-up before the cap took (`Warmed.nccl_gib`)

    @property
    def bound_baseline_gib(self) -> float:
        """The bound figure's part held before any step."""
        return self.reserved_gib if self.binds_on == RESERVED else self.baseline_gib

    @property
    def limit_gib(self) -> float:
        """Where the bound figure stops (on a GPU, exactly the allocator's own limit)."""
        return self.bound_baseline_gib + self.gib

    def over_baseline_gib(self, peaks: Peaks) -> float:
        """The bound figure of a point's peaks (this rank's) over its baseline."""
        return bound_gib(self.binds_on, peaks.gib, peaks.reserved_gib) - self.bound_baseline_gib

    def peak_now_gib(self, device: torch.device) -> float:
        """The bound figure's peak since the last reset, over its baseline: what a step is checked
        against after it, on every rank."""
        if self.binds_on == RESERVED:
            return torch.cuda.max_memory_reserved(device) / GIB - self.bound_baseline_gib
        return read_peak_gib(device) - self.baseline_gib

    def over(self, peak_over_gib: float) -> str:
        """What a BudgetExceeded says."""
        what = "reserved peak" if self.binds_on == RESERVED else "peak"
        return f"{what} {peak_over_gib:.3f} GiB over the baseline exceeds {self.gib:.3g} GiB{self.note}"

    def exceeded(self, peaks: Peaks) -> str | None:
        """What a BudgetExceeded says when a point's peaks went over the cap, else None."""
        over = self.over_baseline_gib(peaks)
        return self.over(over) if over > self.gib else None

    def for_one_step(self) -> Cap:
        """The cap for a single step that stands for a full measurement: on CPU less CPU_CREEP_GIB."""
        if self.held_gib is not None:
            return self
        note = f" (the {self.gib:g} GiB cap less {CPU_CREEP_GIB * 1024:g} MiB a full measurement adds)"
        return replace(self, gib=self.gib - CPU_CREEP_GIB, note=note)


def cap_rank(memory: MemoryConfig, device: torch.device, warmed: Warmed | None = None) -> Cap | None:
    """This rank capped at `cap_gib`'s answer for its device, or None where there is no cap. On a
    GPU there always is one: with memory.budget_gib null, the card's memory less what the rank holds now.
    `warmed`: what `warm_before_cap` left, which a rank of several takes before its cap (the cap takes
    its record, so it cannot be set first); None where nothing was warmed (one rank alone)."""
    gib = cap_gib(memory, device.type)
    if device.type == "cuda":
        return _cap_gpu(gib, device, warmed or Warmed())
    return None if gib is None else Cap(gib, _cap_cpu(gib, device))


def gpu_cap(requested_gib: float | None, free: int, total: int, reserved: int) -> tuple[float, float]:
    """(cap GiB, the caching allocator's fraction of the card) for a rank that sees `free` of `total`
    bytes with `reserved` in the allocator's segments: what was asked, never more than is free (an "80
    GB" card holds about 79.1-79.6 GiB, less its context), and the allocator's limit on its segments
    (what the fraction binds on) set at those segments plus that cap, so that a reserved peak over
    the baseline stays within the cap."""
    gib = free / GIB if requested_gib is None else min(requested_gib, free / GIB)
    return gib, min(1.0, (reserved + gib * GIB) / total)


def _cap_gpu(requested_gib: float | None, device: torch.device, warmed: Warmed) -> Cap:
    """The caching allocator limited by `gpu_cap` (`set_per_process_memory_fraction` limits only its
    own segments: the context and NCCL's buffers are what mem_get_info finds held already)."""
    release(device)  # cached segments hold nothing yet: they are the rank's to use, not start-up's
    free, total = torch.cuda.mem_get_info(device)
    allocated, reserved = torch.cuda.memory_allocated(device), torch.cuda.memory_reserved(device)
    gib, fraction = gpu_cap(requested_gib, free, total, reserved)
    if requested_gib is not None and gib < requested_gib:
        LOG.warning(
            "memory.budget_gib=%g: the device has %.2f GiB free after start-up (%.2f of %.2f GiB held): "
            "capped at that", requested_gib, gib, (total - free) / GIB, total / GIB,
        )  # fmt: skip
    torch.cuda.set_per_process_memory_fraction(fraction, device)
    return Cap(gib, allocated / GIB, (total - free) / GIB, binds_on=RESERVED, reserved_gib=reserved / GIB,
               nccl_gib=warmed.nccl_gib)  # fmt: skip


def warm_buffers_bytes(free: int, requested_gib: float | None) -> int:
    """How large the warm-up's largest collective may be (its buffers, bytes): WARM_SHARE of the memory
    a point may use, the device's free memory or the cap asked for when smaller."""
    room = free if requested_gib is None else min(free, int(requested_gib * GIB))
    return int(room * WARM_SHARE)


def warm_before_cap(ctx: RankContext, memory: MemoryConfig, control: dist.ProcessGroup) -> Warmed:
    """On a GPU, every collective and peer a point uses, run once at every message size up to the
    largest a point can send (`distributed/warmup.py`), before the cap is measured, so that the
    buffers NCCL allocates at a communicator's first use of each peer and algorithm are held when it
    is; and what that took. The ranks agree on the largest size on `control` (the calls must match);
    `NCCL_RUNTIME_CONNECT=0` or `NCCL_NVLS_ENABLE=0` in the environment leave less to find. CPU: nothing
    to warm (`Warmed`)."""
    device = ctx.device
    if device.type != "cuda":
        return Warmed()
    release(device)
    free, _ = torch.cuda.mem_get_info(device)
    least = torch.tensor([warm_buffers_bytes(free, cap_gib(memory, device.type))], dtype=torch.float64)
    dist.all_reduce(least, op=dist.ReduceOp.MIN, group=control)
    started = time.perf_counter()
    done = warm_collectives(ctx, int(least.item()))
    torch.cuda.synchronize(device)
    release(device)
    after, _ = torch.cuda.mem_get_info(device)
    warmed = Warmed((free - after) / GIB, len(done.calls), done.largest_bytes)
    LOG.info(
        "NCCL warm-up before the cap: %d collectives, messages up to %.1f MiB, %.1f s; the device's free "
        "memory fell by %.3f GiB (NCCL's communicators and buffers)",
        warmed.calls, warmed.largest_bytes / 2**20, time.perf_counter() - started, warmed.nccl_gib,
    )  # fmt: skip
    return warmed


def _cap_cpu(gib: float, device: torch.device) -> float:
    """Cap this rank's data segment at the backstop over what it holds now and return its baseline
    (GiB: the resident set so far, which the fits-check subtracts from the measured peak, held to
    `gib`). `lift_cap` takes the cap off again: it is for the measured steps, not what
    follows them."""
    # Blocks from mmap go back to the OS when freed; glibc's dynamic threshold would otherwise move
    # them onto the heap, whose fragments count against the cap and make a point that fits once fail
    # when it is repeated. At 128 KiB (glibc's initial threshold, held) a fold_small step's peak at
    # N=300 repeated within 1 MB over 8 steps; at 1 MiB it moved over 6 MB and crept up from step to
    # step, at a step about a quarter faster (page faults of fresh mappings).
    libc = ctypes.CDLL(None)
    libc.mallopt(_M_MMAP_THRESHOLD, 128 << 10)
    libc.mallopt(_M_TRIM_THRESHOLD, 1 << 20)
    limit = _status_bytes("VmData") + int((BACKSTOP_FACTOR * gib + BACKSTOP_GIB) * GIB)
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
