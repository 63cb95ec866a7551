"""Peak memory of one rank, reset per point: CUDA allocator stats, or the CPU process's peak resident
set less its file-backed pages; and the CUDA caching allocator's settings (`memory.alloc_conf`, on a GPU
`expandable_segments:True` where neither it nor the environment says otherwise), set before CUDA
starts and recorded."""

from __future__ import annotations

import ctypes
import gc
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from cpbench.record import nvml

GIB = 2**30
_CLEAR_REFS = Path("/proc/self/clear_refs")
_STATUS = Path("/proc/self/status")
# PYTORCH_CUDA_ALLOC_CONF is the name every supported torch reads (2.6 knows no other);
# PYTORCH_ALLOC_CONF is its device-neutral successor (torch 2.8 up warns that the old name is
# deprecated, yet 2.9.1 ignored expandable_segments under the new name alone: pytorch/pytorch#183387).
# Both are set to the one value, so that no version has to choose between them.
ALLOC_CONF_VARS = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")
# A GPU rank's allocator settings where neither memory.alloc_conf nor the environment has any. The cap
# (`set_per_process_memory_fraction`) binds on the allocator's reserved segments, and with fixed
# segments a freed block that a larger request cannot reuse stays reserved (fragmentation): the cap is
# reached with less in tensors, and by an amount that moves with the order of allocations. Expandable
# segments map pages into one growing range instead ("expandable_segments:True" in torch's CUDA
# memory-management notes), so what is reserved follows what is live much more closely.
GPU_ALLOC_CONF = "expandable_segments:True"


def release(device: torch.device) -> None:
    """Return freed memory so the next point starts clean (call outside any `except` block)."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def reset_peak(device: torch.device) -> None:
    """Peaks, and on a GPU the allocator's event counters (`reset_accumulated_memory_stats` resets
    "num_alloc_retries" and "num_ooms" with the other accumulated stats), count from here."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        torch.cuda.reset_accumulated_memory_stats(device)
    else:
        ctypes.CDLL(None).malloc_trim(
            0
        )  # free heap pages back first: what the last point left is not this one's
        _CLEAR_REFS.write_text("5")  # resets VmHWM to the current resident set


def read_peak_gib(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / GIB
    # Less the pages mapped from files: library code and data, shared with every process and paged in
    # on an op's first use (about 20 MB over a fold step's first run), which a GPU's count of tensors
    # leaves out too. What is left is the memory the process allocated (heap, tensors, stacks).
    fields = dict(line.split(":", 1) for line in _STATUS.read_text().splitlines() if ":" in line)
    return (_kib(fields["VmHWM"]) - _kib(fields["RssFile"])) / 2**20


def _kib(value: str) -> int:
    return int(value.split()[0])


@dataclass(frozen=True)
class Peaks:
    """A rank's memory at its peak since `reset_peak`, GiB. On a GPU the allocator's two figures differ
    by what it caches and fragments, and neither counts the CUDA context or NCCL's buffers: NVML's
    reading of the device does (every process on it)."""

    gib: float  # `read_peak_gib`: CUDA max_memory_allocated (tensors); CPU VmHWM less RssFile
    reserved_gib: float | None = None  # CUDA max_memory_reserved: the allocator's segments
    device_used_gib: float | None = None  # CUDA: NVML's used memory of the device (None: unreadable)
    # CUDA, since `reset_peak` (torch.cuda.memory_stats): "num_alloc_retries", the device allocations
    # that failed and were retried after the allocator freed its cache (under a cap: the cap reached
    # with cached blocks in hand, each retry a synchronisation), and "num_ooms", out-of-memory errors.
    alloc_retries: int | None = None
    alloc_ooms: int | None = None


def read_peaks(device: torch.device) -> Peaks:
    """The peaks, read after the steps and before `release`: the allocator then still holds the
    segments of its peak (it gives them back at `empty_cache`, or early under a
    garbage_collection_threshold in memory.alloc_conf), so NVML's reading is the device's use at the
    peak."""
    if device.type != "cuda":
        return Peaks(read_peak_gib(device))
    uuid = str(torch.cuda.get_device_properties(device).uuid)
    reserved = torch.cuda.max_memory_reserved(device) / GIB
    stats = torch.cuda.memory_stats(device)
    return Peaks(read_peak_gib(device), reserved, nvml.used_gib(uuid), stats.get("num_alloc_retries"),
                 stats.get("num_ooms"))  # fmt: skip


def set_alloc_conf(conf: str | None, gpu: bool = False) -> None:
    """memory.alloc_conf into this process's environment, for the caching allocator to read when CUDA
    starts (once: a process whose CUDA already started cannot take another). Null leaves the
    environment as it is, except in a rank that will run on a GPU (`gpu`) whose environment sets
    neither variable and whose CUDA has not started: there GPU_ALLOC_CONF. A user's own variable,
    either name, is never replaced."""
    if conf is None:
        if not gpu or torch.cuda.is_initialized() or any(name in os.environ for name in ALLOC_CONF_VARS):
            return
        conf = GPU_ALLOC_CONF
    if torch.cuda.is_initialized() and alloc_conf() != conf:
        raise RuntimeError(
            f"memory.alloc_conf={conf}: CUDA already started in this process with {alloc_conf()}; "
            "run it in a process of its own"
        )
    os.environ.update(dict.fromkeys(ALLOC_CONF_VARS, conf))


def alloc_conf() -> str:
    """The allocator settings this process's environment holds, as a run records them: the value,
    each variable by name where they differ, "default" where neither is set."""
    found = {name: os.environ[name] for name in ALLOC_CONF_VARS if name in os.environ}
    if not found:
        return "default"
    if len(set(found.values())) == 1:
        return next(iter(found.values()))
    return ", ".join(f"{name}={value}" for name, value in found.items())
