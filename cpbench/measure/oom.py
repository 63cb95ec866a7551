"""Out of memory in each of its faces, told apart from every other failure.

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
"""

from __future__ import annotations

import re

import torch

from cpbench.torch_compat import ACCELERATOR_ERRORS

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


def describe(err: BaseException) -> str:
    """One line: the exception type and the first line of its message, and the line that names the
    face where that is a later one (NCCL's first line says only "unhandled cuda error")."""
    lines = str(err).strip().splitlines()
    line = f"{type(err).__name__}: {lines[0] if lines else ''}"
    face = next((text for text in lines[1:] if _FACES.search(text)), None)
    return f"{line} ({face.strip()})" if face else line
