"""Every failure a run records has its class (oom, kernel, comm, timeout, crash): each class pinned by
the real exception classes with the words torch, CUDA, Triton, NCCL and gloo write (sources quoted in
cpbench/measure/oom.py), as a rank raises them and as the launcher reads them; and what a kernel fault
leaves behind: the probe's trial, the point's row, the max-fit row and the readout."""

from __future__ import annotations

import pandas as pd
import pytest
import torch
import torch.distributed as dist

from cpbench.app.outcome import close_failed
from cpbench.measure.fault import ILLEGAL_ACCESS, Fault
from cpbench.measure.oom import NEAR_CAP_GIB, KernelFault, classify, describe, starved
from cpbench.measure.point import _guarded
from cpbench.probe.in_flight import InFlight
from cpbench.probe.runner import max_fit_row
from cpbench.probe.search import SearchConfig, Trial, next_trial
from cpbench.probe.state import ProbeState
from cpbench.report.sections.readout import readout
from cpbench.results.folder import RunFolder
from cpbench.results.row import COLUMNS, FAILURES, KERNEL, OOM, Measured, ResultRow
from cpbench.settings.schema import FaultConfig, ProbeConfig
from cpbench.torch_compat import ACCELERATOR_ERRORS

# What a failed CUDA runtime call raises: torch.AcceleratorError from torch 2.8, else RuntimeError.
CUDA_ERROR = ACCELERATOR_ERRORS[0] if ACCELERATOR_ERRORS else RuntimeError
# torch before 2.8 (no error name, no help line): the form NVIDIA/cuEquivariance#136 quotes from its
# triangle attention above 3,000 tokens.
_BEFORE_2_8 = (
    "CUDA error: an illegal memory access was encountered\nCUDA kernel errors might be asynchronously "
    "reported at some other API call, so the stacktrace below might be incorrect.\nFor debugging consider "
    "passing CUDA_LAUNCH_BLOCKING=1\nCompile with `TORCH_USE_CUDA_DSA` to enable device-side assertions."
)
_NCCL = "NCCL error in: /pytorch/torch/csrc/distributed/c10d/NCCLUtils.cpp:77, unhandled cuda error "
CUBLAS_START = "CUDA error: CUBLAS_STATUS_NOT_INITIALIZED when calling `cublasCreate(handle)`"

