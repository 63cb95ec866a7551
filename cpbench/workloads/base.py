"""The workload interface: three hooks over the core vocabulary (`cpbench.core`)."""

from __future__ import annotations

from typing import Any, Protocol

import torch

from cpbench.core import RankContext, Shape


class Workload(Protocol):
    """A CP model as cpbench drives it. `run_step(train=True)` returns the loss for the driver to
    backpropagate (or None when the step did its own backward); inference returns an output."""

    name: str

    def build_model(self, ctx: RankContext) -> torch.nn.Module: ...

    def build_batch(self, shape: Shape, ctx: RankContext) -> Any: ...

    def run_step(self, model: torch.nn.Module, batch: Any, train: bool) -> torch.Tensor | None: ...

    # Optional: `columns(train) -> dict` names settings that results.csv records in each row of
    # this workload (the fold workload's sampling steps and recycles).
