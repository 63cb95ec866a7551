"""Run a module written for the fold-cp benchmark driver unchanged."""

from __future__ import annotations

import importlib
from typing import Any

import torch

from cpbench.core import RankContext, Shape

HOOKS = ("build_model", "build_batch", "run_step")


class WorkloadError(ValueError):
    """A workload that cannot be used as configured."""


class FoldCPAdapter:
    def __init__(self, module: str):
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

    def build_model(self, ctx: RankContext) -> torch.nn.Module:
        return self.module.build_model(ctx.mesh, ctx.device)

    def build_batch(self, shape: Shape, ctx: RankContext) -> Any:
        return self.module.build_batch(shape.n_tokens, shape.n_atoms, shape.msa_depth, ctx.mesh, ctx.device)

    def run_step(self, model: torch.nn.Module, batch: Any, train: bool) -> torch.Tensor | None:
        return self.module.run_step(model, batch, train)