FACES: dict[str, dict[str, BaseException]] = {
    OOM: {
        "caching allocator": torch.OutOfMemoryError(
            "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.11 GiB of "
            "which 1.06 GiB is free."
        ),
        "CPU allocator": RuntimeError(
            "[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: can't allocate memory"
        ),
        "NCCL's allocation": dist.DistBackendError(
            _NCCL + "(run with NCCL_DEBUG=INFO for details), NCCL version 2.26.2\nncclUnhandledCudaError: "
            "Call to CUDA function failed.\nLast error:\nCuda failure 2 'out of memory'"
        ),
    },
    KERNEL: {
        "illegal access (torch 2.8 up)": CUDA_ERROR(ILLEGAL_ACCESS),
        "illegal access (before torch 2.8)": RuntimeError(_BEFORE_2_8),
        "device-side assertion": CUDA_ERROR(
            "CUDA error: device-side assert triggered\nCUDA kernel errors might be asynchronously reported "
            "at some other API call, so the stacktrace below might be incorrect."
        ),
        # bytedance/Protenix#165, cuEquivariance's triangle multiplication above 2,880 tokens
        "Triton kernel": RuntimeError("Triton Error [CUDA]: an illegal memory access was encountered"),
        "NCCL's watchdog meeting it": dist.DistBackendError(
            "[PG ID 0 PG GUID 0(default_pg) Rank 0] Process group watchdog thread terminated with exception: "
            "CUDA error: an illegal memory access was encountered"
        ),
        # NCCL's CUDACHECK (src/include/checks.h) with cudaGetErrorString's text, below torch's first line
        "NCCL meeting it": dist.DistBackendError(
            _NCCL + "(run with NCCL_DEBUG=INFO for details), NCCL version 2.26.2\nncclUnhandledCudaError: "
            "Call to CUDA function failed.\nLast error:\n"
            "Cuda failure 'an illegal memory access was encountered'"
        ),
        "illegal instruction": CUDA_ERROR("CUDA error: an illegal instruction was encountered"),
        "misaligned address": CUDA_ERROR("CUDA error: misaligned address"),
        "launch failure": CUDA_ERROR("CUDA error: unspecified launch failure"),
        # a fused attention kernel launched past the grid's limits at some N (pytorch#146704)
        "grid too large": CUDA_ERROR("CUDA error: invalid configuration argument"),
    },
    "comm": {
        "NCCL remote": dist.DistBackendError(
            "NCCL error in: /pytorch/torch/csrc/distributed/c10d/NCCLUtils.hpp:268, remote process exited "
            "or there was a network error, NCCL version 2.21.5\nncclRemoteError: A call failed possibly due "
            "to a network error or a remote process exiting prematurely."
        ),
        "NCCL system": dist.DistBackendError(
            "NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1691, unhandled system "
            "error (run with NCCL_DEBUG=INFO for details), NCCL version 2.19.3\nncclSystemError: System call "
            "(e.g. socket, malloc) or external library call failed or device error."
        ),
        "NCCL invalid argument": dist.DistBackendError(
            _NCCL + "(run with NCCL_DEBUG=INFO for details), NCCL version 2.26.2\nncclUnhandledCudaError: "
            "Call to CUDA function failed.\nLast error:\nCuda failure 1 'invalid argument'"
        ),
        # torch 2.13's gloo, a peer that died mid-collective (seen on this machine)
        "gloo, peer gone": RuntimeError(
            "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by "
            "peer [127.0.0.1]:48844. This is typically caused by a remote worker crashing. Check the logs of "
            "the remote worker before reporting an error."
        ),
    },
    "timeout": {
        "NCCL watchdog": dist.DistBackendError(
            "[Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1, OpType=ALLREDUCE, "
            "NumelIn=1, NumelOut=1, Timeout(ms)=1800000) ran for 1800745 milliseconds before timing out."
        ),
        # torch 2.13's gloo, a peer that never joined (seen on this machine)
        "gloo recv": RuntimeError(
            "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] Timed out "
            "waiting 3000ms for recv operation to complete"
        ),
        "gloo work wait": RuntimeError("Operation timed out!"),
    },
    "crash": {
        "CUDA poisoned by a fork": CUDA_ERROR("CUDA error: initialization error"),
        "driver mismatch": RuntimeError(
            "The NVIDIA driver on your system is too old (found version 12080). Please update your GPU driver"
        ),
        "cuBLAS failing to start far from the cap": RuntimeError(CUBLAS_START),
        "a bug": ValueError("injected failure at N=32"),
    },
}
CASES = [(cls, name) for cls, faces in FACES.items() for name in faces]


def test_the_classes_are_the_columns_values():
    assert set(FACES) == set(FAILURES)


@pytest.mark.parametrize(("cls", "name"), CASES)
def test_each_face_has_its_class(cls, name):
    assert classify(FACES[cls][name], near=lambda: False) == cls


@pytest.mark.parametrize(("cls", "name"), CASES)
def test_the_launchers_reading_of_a_ranks_error_has_the_same_class(cls, name):
    """What the launcher has: the rank's error as its error file words it ("Type: message")."""
    err = FACES[cls][name]
    assert classify(f"rank 1 failed: {type(err).__name__}: {err}") == cls


def test_a_rank_the_launcher_saw_only_die_is_a_crash():
    assert classify("rank 0 crashed: Signal 9 (SIGKILL) received by PID 4242") == "crash"
    assert classify("rank 1 failed: OutOfMemoryAlone: N=256 does not fit: out of memory alone") == OOM


