"""The Pairformer stack: n_blocks blocks, with the knobs that apply to the whole stack."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from cpbench.models.pairformer import kernels
from cpbench.models.pairformer.block import PairformerBlock
from cpbench.models.pairformer.config import PairformerConfig
from cpbench.models.pairformer.layout import PairLayout


class PairformerStack(nn.Module):
    def __init__(self, cfg: PairformerConfig):
        super().__init__()
        self.cfg = cfg
        self.blocks = nn.ModuleList(PairformerBlock(cfg) for _ in range(cfg.n_blocks))
        kernels.use(self, cfg.kernels)
        if cfg.compile != "off":
            compile_local_methods(self, cfg)

    def forward(
        self, s: torch.Tensor, z: torch.Tensor, mask: torch.Tensor, layout: PairLayout
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Run every block; with `checkpoint` and autograd recording, each block's activations are
        recomputed in the backward (its collectives too, in the same order on every rank)."""
        for block in self.blocks:
            if self.cfg.checkpoint and torch.is_grad_enabled():
                s, z = checkpoint(block, s, z, mask, layout, use_reentrant=False)
            else:
                s, z = block(s, z, mask, layout)
        return s, z


def compile_local_methods(model: nn.Module, cfg: PairformerConfig) -> None:
    """torch.compile each op's communication-free methods (its LOCAL_METHODS), never a collective:
    so fullgraph=True holds in every layout, and one rank compiles the same graphs as a CP rank."""
    mode = None if cfg.compile == "default" else cfg.compile
    for module in model.modules():
        for name in getattr(module, "LOCAL_METHODS", ()):
            fn = torch.compile(
                getattr(module, name), mode=mode, fullgraph=cfg.fullgraph, backend=cfg.compile_backend
            )
            setattr(module, name, fn)
