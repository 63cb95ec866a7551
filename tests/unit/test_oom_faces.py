"""Out of memory on a GPU, recognised in each face it arrives in: the real exception classes, built on
CPU with the messages torch, cuBLAS, cuDNN and NCCL write (sources in cpbench/measure/oom.py), and
the GPU failures that are no such answer left alone."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from cpbench.measure.oom import BudgetExceeded, describe, is_oom
from cpbench.torch_compat import ACCELERATOR_ERRORS

_NCCL = (
    "NCCL error in: /pytorch/torch/csrc/distributed/c10d/NCCLUtils.cpp:77, unhandled cuda error "
    "(run with NCCL_DEBUG=INFO for details), NCCL version 2.26.2\n"
    "ncclUnhandledCudaError: Call to CUDA function failed.\nLast error:\n"
)
_LAUNCH = (
    "\nCUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace "
    "below might be incorrect.\nFor debugging consider passing CUDA_LAUNCH_BLOCKING=1"
)


def _accelerator(message: str) -> RuntimeError:
    """What a failed CUDA runtime call raises: torch.AcceleratorError from torch 2.8, else RuntimeError."""
    return ACCELERATOR_ERRORS[0](message) if ACCELERATOR_ERRORS else RuntimeError(message)


OOM = {
    "caching allocator": torch.OutOfMemoryError(
        "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.11 GiB of which "
        "1.06 GiB is free. Including non-PyTorch memory, this process has 78.04 GiB memory in use."
    ),
    "CUDA runtime": _accelerator("CUDA error: out of memory" + _LAUNCH),
    "CUDA runtime before torch 2.8": RuntimeError("CUDA error: out of memory" + _LAUNCH),
    "cuBLAS": RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"),
    "cuDNN 8": RuntimeError("cuDNN error: CUDNN_STATUS_ALLOC_FAILED"),
    "cuDNN 9": RuntimeError("cuDNN error: CUDNN_STATUS_ALLOC_FAILED_DEVICE_MEMORY"),
    "NCCL, driver call": dist.DistBackendError(_NCCL + "Cuda failure 2 'out of memory'"),
    "NCCL, runtime call": dist.DistBackendError(_NCCL + "Cuda failure 'out of memory'"),
    "NCCL, its allocation": dist.DistBackendError(_NCCL + "Failed to CUDA calloc 6291456 bytes"),
    "NCCL, its async allocation": dist.DistBackendError(_NCCL + "Failed to CUDA calloc async 2432 bytes"),
    "CPU": RuntimeError(
        "[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: can't allocate memory"
    ),
    "budget": BudgetExceeded("peak 2.100 GiB over the baseline exceeds 2.0 GiB"),
}
NOT_OOM = {
    "illegal access": _accelerator("CUDA error: an illegal memory access was encountered" + _LAUNCH),
    "illegal access before torch 2.8": RuntimeError("CUDA error: an illegal memory access was encountered"),
    "cuBLAS execution": RuntimeError(
        "CUDA error: CUBLAS_STATUS_EXECUTION_FAILED when calling `cublasGemmEx`"
    ),
    "cuDNN bad parameter": RuntimeError("cuDNN error: CUDNN_STATUS_BAD_PARAM"),
    "NCCL system error": dist.DistBackendError(
        "NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1691, unhandled system error "
        "(run with NCCL_DEBUG=INFO for details), NCCL version 2.19.3\n"
        "ncclSystemError: System call (e.g. socket, malloc) or external library call failed or device error."
    ),
    "NCCL invalid argument": dist.DistBackendError(_NCCL + "Cuda failure 1 'invalid argument'"),
    "NCCL unknown error": dist.DistBackendError(_NCCL + "Cuda failure 999 'unknown error'"),
    "NCCL remote": dist.DistBackendError(
        "NCCL error in: /pytorch/torch/csrc/distributed/c10d/NCCLUtils.hpp:268, remote process exited or "
        "there was a network error, NCCL version 2.21.5\nncclRemoteError: A call failed possibly due to a "
        "network error or a remote process exiting prematurely."
    ),
    "a value error": ValueError("CUDA error: out of memory"),  # not raised by a device
}


@pytest.mark.parametrize("face", sorted(OOM))
def test_every_face_of_out_of_memory_is_does_not_fit(face):
    assert is_oom(OOM[face])


@pytest.mark.parametrize("failure", sorted(NOT_OOM))
def test_other_gpu_failures_stay_errors(failure):
    assert not is_oom(NOT_OOM[failure])


def test_accelerator_error_is_the_runtime_error_torch_raises_where_it_exists():
    """torch 2.8 up raises "CUDA error: ..." as torch.AcceleratorError; torch_compat names it there."""
    assert bool(ACCELERATOR_ERRORS) == hasattr(torch, "AcceleratorError")
    assert all(issubclass(cls, RuntimeError) for cls in ACCELERATOR_ERRORS)


def test_the_description_names_the_face_that_nccl_writes_below_its_first_line():
    line = describe(OOM["NCCL, driver call"])
    assert line.startswith("DistBackendError: NCCL error in: ") and "\n" not in line
    assert line.endswith("(Cuda failure 2 'out of memory')")
    assert describe(OOM["cuBLAS"]) == f"RuntimeError: {OOM['cuBLAS']}"
    assert describe(NOT_OOM["NCCL system error"]).count("(") == 1  # its own "(run with ...)", nothing added