def test_cublas_failing_to_start_is_out_of_memory_only_near_the_cap():
    err = RuntimeError(CUBLAS_START)
    assert classify(err, near=lambda: True) == OOM
    assert classify(err, near=lambda: False) == "crash"
    assert classify(err) == "crash"  # nothing to tell it by (the launcher's reading)
    # An 80 GB card's figures: the allocator's limit at 78.5 GiB.
    assert starved(reserved_gib=78.5 - NEAR_CAP_GIB / 2, limit_gib=78.5, free_gib=3.0)
    assert not starved(reserved_gib=40.0, limit_gib=78.5, free_gib=38.0)  # a poisoned or mismatched CUDA
    assert starved(reserved_gib=40.0, limit_gib=None, free_gib=NEAR_CAP_GIB / 4)  # the card itself full


def test_a_kernel_fault_in_a_step_is_raised_at_once_and_oom_is_an_answer():
    """measure_point's guard: out of memory becomes the point's message, cuBLAS failing to start one
    only when starved, a kernel fault KernelFault (no agreement, nothing more on the device)."""

    def raising(err: BaseException):
        def fn():
            raise err

        return fn

    assert _guarded(raising(FACES[OOM]["CPU allocator"]), lambda: False)[1].startswith("RuntimeError: ")
    assert "CUBLAS_STATUS_NOT_INITIALIZED" in _guarded(raising(RuntimeError(CUBLAS_START)), lambda: True)[1]
    with pytest.raises(RuntimeError, match="CUBLAS_STATUS_NOT_INITIALIZED"):
        _guarded(raising(RuntimeError(CUBLAS_START)), lambda: False)
    with pytest.raises(KernelFault, match="an illegal memory access was encountered") as raised:
        _guarded(raising(CUDA_ERROR(ILLEGAL_ACCESS)), lambda: False)
    assert "\n" not in str(raised.value) and classify(raised.value) == KERNEL


def test_the_one_line_a_kernel_fault_is_recorded_by_names_it():
    line = describe(FACES[KERNEL]["NCCL meeting it"])
    assert line.startswith("DistBackendError: NCCL error in: ") and "\n" not in line
    assert line.endswith("(Cuda failure 'an illegal memory access was encountered')")
    assert describe(FACES[KERNEL]["illegal access (torch 2.8 up)"]) == (
        f"{CUDA_ERROR.__name__}: CUDA error: an illegal memory access was encountered"
    )


def test_the_injected_kernel_fault_is_torchs_own_exception():
    fault = Fault(FaultConfig(rank=1, at_n=256, where="batch", kind="kernel"))
    fault.before_batch(1, 128, torch.device("cpu"))  # below at_n: nothing
    with pytest.raises(CUDA_ERROR) as raised:
        fault.before_batch(1, 256, torch.device("cpu"))
    assert type(raised.value) is CUDA_ERROR and str(raised.value) == ILLEGAL_ACCESS
    assert classify(raised.value) == KERNEL


def test_a_kernel_fault_bounds_the_search_and_nothing_from_it_up_is_tried():
    cfg = SearchConfig(ProbeConfig(start=64, factor=2.0, granularity=16))
    trials = [Trial(64, True, "ok", 0.1), Trial(128, True, "ok", 0.2),
              Trial(256, False, "error", failure=KERNEL)]  # fmt: skip
    while (proposal := next_trial(cfg, trials)) is not None:
        assert 128 < proposal.n < 256
        trials.append(Trial(proposal.n, True, "ok", 0.3))
    assert max(t.n for t in trials if t.fits) == 240
    assert Trial(64, False, "oom").failure == OOM and Trial(64, True, "ok").failure == ""


def _row() -> ResultRow:
    return ResultRow(workload="axial_mix", workflow="inference", topology="1d", cp=2, grid="2x1", N_tokens=0,
                     N_atoms=0, MSA_depth=0, dtype="float32", kind="max-fit", warmup=1, seed=0,
                     config_hash="abc")  # fmt: skip


def test_the_max_fit_row_names_a_kernel_fault_apart_from_out_of_memory():
    best, fault = Trial(192, True, "ok", 0.3), Trial(256, False, "error", failure=KERNEL)
    row = max_fit_row(_row(), best, fault)
    assert (row.oom_at, row.kernel_fault_at) == (None, 256)
    assert (row.measured.status, row.measured.failure, row.N_tokens) == ("ok", "", 0)  # its N: the caller's
    row = max_fit_row(_row(), best, Trial(256, False, "oom"))
    assert (row.oom_at, row.kernel_fault_at) == (256, None)
    row = max_fit_row(_row(), None, Trial(64, False, "error", failure=KERNEL))
    assert (row.oom_at, row.kernel_fault_at) == (None, 64)
    assert (row.measured.status, row.measured.failure) == ("error", KERNEL)
    assert row.measured.error == "nothing ran: kernel fault at N=64"


