"""Run a module written for the fold-cp benchmark driver unchanged (`foldcp` contract), or a module
with the same signatures and cpbench's own step semantics (`native`). See docs/adapters.md."""

from __future__ import annotations

import importlib
from typing import Any

import torch

from cpbench.core import ConfigError, RankContext, Shape, Topology, TopologyKind
from cpbench.workloads.base import Contract, Limitation

HOOKS = ("build_model", "build_batch", "run_step")


class WorkloadError(ValueError):
    """A workload that cannot be used as configured."""


class FoldCPAdapter:
    def __init__(self, module: str, contract: str = "foldcp"):
        try:
            self.contract = Contract(contract)
        except ValueError:
            allowed = ", ".join(c.value for c in Contract)
            raise WorkloadError(f"workload.contract={contract}: allowed values are {allowed}") from None
        try:
            self.module = importlib.import_module(module)
        except ImportError as err:
            raise WorkloadError(f"workload.module={module}: cannot be imported ({err})") from err
        missing = [hook for hook in HOOKS if not callable(getattr(self.module, hook, None))]
        if missing:
            raise WorkloadError(
                f"workload.module={module}: lacks hook(s) {', '.join(missing)}; "
                "an adapter module defines build_model, build_batch and run_step"
            )
        self.name = module
        self.real_job = _real_job(self.module)

    def check_topology(self, topology: Topology) -> None:
        """The fold-cp driver hands its hooks a square 2d mesh named (cp0, cp1); nothing else."""
        rows, cols = topology.grid
        if self.contract is Contract.foldcp and (rows != cols or topology.kind is TopologyKind.one_d):
            raise ConfigError(
                f"topology.kind={topology.kind} topology.cp={topology.cp}: workload.contract=foldcp needs "
                "the fold-cp driver's square 2d mesh (cp0, cp1); set topology.kind=2d with cp a square "
                "(4, 9, 16, ...), or workload.contract=native"
            )

    def build_model(self, ctx: RankContext) -> torch.nn.Module:
        return self.module.build_model(ctx.mesh, ctx.device)

    def build_batch(self, shape: Shape, ctx: RankContext) -> Any:
        return self.module.build_batch(shape.n_tokens, shape.n_atoms, shape.msa_depth, ctx.mesh, ctx.device)

    def run_step(self, model: torch.nn.Module, batch: Any, train: bool) -> Any:
        return self.module.run_step(model, batch, train)


def _real_job(module: Any) -> tuple[Limitation, ...]:
    """The module's `REAL_JOB` (docs/adapters.md): what its real job runs that this benchmark does not.
    cpbench cannot change a module's own settings, so each is a limitation; none declared is one too."""
    declared = getattr(module, "REAL_JOB", None)
    if declared is None:
        return (
            Limitation(
                "the module's own settings (loop counts, sizes, inputs)", "as the module sets them",
                "not declared", "the module declares no REAL_JOB, so cpbench cannot tell how they differ",
            ),
        )  # fmt: skip
    name = module.__name__
    entries = declared.values() if isinstance(declared, dict) else [None]
    if not all(isinstance(v, dict) and "real" in v for v in entries):
        raise WorkloadError(
            f"workload.module={name}: REAL_JOB must map each setting to a dict with `real` "
            "(and optionally `benchmark`, `why`)"
        )
    return tuple(
        Limitation(what, entry.get("benchmark", "as the module runs it"), entry["real"],
                   entry.get("why", f"set in {name}: changing it needs an edit to the module"))
        for what, entry in declared.items()
    )  # fmt: skip
