"""A step's work on each rank that differs in role, counted on fake tensors in this process (each
rank in turn on torch's fake process group): what the time model prices, at any N and CP size,
with no device and no peer."""

from __future__ import annotations

import torch

from cpbench.core import Shape, Topology
from cpbench.measure.flops import count_step
from cpbench.measure.tally import StepTally
from cpbench.models.pairformer import chunking
from cpbench.probe.predict import fake_rank, traced_ranks
from cpbench.settings.schema import BenchConfig, Workflow
from cpbench.workloads.base import Workload, traits


def rank_tallies(settings: BenchConfig, workload: Workload, topology: Topology, shape: Shape,
                 budget_gib: float | None) -> dict[int, StepTally]:  # fmt: skip
    """Each traced rank's work of one step at `shape` (ranks of one role repeat each other), with the
    chunks a rank takes under `budget_gib`."""
    train, dtype = settings.workflow is Workflow.training, getattr(torch, settings.dtype.value)
    tallies = {}
    with chunking.sized_for(budget_gib):
        for rank in traced_ranks(topology):
            with fake_rank(topology, rank, dtype, settings.seed) as ctx:
                # A workload counted in cut forms builds its own models (measure/flops.py).
                model = None if traits(workload).flop_form is not None else workload.build_model(ctx)
                tallies[rank] = count_step(
                    workload, model, shape, ctx, train, settings.seed, tally=True
                ).tally
    return tallies