def test_a_kernel_fault_is_recorded_at_the_n_in_flight_and_in_probe_csv(tmp_path):
    folder = RunFolder(tmp_path)
    state = ProbeState(folder, "abc")
    state.finish(Trial(n=64, fits=True, status="ok", peak_gib=0.1))
    state.start(128)
    assert not InFlight(folder).close_kernel(64, "rank 1: ...")  # another N in flight: nothing recorded
    assert InFlight(folder).close_kernel(128, "rank 1: AcceleratorError: CUDA error: an illegal memory")
    assert InFlight(folder).close_kernel(128, "rank 0: ...")  # a peer that faulted too finds it recorded
    trials = pd.read_csv(folder.probe_csv).set_index("N_tokens")
    assert trials.loc[128, ["fits", "status", "failure"]].tolist() == [False, "error", KERNEL]
    assert pd.isna(trials.loc[64, "failure"]) and ProbeState(folder).in_flight is None
    # A walltime point in flight at that N: its row, of class kernel.
    point = _row().with_measured(Measured(repeats=2))
    folder.point_in_flight.start({**point.as_dict(), "kind": "point", "N_tokens": 512})
    assert InFlight(folder).close_kernel(512, "rank 0: AcceleratorError: CUDA error: misaligned address")
    row = folder.read_results().iloc[0]
    assert (row["N_tokens"], row["status"], row["failure"]) == (512, "error", KERNEL)


def _frame(rows: list[dict]) -> pd.DataFrame:
    base = _row().as_dict()
    return pd.DataFrame([{**base, **r} for r in rows]).reindex(columns=COLUMNS)


def test_the_readout_says_kernel_fault_at_n_never_out_of_memory():
    frame = _frame([
        {"kind": "point", "N_tokens": 64, "status": "ok", "walltime_ms": 10.0, "peak_mem_gib": 0.1},
        {"kind": "point", "N_tokens": 256, "status": "error", "failure": KERNEL,
         "error": "rank 1: N=256: AcceleratorError: CUDA error: an illegal memory access was encountered"},
        {"kind": "max-fit", "N_tokens": 192, "status": "ok", "peak_mem_gib": 0.3, "kernel_fault_at": 256},
    ])  # fmt: skip
    text = readout(frame)
    assert "Largest N_tokens that fits: 192 at cp=2." in text
    assert "The probe stopped at a kernel fault, not at the memory's edge: kernel fault at N=256 (" in text
    assert "1 point(s) did not finish: N=256 kernel fault." in text
    assert "out of memory" not in text and "does not fit" not in text
    nothing = _frame([{"kind": "max-fit", "N_tokens": 64, "status": "error", "failure": KERNEL,
                       "kernel_fault_at": 64, "error": "nothing ran: kernel fault at N=64"}])  # fmt: skip
    text = readout(nothing)
    assert "kernel fault at N=64 (no N ran)" in text and "not probed" not in text


def test_a_run_that_ends_on_a_ranks_error_records_its_class_in_the_row_and_failure_json(tmp_path):
    folder = RunFolder(tmp_path)
    point = _row().with_measured(Measured(repeats=2))
    folder.point_in_flight.start({**point.as_dict(), "kind": "point", "N_tokens": 64})
    watchdog = FACES["timeout"]["NCCL watchdog"]
    close_failed(folder, 2, "error", f"rank 1 failed: {type(watchdog).__name__}: {watchdog}")
    row = folder.read_results().iloc[0]
    assert (row["status"], row["failure"]) == ("error", "timeout")
    assert folder.read_failure()["failure"] == "timeout"
    close_failed(folder, 2, "interrupted", "interrupted at N=128")  # a signal: no class
    assert folder.read_failure()["failure"] == ""
