"""A step's work on each rank that differs in role, counted on fake tensors in this process (each
rank in turn on torch's fake process group, probe/trace.py): what the time model prices, at any N and
CP size, with no device and no peer."""

from __future__ import annotations

from cpbench.core import Shape, Topology
from cpbench.measure.flops import count_step
from cpbench.measure.tally import StepTally
from cpbench.probe.trace import TraceSpec, fake_ranks
from cpbench.workloads.base import Workload, traits


def rank_tallies(
    workload: Workload, topology: Topology, shape: Shape, spec: TraceSpec
) -> dict[int, StepTally]:
    """Each traced rank's work of one step at `shape` (ranks of one role repeat each other), with the
    chunks a rank takes under the spec's cap."""
    tallies = {}
    for rank, ctx in fake_ranks(topology, spec):
        # A workload counted in cut forms builds its own models (measure/flops.py).
        model = None if traits(workload).flop_form is not None else workload.build_model(ctx)
        tallies[rank] = count_step(workload, model, shape, ctx, spec.train, spec.seed, tally=True).tally
    return tallies
