"""The launching process's fake-tensor traces: the estimate before the ranks start and who holds the
peak after them. A training trace runs a backward, which a process that forks ranks must never run
(cpbench/runtime/fresh_process.py says why), so it runs in a fresh process that builds the workload
from the settings as the ranks do; an inference trace runs no autograd and stays here."""

from __future__ import annotations

from hydra.utils import instantiate

from cpbench.core import Topology
from cpbench.probe import predict
from cpbench.probe.predict import Prediction
from cpbench.runtime.fresh_process import call_in_fresh_process
from cpbench.settings.schema import BenchConfig, Workflow
from cpbench.workloads.base import Workload


def estimate(settings: BenchConfig, workload: Workload, topology: Topology) -> Prediction:
    """The run's fake-tensor estimate (`predict.for_run`); CannotTrace as it raises it."""
    if settings.workflow is Workflow.training:
        return call_in_fresh_process(_estimate, settings, topology)
    return predict.for_run(settings, workload, topology)


def holders_at(
    settings: BenchConfig, workload: Workload, topology: Topology, n: int
) -> list[tuple[str, int]]:
    """Who holds the run's peak at N (`predict.holders_at`)."""
    if settings.workflow is Workflow.training:
        return call_in_fresh_process(_holders_at, settings, topology, n)
    return predict.holders_at(settings, workload, topology, n)


def _estimate(settings: BenchConfig, topology: Topology) -> Prediction:
    return predict.for_run(settings, instantiate(settings.workload), topology)


def _holders_at(settings: BenchConfig, topology: Topology, n: int) -> list[tuple[str, int]]:
    return predict.holders_at(settings, instantiate(settings.workload), topology, n)
