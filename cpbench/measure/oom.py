"""Out of memory in each of its faces, told apart from every other failure, and every failure's class
(`classify`: oom, kernel, comm, timeout, crash; results/row.py's FAILURES, docs/failures.md).

A face is an exception class that means it by itself, or a message that only a failed allocation
writes. Each message below is quoted from where it is made or seen:

- CPU: c10's DefaultCPUAllocator ("DefaultCPUAllocator: can't allocate memory"), "CPU out of
  memory"; oneDNN reports an allocation that failed under the cap as a primitive it could not create.
- CUDA's caching allocator raises `torch.OutOfMemoryError` ("CUDA out of memory. Tried to allocate").
- A CUDA runtime call that fails with cudaErrorMemoryAllocation outside the allocator (a kernel's
  launch, a stream's synchronize) is C10_CUDA_CHECK's "CUDA error: out of memory", raised as
  `torch.AcceleratorError` from torch 2.8 (deepbeepmeep/Wan2GP#1083, Comfy-Org/ComfyUI#13210), a plain
  RuntimeError before it (kuangliu/pytorch-cifar#67).
- cuBLAS failing to allocate its handle or workspace: TORCH_CUDABLAS_CHECK's "CUDA error:
  CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`" (aten/src/ATen/cuda/Exceptions.h;
  DeepMotionAIResearch/DenseMatchingBenchmark#20, JDAI-CV/fast-reid#625).
- cuDNN: AT_CUDNN_CHECK's "cuDNN error: " + cudnnGetErrorString (the same Exceptions.h): cuDNN 8's
  CUDNN_STATUS_ALLOC_FAILED (pytorch/pytorch#20123), cuDNN 9's CUDNN_STATUS_ALLOC_FAILED and its
  _DEVICE_MEMORY and _HOST_MEMORY sub-codes (cudnn_graph.h) all begin with that name.
  CUDNN_STATUS_NOT_ENOUGH_WORKSPACE is not one: it says the caller passed cuDNN too small a workspace,
  and torch allocates workspaces through the caching allocator, which fails as OutOfMemoryError.
- NCCL (a communicator created lazily near the cap, its buffers): torch raises DistBackendError with
  "ncclUnhandledCudaError: Call to CUDA function failed.\\nLast error:\\n" and NCCL's last warning
  (pytorch/pytorch#170045 for the form). That warning is NCCL's CUDACHECK "Cuda failure 'out of
  memory'" or its driver-call check "Cuda failure 2 'out of memory'" (src/include/checks.h;
  openxla/xla#7201 quotes the latter), or alloc.h's own "Failed to CUDA malloc|calloc [async] N bytes"
  written after it (NVIDIA/nccl#1235). "unhandled cuda error" alone is no face: it also reports
  "Cuda failure 1 'invalid argument'" (NVIDIA/nccl#1410) and "999 'unknown error'".
- cuBLAS failing to start: TORCH_CUDABLAS_CHECK's "CUDA error: CUBLAS_STATUS_NOT_INITIALIZED when
  calling `cublasCreate(handle)`" (aten/src/ATen/cuda/Exceptions.h; the handle is made in
  aten/src/ATen/cuda/CublasHandlePool.cpp) is out of memory only where the rank's memory was near its
  cap (`near_cap`): cuBLAS allocates outside the caching allocator and finds the card full. Anywhere
  else it is a crash: the same words come from a CUDA poisoned by a fork or a driver that does not
  match the runtime.

The other classes, each matched in the text a rank or the launcher sees:

- kernel: a kernel faulted. The CUDA errors torch reports as asynchronous kernel errors
  (c10/cuda/CUDAMiscFunctions.cpp `get_cuda_async_error_suffix`: cudaErrorLaunchFailure,
  cudaErrorIllegalAddress, cudaErrorAssert, cudaErrorIllegalInstruction, cudaErrorMisalignedAddress),
  by cudaGetErrorString's text, which C10_CUDA_CHECK puts after "CUDA error: "
  (c10/cuda/CUDAException.cpp), Triton after "Triton Error [CUDA]: ", and NCCL's watchdog after
  "Process group watchdog thread terminated with exception: ". They are sticky: the process's CUDA
  context is dead, and every later CUDA call fails the same way. Public fused triangle kernels fail so
  above about 2,800-3,000 tokens (NVIDIA/cuEquivariance#136, #144; bytedance/Protenix#165).
- timeout: NCCL's watchdog ("Watchdog caught collective operation timeout: WorkNCCL(...) ran for N
  milliseconds before timing out", torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp), gloo's "Timed
  out waiting Nms for recv operation to complete" (gloo/transport/tcp/unbound_buffer.cc), a gloo
  work's `wait(timeout)` ("Operation timed out!"), the TCPStore's "Socket Timeout".
- comm: any other error of torch.distributed (DistBackendError, DistNetworkError, DistStoreError),
  NCCL's ("NCCL error in: ...", ncclRemoteError, ncclSystemError, ...), and a lost peer: gloo's
  "Connection closed by peer [host]:port" (gloo/transport/tcp/pair.cc, as torch 2.13's gloo words
  it), a connection "reset by peer".
- crash: anything else: a killed rank (the launcher sees only its signal: a rank that NCCL's watchdog
  takes down with SIGABRT reads as one too), a Python error, a CUDA that cannot start.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from cpbench.measure.memory import GIB
from cpbench.results.row import COMM, CRASH, KERNEL, OOM, TIMEOUT
from cpbench.torch_compat import ACCELERATOR_ERRORS

if TYPE_CHECKING:
    from cpbench.measure.cap import Cap

_FACES = re.compile(
    "|".join(
        (
            r"DefaultCPUAllocator: can't allocate memory",
            r"CPU out of memory",
            r"could not create a primitive",
            r"CUDA error: out of memory",
            r"CUBLAS_STATUS_ALLOC_FAILED",
            r"CUDNN_STATUS_ALLOC_FAILED",
            r"Cuda failure (2 )?'out of memory'",
            r"Failed to CUDA (malloc|calloc)",
        )
    )
)


class BudgetExceeded(RuntimeError):
    """A rank's peak went over the configured `memory.budget_gib`."""


