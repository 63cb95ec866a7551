"""`measure.profile_comm`: a point's time in collectives read from the torch profiler, for models whose
collectives bypass cpbench's ledger.

Which events carry the time depends on the backend. gloo runs a collective on the CPU, inside its
`gloo:*` record-function span. NCCL's `nccl:*` span ends once the collective is enqueued on the stream,
microseconds after it starts: the work is the device kernel (`ncclDevKernel_*` in recent NCCL,
`ncclKernel_*` in older releases), which only the profiler's CUDA activity (CUPTI) records. So on a
GPU the time is the NCCL kernels' device time, and where the trace holds no such kernels while
collectives were issued (no CUPTI in this build or process), the answer is None: "cannot tell", never 0.

Either way the time is the union of the events' intervals (collectives overlap across threads and
streams), clipped to the timed steps (`STEP_EVENT`, a CPU span that on a GPU ends after the step's
device work: the step synchronises). A kernel's time includes its wait for the peers, as the ledger's
wall clock does.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any, Protocol

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity

STEP_EVENT = "cpbench.step"  # the record-function span around each timed step
# The CPU backends' own spans of a collective's work (gloo; NCCL's only say when it was enqueued).
CPU_SPANS = ("gloo:", "nccl:")
ENQUEUED = "nccl:"  # NCCL's span: a collective was issued
# NCCL's device kernels as CUPTI names them, demangled or not ("void " before a template's name).
NCCL_KERNEL = re.compile(r"nccl(Dev)?Kernel_")


class _Range(Protocol):
    start: float
    end: float


class ProfiledEvent(Protocol):
    """What is read of a profiler event (torch.autograd.profiler_util.FunctionEvent): its name, its
    device (CPU for a span, CUDA for a kernel), and its interval in microseconds from the trace's start
    (kernels are placed on the CPU's clock)."""

    name: str
    device_type: DeviceType
    time_range: _Range


def activities(device_type: str) -> list[ProfilerActivity]:
    """What the profiler records on a rank of this device: the CPU always, the GPU's kernels on CUDA
    where this build's profiler can (without CUDA activity `comm_seconds` says it cannot tell)."""
    wanted = [ProfilerActivity.CPU]
    if device_type == "cuda" and ProfilerActivity.CUDA in torch.profiler.supported_activities():
        wanted.append(ProfilerActivity.CUDA)
    return wanted


def profiler(device_type: str) -> torch.profiler.profile:
    """The profiler around a point's timed steps."""
    return torch.profiler.profile(activities=activities(device_type))


def _union_within(spans: Iterable[tuple[float, float]], windows: list[tuple[float, float]]) -> float:
    """Microseconds covered by `spans` inside `windows`, each instant counted once."""
    clipped = sorted(
        (max(start, w_start), min(end, w_end))
        for start, end in spans
        for w_start, w_end in windows
        if start < w_end and end > w_start
    )
    total, reach = 0.0, float("-inf")
    for start, end in clipped:
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


def _interval(event: ProfiledEvent) -> tuple[float, float]:
    return event.time_range.start, event.time_range.end


def comm_seconds(events: Iterable[Any], device_type: str) -> float | None:
    """Seconds inside the timed steps during which a collective was at work on this rank: on CPU the
    backends' spans, on CUDA the NCCL kernels. None on CUDA when the trace cannot tell: it holds no
    device event at all (the profiler recorded no CUDA activity), or collectives were issued in the
    steps and no NCCL kernel was recorded."""
    events = list(events)
    cpu = [e for e in events if e.device_type == DeviceType.CPU]
    steps = [_interval(e) for e in cpu if e.name == STEP_EVENT]
    if device_type != "cuda":
        return _union_within((_interval(e) for e in cpu if e.name.startswith(CPU_SPANS)), steps) / 1e6
    device = [e for e in events if e.device_type == DeviceType.CUDA]
    kernels = [_interval(e) for e in device if NCCL_KERNEL.search(e.name)]
    enqueued = [_interval(e) for e in cpu if e.name.startswith(ENQUEUED)]
    issued = any(start <= w_end and end >= w_start for start, end in enqueued for w_start, w_end in steps)
    seconds = _union_within(kernels, steps) / 1e6
    if not device or (issued and seconds == 0):
        return None
    return seconds
