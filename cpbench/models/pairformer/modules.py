"""The Pairformer ops of the AlphaFold3 supplement (Algorithms 11-15 and 24), each written once.

Every op takes this rank's blocks and a `PairLayout`; with the one-rank layout it is the plain
algorithm. Masks come from the global token mask: the triangle updates multiply a and b by the
pair mask, the attentions add -1e9 to masked keys (pair mask for triangle attention, token mask
for attention with pair bias). Dropout (rowwise / columnwise 0.25 in AF3 training) is off.

The communication-free parts of each op are methods listed in `LOCAL_METHODS`; the `compile`
knob wraps exactly those in torch.compile, so a compiled graph never contains a collective.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from cpbench.distributed.grid import row_slice
from cpbench.models.pairformer import ops
from cpbench.models.pairformer.layout import PairLayout


class LinearNoBias(nn.Linear):
    def __init__(self, c_in: int, c_out: int):
        super().__init__(c_in, c_out, bias=False)


def _chunks(length: int, chunk_size: int | None) -> list[slice]:
    """Row slices for inference chunking; one slice when chunking is off or while autograd records."""
    if chunk_size is None or chunk_size >= length or torch.is_grad_enabled():
        return [slice(None)]
    return [slice(i, min(i + chunk_size, length)) for i in range(0, length, chunk_size)]


def _rows(x: torch.Tensor, rows: slice) -> torch.Tensor:
    """x[rows] of a chunk slice, without a slice when it covers all of x (see `row_slice`)."""
    start, stop, _ = rows.indices(x.shape[0])
    return row_slice(x, start, stop)


class TriangleMultiplication(nn.Module):
    """Algorithms 12 (outgoing, t_ij = sum_k a_ik b_jk) and 13 (incoming, t_ij = sum_k a_ki b_kj)."""

    LOCAL_METHODS = ("_pre", "_post")

    def __init__(self, c_z: int, c_hidden: int, outgoing: bool):
        super().__init__()
        self.outgoing = outgoing
        self.norm_in = nn.LayerNorm(c_z)
        self.a_gate, self.a_proj = LinearNoBias(c_z, c_hidden), LinearNoBias(c_z, c_hidden)
        self.b_gate, self.b_proj = LinearNoBias(c_z, c_hidden), LinearNoBias(c_z, c_hidden)
        self.gate = LinearNoBias(c_z, c_z)
        self.norm_out = nn.LayerNorm(c_hidden)
        self.out = LinearNoBias(c_hidden, c_z)

    def _pre(self, z: torch.Tensor, pair_mask: torch.Tensor):
        # a and b through one gate and one projection matmul each (stacked weights: x is read twice,
        # not four times). The mask multiplies last: the backward then keeps the mask (no grad)
        # rather than a masked copy of the gate, one N^2 c tensor fewer.
        x = self.norm_in(z)
        gate = F.linear(x, torch.cat([self.a_gate.weight, self.b_gate.weight]))
        proj = F.linear(x, torch.cat([self.a_proj.weight, self.b_proj.weight]))
        a, b = (torch.sigmoid(gate) * proj * pair_mask).chunk(2, dim=-1)
        return a, b, torch.sigmoid(self.gate(x))

    def _post(self, t: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        return g * self.out(self.norm_out(t))

    def forward(self, z: torch.Tensor, mask: torch.Tensor, layout: PairLayout) -> torch.Tensor:
        n = mask.shape[0]
        a, b, g = self._pre(z, layout.pair_mask(mask)[..., None].to(z.dtype))
        if self.outgoing:
            t = layout.triangle_out(a, b, n)
        else:  # sum_k a_ki b_kj is the outgoing product of b^T and a^T, transposed
            t = layout.transposed().triangle_out(b.transpose(0, 1), a.transpose(0, 1), n).transpose(0, 1)
        return self._post(t, g)


class TriangleAttention(nn.Module):
    """Algorithms 14 (starting node: row i attends over k with bias b_jk) and 15 (ending node:
    column j attends over k with bias b_ki), with gating and a per-head bias from z."""

    LOCAL_METHODS = ("_pre", "_kv", "_attend", "_partial", "_post")

    def __init__(self, c_z: int, heads: int, width: int, starting: bool, chunk_size: int | None = None):
        super().__init__()
        self.starting, self.heads, self.width, self.chunk_size = starting, heads, width, chunk_size
        self.norm = nn.LayerNorm(c_z)
        self.q, self.k, self.v = (LinearNoBias(c_z, heads * width) for _ in range(3))
        self.bias = LinearNoBias(c_z, heads)
        self.gate = LinearNoBias(c_z, heads * width)
        self.out = LinearNoBias(heads * width, c_z)

    def _pre(self, z: torch.Tensor):
        x = self.norm(z)
        q = self.q(x).unflatten(-1, (self.heads, self.width))
        return x, q, torch.sigmoid(self.gate(x)), self.bias(x)

    def _kv(self, x: torch.Tensor):
        return (self.k(x).unflatten(-1, (self.heads, self.width)),
                self.v(x).unflatten(-1, (self.heads, self.width)))  # fmt: skip

    def _attend(self, q, k, v, bias, mask_bias) -> torch.Tensor:
        return ops.attention(q, k, v, bias, mask_bias)

    def _partial(self, q, k, v, bias, mask_bias) -> ops.Partial:
        return ops.attention_partial(q, k, v, bias, mask_bias)

    def _post(self, o: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        o = o.permute(0, 2, 1, 3).flatten(-2)  # [i, h, j, d] -> [i, j, h*d]
        return self.out(g * o.to(g.dtype))

    def forward(self, z: torch.Tensor, mask: torch.Tensor, layout: PairLayout) -> torch.Tensor:
        n = mask.shape[0]
        if self.starting:
            return self._starting(z, mask, layout, n)
        if layout.transposes_by_data:
            return layout.transpose(self._starting(layout.transpose(z, n), mask, layout, n), n)
        return self._starting(z.transpose(0, 1), mask, layout.transposed(), n).transpose(0, 1)

    def _starting(self, z: torch.Tensor, mask: torch.Tensor, layout: PairLayout, n: int) -> torch.Tensor:
        rows = layout.rows(n)
        x, q, g, b = self._pre(z)
        bias_t = layout.transpose(b, n)  # [k in R_r, j in C_c, h] = b_jk
        row_keep = mask[rows.start : rows.stop, None]
        slices = _chunks(q.shape[0], self.chunk_size)
        state = None
        for keys, x_keys in layout.key_blocks(x, n):
            for sub, bias in layout.fetch_rows(bias_t, keys, n):
                k, v = self._kv(row_slice(x_keys, sub.start - keys.start, sub.stop - keys.start, dim=1))
                mask_bias = ops.MASK_BIAS * (row_keep * mask[None, sub.start : sub.stop] - 1)
                bias = bias.permute(2, 1, 0).contiguous()  # [h, j, k]: read once per query row i
                args = [(_rows(q, i), _rows(k, i), _rows(v, i), bias, _rows(mask_bias, i)[:, None, None, :])
                        for i in slices]  # fmt: skip
                if layout.single:  # every key in one piece: a plain softmax
                    outs = [self._attend(*a) for a in args]
                    return self._post(outs[0] if len(outs) == 1 else torch.cat(outs), g)
                part = ops.cat_partials([self._partial(*a) for a in args], dim=0)
                state = part if state is None else ops.merge(state, part)
        return self._post(ops.finish(state), g)


class Transition(nn.Module):
    """Algorithm 11: LayerNorm, then SwiGLU with hidden width n * c."""

    LOCAL_METHODS = ("_run",)

    def __init__(self, c: int, factor: int, chunk_size: int | None = None):
        super().__init__()
        self.chunk_size = chunk_size
        self.norm = nn.LayerNorm(c)
        self.a, self.b = LinearNoBias(c, factor * c), LinearNoBias(c, factor * c)
        self.out = LinearNoBias(factor * c, c)

    def _run(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm(x)
        return self.out(ops.swiglu(self.a(x), self.b(x)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        slices = _chunks(x.shape[0], self.chunk_size)
        if len(slices) == 1:
            return self._run(x)
        return torch.cat([self._run(x[i]) for i in slices], dim=0)


class AttentionPairBias(nn.Module):
    """Algorithm 24 as the Pairformer uses it (no conditioning, beta = 0): single-track attention
    over all tokens with a per-head bias from LayerNorm(z) and a sigmoid gate."""

    LOCAL_METHODS = ("_pre", "_kv", "_attend", "_partial", "_post")

    def __init__(self, c_s: int, c_z: int, heads: int):
        super().__init__()
        self.heads, self.width = heads, c_s // heads
        self.norm_s = nn.LayerNorm(c_s)
        self.q = nn.Linear(c_s, c_s)
        self.k, self.v = LinearNoBias(c_s, c_s), LinearNoBias(c_s, c_s)
        self.gate = LinearNoBias(c_s, c_s)
        self.norm_z = nn.LayerNorm(c_z)
        self.bias = LinearNoBias(c_z, heads)
        self.out = LinearNoBias(c_s, c_s)

    def _pre(self, s: torch.Tensor, z: torch.Tensor):
        a = self.norm_s(s)
        q = self.q(a).unflatten(-1, (self.heads, self.width))
        bias = self.bias(self.norm_z(z)).permute(2, 0, 1)  # [h, i, j]
        return a, q, torch.sigmoid(self.gate(a)), bias

    def _kv(self, a: torch.Tensor):
        return (self.k(a).unflatten(-1, (self.heads, self.width)),
                self.v(a).unflatten(-1, (self.heads, self.width)))  # fmt: skip

    def _attend(self, q, k, v, bias, mask_bias) -> torch.Tensor:
        return ops.attention(q, k, v, bias, mask_bias)

    def _partial(self, q, k, v, bias, mask_bias) -> ops.Partial:
        return ops.attention_partial(q, k, v, bias, mask_bias)

    def _post(self, o: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        o = o.permute(1, 0, 2).flatten(-2)  # [h, i, d] -> [i, h*d]
        return self.out(g * o.to(g.dtype))

    def forward(
        self, s: torch.Tensor, z: torch.Tensor, mask: torch.Tensor, layout: PairLayout
    ) -> torch.Tensor:
        n = mask.shape[0]
        cols = layout.cols(n)
        a, q, g, bias = self._pre(s, z)
        k, v = self._kv(layout.col_tokens(a, n))
        mask_bias = ops.MASK_BIAS * (mask[cols.start : cols.stop] - 1)
        if layout.grid.row_group is None:  # one column block: every key is here, a plain softmax
            return self._post(self._attend(q, k, v, bias, mask_bias), g)
        part = layout.merge_row_group(self._partial(q, k, v, bias, mask_bias))
        return self._post(ops.finish(part), g)