def is_oom(err: BaseException) -> bool:
    """Whether `err` means "does not fit" (a point's answer) rather than a fault (the run's end)."""
    if isinstance(err, (torch.OutOfMemoryError, MemoryError, BudgetExceeded)):
        return True
    # DistBackendError and torch.AcceleratorError are RuntimeErrors; naming them says what is expected.
    return isinstance(err, (RuntimeError, *ACCELERATOR_ERRORS)) and _FACES.search(str(err)) is not None


# Exceptions of the ranks' own that say out of memory by their name, as the launcher reads a rank's
# error ("OutOfMemoryAlone: N=256 does not fit: ..."): cpbench's, torch's and Python's.
_OOM_NAMES = re.compile(r"\b(OutOfMemoryError|OutOfMemoryAlone|BudgetExceeded|DoesNotFit|MemoryError):")
_KERNEL = re.compile(
    "|".join(
        (
            r"an illegal memory access was encountered",
            r"device-side assert triggered",
            r"an illegal instruction was encountered",
            r"misaligned address",
            r"unspecified launch failure",
            # a launch past the device's grid limits, as fused attention kernels meet at some N (a batch
            # or a head dimension over 65,535 blocks: pytorch#146704, xformers#845)
            r"invalid configuration argument",
            r"\bKernelFault:",
        )
    )
)
_CUBLAS_START = re.compile(r"CUBLAS_STATUS_NOT_INITIALIZED")
_TIMEOUT = re.compile(
    "|".join(
        (
            r"Watchdog caught collective operation timeout",
            r"milliseconds before timing out",
            r"Timed out waiting \d+ ?ms for (recv|send) operation",
            r"Operation timed out",
            r"Socket Timeout",
        )
    )
)
_COMM = re.compile(
    "|".join(
        (
            r"\bDist(Backend|Network|Store)?Error:",
            r"NCCL error",
            r"\bnccl[A-Z][A-Za-z]*Error\b",
            r"[Cc]onnection (closed|reset) by peer",
        )
    )
)
# How close to its cap a rank's reserved memory (or how little free on its card) makes cuBLAS's failure
# to start out of memory: a margin for what is allocated beside the caching allocator (cuBLAS's handle,
# NCCL's buffers), not a measured figure.
NEAR_CAP_GIB = 1.0


class KernelFault(RuntimeError):
    """A kernel faulted (an illegal memory access, a device-side assertion): no out-of-memory answer,
    and on a GPU the rank's CUDA context is dead and its NCCL peers wait until their watchdog fires.
    The rank records `kernel` at its N and leaves; the ranks restart, never to try that N or above."""


def classify(err: BaseException | str, near: Callable[[], bool] | None = None) -> str:
    """The failure class (results/row.py's FAILURES) of an exception, or of the text of one as the
    launcher reads it ("Type: message", or a signal). `near` is asked only for cuBLAS's failure to
    start: whether the rank's memory was near its cap (`near_cap`); without it, that is a crash."""
    if isinstance(err, BaseException):
        if is_oom(err):
            return OOM
        text = f"{type(err).__name__}: {err}"
    else:
        text = err
    if _FACES.search(text) or _OOM_NAMES.search(text):
        return OOM
    if _KERNEL.search(text):
        return KERNEL
    if _CUBLAS_START.search(text):
        return OOM if near is not None and near() else CRASH
    if _TIMEOUT.search(text):
        return TIMEOUT
    if isinstance(err, dist.DistError) or _COMM.search(text):
        return COMM
    return CRASH


def starved(reserved_gib: float, limit_gib: float | None, free_gib: float | None) -> bool:
    """Whether a CUDA library that allocates beside the caching allocator (cuBLAS starting) found no
    memory: the allocator's reserved segments within NEAR_CAP_GIB of its limit (the cap stands for a
    card of that size), or the card itself that close to full."""
    near_limit = limit_gib is not None and reserved_gib >= limit_gib - NEAR_CAP_GIB
    return near_limit or (free_gib is not None and free_gib < NEAR_CAP_GIB)


def near_cap(device: torch.device, cap: Cap | None) -> bool:
    """`starved`, read on this rank now. A CUDA that cannot answer (poisoned by a fork, a driver
    mismatch) has no memory cause: False. The allocator's limit is the cap's `limit_gib` (its reserved
    baseline plus its budget: cpbench/measure/cap.py `gpu_cap`)."""
    if device.type != "cuda":
        return False
    try:
        reserved = torch.cuda.memory_reserved(device) / GIB
        free = torch.cuda.mem_get_info(device)[0] / GIB
    except RuntimeError:
        return False
    return starved(reserved, cap.limit_gib if cap is not None else None, free)


def describe(err: BaseException) -> str:
    """One line: the exception type and the first line of its message, and the line that names the
    face (out of memory, a kernel fault) where that is a later one (NCCL's first line says only
    "unhandled cuda error")."""
    lines = str(err).strip().splitlines()
    line = f"{type(err).__name__}: {lines[0] if lines else ''}"
    if _FACES.search(line) or _KERNEL.search(line):
        return line
    face = next((text for text in lines[1:] if _FACES.search(text) or _KERNEL.search(text)), None)
    return f"{line} ({face.strip()})" if face else line
