"""The AlphaFold3 MSA module (supplement Algorithms 8-10) on the pair layouts of the Pairformer.

A rank holds the MSA columns of its row tokens, m [S, N/rows, c_m], replicated over its row group
(every rank of a mesh row computes the same m), next to its pair block z[R_r, C_c]. The pair stack
reuses the Pairformer ops; the two ops that couple m and z communicate as follows (h = N/rows,
w = N/cols per rank, nothing moves on one rank):
- outer product mean, z_ij += Linear(mean_s a_si (x) b_sj): `a` rows are local; `b` (and the MSA
  mask) of my column tokens come from an all-gather over the column group, S w c_opm values
  (the backward reduce-scatters the gradient of b the same way);
- pair-weighted averaging, m_si += Linear(g_si * sum_j softmax_j(b_ij) v_sj): the weights b_ij are
  local pairs; v of my column tokens comes from the same all-gather (S w H c values); the sum over
  j runs over my column block only, as a mergeable softmax partial that the row group merges with
  one max and two sum all-reduces (S h H c + H h values).
Neither op needs a transpose or a ring. Every collective goes through `cpbench.distributed.comm`.

Replication and gradients: m is computed on every rank of a row group, and a driver sums each
parameter's gradient over all ranks. This is exact without any correction: every collective used
here has its true adjoint as backward (all-gather <-> reduce-scatter, sum all-reduce <-> sum
all-reduce), and the loss is the sum of per-rank losses of non-replicated z blocks, so each
replica's copy of m receives only the share of dL/dm owed to its own z block (its column block
C_c), and the shares add up over the row group to the one-rank gradient. The one place where a
replica sees the whole gradient is after the merge's sum all-reduce, and there each rank only
propagates it into its own key columns j in C_c, which no other rank of the row group touches.
A value that every replica computed identically must never be all-reduced with a sum in the
forward (it would count `cols` times); nothing here does that.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from cpbench.distributed.comm import op_label
from cpbench.models.embeddings import TOKEN_FEATURES
from cpbench.models.pairformer import chunking, ops
from cpbench.models.pairformer.chunking import check_chunk_size
from cpbench.models.pairformer.config import require_positive
from cpbench.models.pairformer.layout import PairLayout
from cpbench.models.pairformer.modules import (
    LinearNoBias,
    Transition,
    TriangleAttention,
    TriangleMultiplication,
    pair_bias_rows,
)

MSA_CLASSES = 33  # 20 amino acids, unknown, 4 RNA, 4 DNA, unknown nucleic, gap, ... (docs/inputs.md)
OPM_EPS = 1e-3  # the OpenFold masked-mean denominator: sum_s mask_si mask_sj + eps

# Ledger labels, in block order: the per-op rows of the communication table.
MSA_OP_LABELS = (
    "msa.outer_product_mean",
    "msa.pair_weighted_averaging",
    "msa.transition",
    "msa.tri_mul_out",
    "msa.tri_mul_in",
    "msa.tri_att_start",
    "msa.tri_att_end",
    "msa.pair_transition",
)


@dataclass(frozen=True)
class MSAConfig:
    """AlphaFold3 defaults: c_m 64, 4 blocks, outer product mean width 32, 8 averaging heads of 8."""

    c_m: int = 64
    c_z: int = 128
    c_s_inputs: int = 384 + TOKEN_FEATURES  # width of s_inputs: AF3's c_s and the token features
    n_blocks: int = 4
    opm_hidden: int = 32  # c of the outer product mean
    pwa_heads: int = 8  # pair-weighted averaging heads
    pwa_width: int = 8  # per-head width (c of Algorithm 10)
    tri_mul_hidden: int = 128
    tri_heads: int = 4
    tri_head_width: int = 32
    transition_factor: int = 4
    chunk_size: int | str | None = None  # inference: rows per chunk (or auto), also for the pairformer ops

    def __post_init__(self) -> None:
        sizes = ("c_m", "c_z", "c_s_inputs", "n_blocks", "opm_hidden", "pwa_heads", "pwa_width")
        require_positive(self, *sizes, "tri_mul_hidden", "tri_heads", "tri_head_width", "transition_factor")
        check_chunk_size(self.chunk_size)


def _col_tokens(x: torch.Tensor, layout: PairLayout, n: int, dim: int = 1) -> torch.Tensor:
    """x for my column tokens from x for my row tokens, the token axis at `dim` (an MSA tensor
    keeps S first, while the gather wants tokens first)."""
    return layout.col_tokens(x.movedim(dim, 0), n).movedim(0, dim)


class OuterProductMean(nn.Module):
    """Algorithm 9 with the MSA mask: o_ij = sum_s w_sij a_si (x) b_sj / (eps + sum_s w_sij), where
    w_sij = mask_si mask_sj, then Linear (with bias) to c_z. The mean is taken before the bias is
    added (Algorithm 9's order), so a pair without any shared MSA entry gets exactly the bias."""

    LOCAL_METHODS = ("_pre", "_outer")

    def __init__(self, c_m: int, c_z: int, c_hidden: int, chunk_size: int | str | None = None):
        super().__init__()
        self.chunk_size = chunk_size
        self.norm = nn.LayerNorm(c_m)
        self.a, self.b = LinearNoBias(c_m, c_hidden), LinearNoBias(c_m, c_hidden)
        self.out = nn.Linear(c_hidden * c_hidden, c_z)

    def _pre(self, m: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.norm(m)
        return mask * self.a(x), mask * self.b(x)

    def _outer(self, a: torch.Tensor, b: torch.Tensor, mask_a: torch.Tensor, mask_b: torch.Tensor):
        """[i, j, c_z] from a [S, i, c], b [S, j, c] (already masked) and their masks [S, i], [S, j].

        The division by the count commutes with the bias-free projection, so it is applied to c_z
        channels rather than c^2."""
        outer = torch.einsum("sic,sjd->ijcd", a, b).flatten(-2)
        count = torch.einsum("si,sj->ij", mask_a, mask_b)[..., None]
        return F.linear(outer, self.out.weight) / (OPM_EPS + count) + self.out.bias

    def _operands(self, m: torch.Tensor, msa_mask: torch.Tensor, layout: PairLayout, n: int):
        a, b = self._pre(m, msa_mask[..., None])
        return a, _col_tokens(b, layout, n), _col_tokens(msa_mask, layout, n)

    def forward(self, m: torch.Tensor, msa_mask: torch.Tensor, layout: PairLayout, n: int) -> torch.Tensor:
        """m [S, h, c_m] and msa_mask [S, h] (float) of my row tokens; returns my z block's update."""
        a, b_cols, mask_cols = self._operands(m, msa_mask, layout, n)
        return self._outer(a, b_cols, msa_mask, mask_cols)

    def update_(
        self, z: torch.Tensor, m: torch.Tensor, msa_mask: torch.Tensor, layout: PairLayout, n: int
    ) -> torch.Tensor:
        """z plus the outer product mean, written over z chunk by chunk of rows (inference): the
        c^2-wide outer products of a chunk never exceed the chunk."""
        a, b_cols, mask_cols = self._operands(m, msa_mask, layout, n)
        per_row = z.shape[1] * (a.shape[-1] ** 2 + z.shape[2])
        for i in chunking.row_slices(z.shape[0], self.chunk_size, per_row):
            z[i] += self._outer(a[:, i], b_cols, msa_mask[:, i], mask_cols)
        return z


class PairWeightedAveraging(nn.Module):
    """Algorithm 10: every MSA row averages its columns j with weights softmax_j(b_ij) taken from
    the pair representation (no query-key logits, so no attention over S), then a sigmoid gate."""

    LOCAL_METHODS = ("_pre", "_pair_bias", "_partial", "_post")

    def __init__(self, c_m: int, c_z: int, heads: int, width: int, chunk_size: int | str | None = None):
        super().__init__()
        self.heads, self.width, self.chunk_size = heads, width, chunk_size
        self.norm_m = nn.LayerNorm(c_m)
        self.v = LinearNoBias(c_m, heads * width)
        self.gate = LinearNoBias(c_m, heads * width)
        self.norm_z = nn.LayerNorm(c_z)
        self.bias = LinearNoBias(c_z, heads)
        self.out = LinearNoBias(heads * width, c_m)

    def _pre(self, m: torch.Tensor):
        x = self.norm_m(m)
        v = self.v(x).unflatten(-1, (self.heads, self.width))  # [S, h, H, c]
        return v, torch.sigmoid(self.gate(x))

    def _pair_bias(self, z: torch.Tensor) -> torch.Tensor:
        return self.bias(self.norm_z(z))

    def _partial(self, v: torch.Tensor, bias: torch.Tensor, mask_bias: torch.Tensor) -> ops.Partial:
        """Softmax over my key columns j as a mergeable partial; o [S, H, i, c], l and m [H, i, 1].
        The weights do not depend on s, so they are computed once for all MSA rows."""
        logits = bias.float() + mask_bias
        top = logits.amax(dim=-1, keepdim=True).detach()
        p = (logits - top).exp()
        o = torch.einsum("hij,sjhc->shic", p.to(v.dtype), v).float()
        return ops.Partial(o, p.sum(dim=-1, keepdim=True), top)

    def _post(self, part: ops.Partial, g: torch.Tensor) -> torch.Tensor:
        o = ops.finish(part).permute(0, 2, 1, 3).flatten(-2)  # [S, H, i, c] -> [S, i, H*c]
        return self.out(g * o.to(g.dtype))

    def forward(
        self, m: torch.Tensor, z: torch.Tensor, mask: torch.Tensor, layout: PairLayout
    ) -> torch.Tensor:
        """m [S, h, c_m] of my row tokens, z my block, mask [N]; returns the update of m."""
        n = mask.shape[0]
        cols = layout.cols(n)
        v, g = self._pre(m)
        bias = pair_bias_rows(z, self._pair_bias, self.chunk_size).permute(2, 0, 1)  # [H, i, j]
        mask_bias = ops.MASK_BIAS * (mask[cols.start : cols.stop] - 1)
        part = self._partial(_col_tokens(v, layout, n), bias, mask_bias)
        return self._post(layout.merge_row_group(part), g)


class MSABlock(nn.Module):
    """One iteration of Algorithm 8. The last block leaves out the MSA updates (pair-weighted
    averaging and transition): its m is never read again, so they would change no output, cost
    compute and collectives, and leave parameters without gradients."""

    def __init__(self, cfg: MSAConfig, last: bool):
        super().__init__()
        self.chunk_size = chunk = cfg.chunk_size
        self.outer_product_mean = OuterProductMean(cfg.c_m, cfg.c_z, cfg.opm_hidden, chunk)
        if not last:
            self.pair_weighted_averaging = PairWeightedAveraging(
                cfg.c_m, cfg.c_z, cfg.pwa_heads, cfg.pwa_width, chunk
            )
            self.msa_transition = Transition(cfg.c_m, cfg.transition_factor, chunk)
        self.last = last
        self.tri_mul_out = TriangleMultiplication(cfg.c_z, cfg.tri_mul_hidden, True, chunk)
        self.tri_mul_in = TriangleMultiplication(cfg.c_z, cfg.tri_mul_hidden, False, chunk)
        self.tri_att_start = TriangleAttention(cfg.c_z, cfg.tri_heads, cfg.tri_head_width, True, chunk)
        self.tri_att_end = TriangleAttention(cfg.c_z, cfg.tri_heads, cfg.tri_head_width, False, chunk)
        self.pair_transition = Transition(cfg.c_z, cfg.transition_factor, chunk)

    def forward(
        self, m: torch.Tensor, msa_mask: torch.Tensor, z: torch.Tensor, mask: torch.Tensor, layout: PairLayout
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """With chunking on and autograd off, m and z are updated in place (see `chunking`)."""
        n, in_place = mask.shape[0], chunking.in_place(self.chunk_size)
        with op_label(MSA_OP_LABELS[0]):
            opm = self.outer_product_mean
            z = opm.update_(z, m, msa_mask, layout, n) if in_place else z + opm(m, msa_mask, layout, n)
        if not self.last:
            with op_label(MSA_OP_LABELS[1]):
                m = m + self.pair_weighted_averaging(m, z, mask, layout)
            with op_label(MSA_OP_LABELS[2]):
                m = self.msa_transition.update_(m) if in_place else m + self.msa_transition(m)
        for label in MSA_OP_LABELS[3:7]:
            with op_label(label):
                op = getattr(self, label.split(".")[1])
                z = op.update_(z, mask, layout) if in_place else z + op(z, mask, layout)
        with op_label(MSA_OP_LABELS[7]):
            z = self.pair_transition.update_(z) if in_place else z + self.pair_transition(z)
        return m, z


class MSAModule(nn.Module):
    """Algorithm 8: embed the MSA, then n_blocks of MSA <-> pair communication and the pair stack."""

    def __init__(self, cfg: MSAConfig):
        super().__init__()
        self.cfg = cfg
        self.embed_msa = LinearNoBias(MSA_CLASSES + 2, cfg.c_m)
        self.embed_single = LinearNoBias(cfg.c_s_inputs, cfg.c_m)
        self.blocks = nn.ModuleList(MSABlock(cfg, last=i == cfg.n_blocks - 1) for i in range(cfg.n_blocks))

    def forward(
        self,
        msa: dict[str, torch.Tensor],
        s_inputs: torch.Tensor,
        z: torch.Tensor,
        mask: torch.Tensor,
        layout: PairLayout,
    ) -> torch.Tensor:
        """msa: {'msa' [S, h] int64 classes 0..32 (or one-hot [S, h, 33]), 'has_deletion' [S, h] bool,
        'deletion_value' [S, h] float32, 'msa_mask' [S, h] bool} for my row tokens; s_inputs
        [h, c_s_inputs] (my row tokens); z [h, w, c_z] my block; mask [N] global token mask.
        Returns the updated z block."""
        classes = msa["msa"]
        if classes.dim() == 2:
            classes = F.one_hot(classes, MSA_CLASSES)
        features = torch.cat(
            [
                classes.to(z.dtype),
                msa["has_deletion"][..., None].to(z.dtype),
                msa["deletion_value"][..., None].to(z.dtype),
            ],
            dim=-1,
        )
        m = self.embed_msa(features) + self.embed_single(s_inputs)
        # Padding tokens join no outer product: their MSA entries are masked whatever the features say.
        rows = layout.rows(mask.shape[0])
        msa_mask = msa["msa_mask"].to(z.dtype) * mask[rows.start : rows.stop].to(z.dtype)
        for block in self.blocks:
            m, z = block(m, msa_mask, z, mask, layout)
        return z
