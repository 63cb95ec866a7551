"""One memory-budget rule: the cap the ranks apply (`cpbench.rank.session`) and the budget the
fake-tensor estimate is held against (`cpbench.probe.predict`) both come from `budget_gib`."""

from __future__ import annotations

import pytest

from cpbench.core import Topology
from cpbench.measure.cap import cap_gib
from cpbench.probe import predict
from cpbench.runtime.rank import device_type
from cpbench.settings.schema import BenchConfig, MemoryConfig
from cpbench.workloads.axial_mix import AxialMixWorkload

pytestmark = pytest.mark.unit  # in-process: the fast lane (pytest -m unit)


def test_a_set_budget_holds_everywhere_and_a_null_one_takes_the_cpu_cap_on_cpu_alone():
    assert cap_gib(MemoryConfig(budget_gib=3.0, cpu_budget_gib=0.5), "cpu") == 3.0
    assert cap_gib(MemoryConfig(budget_gib=3.0, cpu_budget_gib=0.5), "cuda") == 3.0
    assert cap_gib(MemoryConfig(budget_gib=None, cpu_budget_gib=0.5), "cpu") == 0.5
    assert cap_gib(MemoryConfig(budget_gib=None, cpu_budget_gib=0.5), "cuda") is None
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
    assert predict.for_run(gloo, AxialMixWorkload(), topology).budget_gib == 0.01  # CPU ranks: the CPU cap
    # NCCL ranks with budget_gib null are capped at their card less what they hold after start-up,
    # which only a rank can measure (the launching process never touches CUDA; this machine has no
    # GPU): the estimate has no budget to be held against.
    with pytest.raises(ValueError, match="needs a budget"):
        predict.for_run(_settings("nccl"), AxialMixWorkload(), topology)
