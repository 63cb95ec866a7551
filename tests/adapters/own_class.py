"""A workload class of cpbench's own contract for `workload._target_=adapters.own_class.RowScale`: its
constructor takes its own keys and no other, so a key of the default workload handed to it fails."""

import torch

from cpbench.core import RankContext, Shape


class RowScale:
    def __init__(self, width: int, scale: float = 1.0):
        self.name, self.width, self.scale = "row_scale", width, scale

    def build_model(self, ctx: RankContext) -> torch.nn.Module:
        return torch.nn.Linear(self.width, self.width).to(ctx.device)

    def build_batch(self, shape: Shape, ctx: RankContext) -> torch.Tensor:
        rows, cols = ctx.block(shape.n_tokens)
        return torch.randn(rows.stop - rows.start, cols.stop - cols.start, self.width, device=ctx.device)

    def run_step(self, model: torch.nn.Module, batch: torch.Tensor, train: bool) -> torch.Tensor:
        out = self.scale * model(batch)
        return out.pow(2).mean() if train else out
