"""Fault injection for the never-hang and agreement guarantees: one chosen rank runs out of memory (a
real failing allocation), is killed, overruns its budget (a peak over it that no failing allocation
reports), or meets a kernel fault (the exception torch raises after an illegal memory access, with its
words), at N_tokens >= a threshold, either while its batch is built (before the step's first
collective) or inside the step between two collectives. `perturb` instead gives a slightly wrong
answer: every module output on the chosen rank is scaled by 1 + PERTURB in every step, as a CP bug on
one rank would, for mode=accuracy's comparison with cp=1 to catch."""

from __future__ import annotations

import mmap
import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from cpbench.distributed.comm import LEDGER
from cpbench.settings.schema import FaultConfig
from cpbench.torch_compat import ACCELERATOR_ERRORS

OVERRUN_BYTES = 2**30
PERTURB = 1e-4  # relative, per module output: well over float32 rounding, far under any real signal
# What C10_CUDA_CHECK raises at the first CUDA call after a kernel's illegal memory access (torch 2.8 up:
# torch.AcceleratorError): "CUDA error: " and cudaGetErrorString's text (c10/cuda/CUDAException.cpp),
# the error's name (c10/cuda/CUDAMiscFunctions.cpp `get_cuda_error_help`), the asynchronous-error note
# (`get_cuda_async_error_suffix`) and, in a build without device-side assertions, their note
# (c10/cuda/CUDADeviceAssertionHost.cpp). NVIDIA/cuEquivariance#136 quotes the same first line.
ILLEGAL_ACCESS = (
    "CUDA error: an illegal memory access was encountered\n"
    "Search for `cudaErrorIllegalAddress' in https://docs.nvidia.com/cuda/cuda-runtime-api/"
    "group__CUDART__TYPES.html for more information.\n"
    "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below "
    "might be incorrect.\n"
    "For debugging consider passing CUDA_LAUNCH_BLOCKING=1\n"
    "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.\n"
)


def _overrun() -> None:
    """Make 1 GiB resident in a shared mapping, which the CPU cap (RLIMIT_DATA) does not count but
    the peak (VmHWM) does, then free it: the step goes on and only the budget check sees it."""
    with mmap.mmap(-1, OVERRUN_BYTES) as pages:
        view = torch.frombuffer(pages, dtype=torch.uint8)
        view.fill_(1)
        del view  # the mapping cannot close while a tensor still views it


def _strike(kind: str, device: torch.device) -> None:
    if kind == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if kind == "overrun":
        _overrun()
        return
    if kind == "kernel":  # as torch raises it: AcceleratorError from torch 2.8, a RuntimeError before
        raise (ACCELERATOR_ERRORS or (RuntimeError,))[0](ILLEGAL_ACCESS)
    torch.empty(2**62, dtype=torch.uint8, device=device)  # no allocator can serve this: a real OOM


@dataclass(frozen=True)
class Fault:
    """The fault the run's `fault.*` settings ask for (`FaultConfig`, whose defaults are off)."""

    config: FaultConfig = field(default_factory=FaultConfig)

    def armed(self, rank: int, n_tokens: int) -> bool:
        c = self.config
        return c.rank == rank and c.at_n is not None and n_tokens >= c.at_n

    def before_step(self, rank: int, step: int, resumed: bool, device: torch.device) -> None:
        """A convergence run's fault: before step `at_step` of a run that did not resume from a
        checkpoint (a resumed run goes past it, as a requeued job would)."""
        if self.config.rank == rank and self.config.at_step == step and not resumed:
            _strike(self.config.kind, device)

    def before_batch(self, rank: int, n_tokens: int, device: torch.device) -> None:
        if self.config.where == "batch" and self.armed(rank, n_tokens):
            _strike(self.config.kind, device)

    @contextmanager
    def in_step(self, rank: int, n_tokens: int, device: torch.device) -> Iterator[None]:
        """Strike in the first submodule call that follows the step's first collective."""
        if self.config.where != "step" or not self.armed(rank, n_tokens):
            yield
            return
        if self.config.kind == "perturb":
            with _perturbed():
                yield
            return
        seen: list[int] = []  # the collective count at the step's first submodule call, then at the strike

        def hook(module, args):
            calls = sum(LEDGER.calls.values())
            if not seen:
                seen.append(calls)
            elif len(seen) == 1 and calls > seen[0]:
                seen.append(calls)  # strike once: an overrun lets the step go on
                _strike(self.config.kind, device)

        handle = torch.nn.modules.module.register_module_forward_pre_hook(hook)
        try:
            yield
        finally:
            handle.remove()


@contextmanager
def _perturbed() -> Iterator[None]:
    def hook(module, args, output):
        if isinstance(output, torch.Tensor) and output.is_floating_point():
            return output * (1 + PERTURB)
        return None

    handle = torch.nn.modules.module.register_module_forward_hook(hook)
    try:
        yield
    finally:
        handle.remove()
