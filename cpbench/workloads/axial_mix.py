"""A small built-in CP workload: residual MLPs on a sharded pair tensor, mixed along both pair
axes through collectives. It exercises the whole machinery (mesh, collectives, autograd through
them, the comm ledger) with a model whose result does not depend on the CP layout."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from cpbench.core import RankContext, Shape
from cpbench.distributed.comm import all_reduce_sum, op_label
from cpbench.models.pairformer.config import require_positive


def pair_features(rows: slice, cols: slice, channels: int, seed: int, dtype: torch.dtype) -> torch.Tensor:
    """A pure function of the global token indices and the seed, so shards equal the whole."""
    phase = seed * (math.sqrt(5) - 1) / 2
    i = torch.arange(rows.start, rows.stop, dtype=torch.float64)[:, None, None]
    j = torch.arange(cols.start, cols.stop, dtype=torch.float64)[None, :, None]
    k = torch.arange(channels, dtype=torch.float64)[None, None, :]
    return (torch.sin(0.731 * i + 1.379 * j + 2.113 * k + phase) * torch.cos(0.17 * (i - j) + phase)).to(
        dtype
    )


class AxialMixBlock(nn.Module):
    def __init__(self, channels: int, hidden: int, ctx: RankContext):
        super().__init__()
        self.norm = nn.LayerNorm(channels)
        self.up = nn.Linear(channels, hidden)
        self.down = nn.Linear(hidden, channels)
        self.row_proj = nn.Linear(channels, channels)
        self.col_proj = nn.Linear(channels, channels)
        self.row_peers, self.col_peers = ctx.row_peers, ctx.col_peers

    def forward(self, z: torch.Tensor, n_tokens: int) -> torch.Tensor:
        z = z + self.down(F.gelu(self.up(self.norm(z))))
        with op_label("axial_mix.row_mean"):
            row_mean = all_reduce_sum(z.sum(1), self.row_peers) / n_tokens
        with op_label("axial_mix.col_mean"):
            col_mean = all_reduce_sum(z.sum(0), self.col_peers) / n_tokens
        return z + self.row_proj(row_mean)[:, None] + self.col_proj(col_mean)[None]


class AxialMixModel(nn.Module):
    def __init__(self, channels: int, hidden: int, blocks: int, ctx: RankContext):
        super().__init__()
        self.blocks = nn.ModuleList(AxialMixBlock(channels, hidden, ctx) for _ in range(blocks))

    def forward(self, z: torch.Tensor, n_tokens: int) -> torch.Tensor:
        for block in self.blocks:
            z = block(z, n_tokens)
        return z


@dataclass
class PairBatch:
    z: torch.Tensor  # this rank's [N/rows, N/cols, c] block
    n_tokens: int


class AxialMixWorkload:
    """Ignores N_atoms and MSA depth: it has no atom or MSA track."""

    name = "axial_mix"
    counts_comm = True  # every collective goes through cpbench.distributed.comm

    def __init__(self, channels: int = 32, hidden: int = 64, blocks: int = 2):
        self.channels, self.hidden, self.blocks = channels, hidden, blocks
        require_positive(self, "channels", "hidden", "blocks")  # a bad size fails by name, before any rank

    def build_model(self, ctx: RankContext) -> nn.Module:
        torch.manual_seed(ctx.seed)  # identical replicated weights on every rank
        model = AxialMixModel(self.channels, self.hidden, self.blocks, ctx)
        return model.to(device=ctx.device, dtype=ctx.dtype)

    def build_batch(self, shape: Shape, ctx: RankContext) -> PairBatch:
        if not ctx.topology.accepts(shape.n_tokens):
            raise ValueError(
                f"N_tokens={shape.n_tokens} does not tile the {ctx.topology.label} grid {ctx.topology.grid}"
            )
        rows, cols = ctx.block(shape.n_tokens)
        z = pair_features(rows, cols, self.channels, ctx.seed, ctx.dtype).to(ctx.device)
        return PairBatch(z=z, n_tokens=shape.n_tokens)

    def run_step(self, model: nn.Module, batch: PairBatch, train: bool) -> torch.Tensor:
        z = model(batch.z, batch.n_tokens)
        if not train:
            return z
        # This rank's share of the global mean square; the shares sum to the global loss.
        return z.float().pow(2).sum() / batch.n_tokens**2
