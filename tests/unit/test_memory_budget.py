"""One memory-cap rule (`cpbench.measure.cap.cap_gib`): the cap the ranks apply (`cpbench.rank.session`),
the cap their chunks and the fake-tensor trace's are sized for (`cpbench.probe.trace.TraceSpec`), the
one the estimate is held against (`cpbench.probe.predict`) and a forecast's all come from it."""

from __future__ import annotations

import pytest

from cpbench.core import Topology
from cpbench.measure.cap import cap_gib
from cpbench.probe import predict
from cpbench.probe.trace import TraceSpec
from cpbench.runtime.rank import device_type
from cpbench.settings.schema import BenchConfig, MemoryConfig
from cpbench.workloads.axial_mix import AxialMixWorkload


def test_a_set_budget_holds_everywhere_and_a_null_one_takes_the_cpu_cap_on_cpu_alone():
    assert cap_gib(MemoryConfig(budget_gib=3.0, cpu_budget_gib=0.5), "cpu") == 3.0
    assert cap_gib(MemoryConfig(budget_gib=3.0, cpu_budget_gib=0.5), "cuda") == 3.0
    assert cap_gib(MemoryConfig(budget_gib=None, cpu_budget_gib=0.5), "cpu") == 0.5
    assert cap_gib(MemoryConfig(budget_gib=None, cpu_budget_gib=0.5), "cuda") is None
    # A forecast's device memory (a hardware preset's memory_gib) stands in for a null budget_gib.
    assert cap_gib(MemoryConfig(budget_gib=None, cpu_budget_gib=0.5), "cuda", 80.0) == 80.0
    assert cap_gib(MemoryConfig(budget_gib=None, cpu_budget_gib=0.5), "cpu", 80.0) == 80.0
    assert cap_gib(MemoryConfig(budget_gib=3.0, cpu_budget_gib=0.5), "cpu", 80.0) == 3.0
    assert (device_type("gloo"), device_type("nccl")) == ("cpu", "cuda")


def _settings(backend: str) -> BenchConfig:
    settings = BenchConfig(workload=None, output_dir="unused")
    settings.dist.backend = backend
    settings.memory.budget_gib, settings.memory.cpu_budget_gib = None, 0.01
    settings.probe.start, settings.probe.max_tokens = 16, 64
    return settings


def test_the_estimate_is_held_against_the_cap_the_ranks_would_apply():
    topology = Topology.from_config("1d", 2, None)
    gloo = _settings("gloo")
    assert TraceSpec.of(gloo).chunk_cap_gib == 0.01  # the trace's chunks: sized for the same cap
    assert TraceSpec.of(gloo, 80.0).chunk_cap_gib == 80.0  # a forecast's device memory
    assert predict.for_run(gloo, AxialMixWorkload(), topology).cap_gib == 0.01  # CPU ranks: the CPU cap
    # NCCL ranks with memory.budget_gib null are capped at their card less what they hold after
    # start-up, which only a rank can measure (the launching process never touches CUDA; this machine
    # has no GPU): the estimate has no cap to be held against.
    assert TraceSpec.of(_settings("nccl")).chunk_cap_gib is None
    with pytest.raises(ValueError, match="needs a cap"):
        predict.for_run(_settings("nccl"), AxialMixWorkload(), topology)
