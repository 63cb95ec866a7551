"""One Pairformer block (AlphaFold3 Algorithm 17): the pair updates, then the single track."""

from __future__ import annotations

import torch
from torch import nn

from cpbench.distributed.comm import op_label
from cpbench.models.pairformer import chunking
from cpbench.models.pairformer.config import PairformerConfig
from cpbench.models.pairformer.layout import PairLayout
from cpbench.models.pairformer.modules import (
    AttentionPairBias,
    Transition,
    TriangleAttention,
    TriangleMultiplication,
)

# Ledger labels, in block order: the per-op rows of the communication table.
OP_LABELS = (
    "pairformer.tri_mul_out",
    "pairformer.tri_mul_in",
    "pairformer.tri_att_start",
    "pairformer.tri_att_end",
    "pairformer.pair_transition",
    "pairformer.single_attention",
    "pairformer.single_transition",
)


class PairformerBlock(nn.Module):
    """With chunking on and autograd off (inference), every pair op writes its update over z in
    place, chunk by chunk (see `chunking`): z is the caller's to hand over."""

    def __init__(self, cfg: PairformerConfig):
        super().__init__()
        self.chunk_size = chunk = cfg.chunk_size
        self.tri_mul_out = TriangleMultiplication(cfg.c_z, cfg.tri_mul_hidden, True, chunk)
        self.tri_mul_in = TriangleMultiplication(cfg.c_z, cfg.tri_mul_hidden, False, chunk)
        self.tri_att_start = TriangleAttention(cfg.c_z, cfg.tri_heads, cfg.tri_head_width, True, chunk)
        self.tri_att_end = TriangleAttention(cfg.c_z, cfg.tri_heads, cfg.tri_head_width, False, chunk)
        self.pair_transition = Transition(cfg.c_z, cfg.transition_factor, chunk)
        self.single_attention = AttentionPairBias(cfg.c_s, cfg.c_z, cfg.single_heads, chunk)
        self.single_transition = Transition(cfg.c_s, cfg.transition_factor)

    def forward(
        self, s: torch.Tensor, z: torch.Tensor, mask: torch.Tensor, layout: PairLayout
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """s [N/rows, c_s] (my token rows), z [N/rows, N/cols, c_z] (my block), mask [N] (all tokens)."""
        in_place = chunking.in_place(self.chunk_size)
        for name in OP_LABELS[:4]:
            with op_label(name):
                op = getattr(self, name.split(".")[1])
                z = op.update_(z, mask, layout) if in_place else z + op(z, mask, layout)
        with op_label(OP_LABELS[4]):
            z = self.pair_transition.update_(z) if in_place else z + self.pair_transition(z)
        with op_label(OP_LABELS[5]):
            s = s + self.single_attention(s, z, mask, layout)
        with op_label(OP_LABELS[6]):
            s = s + self.single_transition(s)
        return s, z
