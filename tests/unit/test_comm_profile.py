"""measure.profile_comm's choice of events (cpbench/measure/comm_profile.py): on CPU gloo's spans from a
real profiler trace; on a GPU the NCCL kernels, on torch's own event objects laid out as a CUDA trace
holds them (a CPU span where the collective is enqueued, the kernel on the device later), and None
where the trace cannot tell."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch.autograd import DeviceType
from torch.autograd.profiler_util import FunctionEvent
from torch.profiler import ProfilerActivity

from cpbench.core import Topology
from cpbench.measure import comm_profile
from cpbench.runtime.rank import rank_runtime

# Kernel names as traces record them: NCCL 2.19+ (ncclDevKernel_*, the Generic one of newer releases)
# and older NCCL (ncclKernel_*).
ALL_REDUCE = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
ALL_GATHER = "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
GENERIC = "ncclDevKernel_Generic(ncclDevKernelArgsStorage<4096ul>)"
OLD = "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)"


def event(name: str, start_us: float, end_us: float, device: DeviceType = DeviceType.CPU) -> FunctionEvent:
    return FunctionEvent(id=0, name=name, thread=0, start_us=start_us, end_us=end_us, device_type=device)


def kernel(name: str, start_us: float, end_us: float) -> FunctionEvent:
    return event(name, start_us, end_us, DeviceType.CUDA)


def step(start_us: float, end_us: float) -> FunctionEvent:
    return event(comm_profile.STEP_EVENT, start_us, end_us)


def test_on_a_gpu_the_nccl_kernels_count_not_the_span_that_enqueued_them():
    """The `nccl:` span is the 5 us of enqueueing; the kernels ran 390 us (two streams overlapping,
    counted once). A kernel between steps, or a compute kernel, is not the step's communication."""
    trace = [
        step(0, 1000),
        event("nccl:all_reduce", 100, 105),
        kernel("ampere_sgemm_128x64_nn", 0, 900),
        kernel(ALL_REDUCE, 110, 400),
        kernel(ALL_GATHER, 300, 500),
        kernel(ALL_REDUCE, 1100, 1200),  # after the step: the barrier between steps
    ]
    assert comm_profile.comm_seconds(trace, "cuda") == pytest.approx(390e-6)
    assert comm_profile.comm_seconds(trace, "cpu") == pytest.approx(5e-6)  # what was read before


@pytest.mark.parametrize("name", [ALL_REDUCE, GENERIC, OLD, f"void {OLD}", "ncclDevKernel_SendRecv"])
def test_every_nccl_kernel_name_is_a_collective(name):
    trace = [step(0, 100), event("nccl:all_reduce", 1, 2), kernel(name, 10, 60)]
    assert comm_profile.comm_seconds(trace, "cuda") == pytest.approx(50e-6)


def test_a_kernel_is_clipped_to_the_steps():
    trace = [step(0, 100), step(200, 300), event("nccl:send", 1, 2), kernel(GENERIC, 50, 250)]
    assert comm_profile.comm_seconds(trace, "cuda") == pytest.approx(100e-6)


def test_a_gpu_trace_that_cannot_tell_says_so():
    """No device event at all (no CUDA activity recorded), or collectives issued and no NCCL kernel
    seen: None, never 0."""
    issued = [step(0, 100), event("nccl:all_reduce", 10, 12)]
    assert comm_profile.comm_seconds(issued, "cuda") is None
    assert comm_profile.comm_seconds([*issued, kernel("ampere_sgemm_128x64_nn", 0, 90)], "cuda") is None
    # cp=1 issues no collective: its 0 is an answer.
    assert comm_profile.comm_seconds([step(0, 100), kernel("ampere_sgemm_128x64_nn", 0, 90)], "cuda") == 0.0


def test_without_cuda_activity_a_cuda_rank_is_profiled_on_the_cpu_alone_and_cannot_tell():
    """This build's profiler has no CUDA activity: a CUDA rank's trace holds CPU events only."""
    if ProfilerActivity.CUDA in torch.profiler.supported_activities():
        pytest.skip("this build's profiler records CUDA")
    assert comm_profile.activities("cuda") == [ProfilerActivity.CPU]
    one = Topology("1d", 1, (1, 1))
    with (
        rank_runtime(one, "gloo", 60, torch.float32, 0),
        comm_profile.profiler("cuda") as prof,
        torch.profiler.record_function(comm_profile.STEP_EVENT),
    ):
        dist.all_reduce(torch.ones(4))
    assert comm_profile.comm_seconds(prof.events(), "cuda") is None


def test_on_cpu_a_real_trace_counts_gloos_spans_inside_the_steps_only():
    """A real gloo trace: the all-reduce inside the step counts, the one after it does not."""
    with rank_runtime(Topology("1d", 1, (1, 1)), "gloo", 60, torch.float32, 0):
        t = torch.ones(1 << 16)
        with comm_profile.profiler("cpu") as prof:
            with torch.profiler.record_function(comm_profile.STEP_EVENT):
                dist.all_reduce(t)
                (t * 2).sum()
            dist.all_reduce(t)
    events = prof.events()
    inside, after = [e for e in events if e.name.startswith("gloo:")]
    seconds = comm_profile.comm_seconds(events, "cpu")
    assert seconds == pytest.approx((inside.time_range.end - inside.time_range.start) / 1e6)
    (the_step,) = [e for e in events if e.name == comm_profile.STEP_EVENT]
    assert after.time_range.start > the_step.time_range.end
