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
from cpbench.models.pairformer import chunking, kernels, ops
from cpbench.models.pairformer.layout import PairLayout


class LinearNoBias(nn.Linear):
    def __init__(self, c_in: int, c_out: int):
        super().__init__(c_in, c_out, bias=False)


def pair_bias_rows(z: torch.Tensor, project, chunk_size: int | str | None) -> torch.Tensor:
    """project(z) [h, w, heads] for a per-head bias from z, chunk by chunk of rows when chunking is
    on: the LayerNorm inside `project` would otherwise write a whole float32 copy of z."""
    if not chunking.in_place(chunk_size):
        return project(z)
    slices = chunking.row_slices(z.shape[0], chunk_size, z.shape[1] * z.shape[2])
    first = project(z[slices[0]])
    out = first.new_empty(z.shape[0], *first.shape[1:])
    out[slices[0]] = first
    del first
    for i in slices[1:]:
        out[i] = project(z[i])
    return out


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype the matmuls of x produce: autocast's where it is on."""
    device = x.device.type
    return torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else x.dtype


class TriangleMultiplication(nn.Module):
    """Algorithms 12 (outgoing, t_ij = sum_k a_ik b_jk) and 13 (incoming, t_ij = sum_k a_ki b_kj)."""

    LOCAL_METHODS = ("_ab", "_gate", "_post")
    kernels = "reference"  # `cueq` runs the layer as one kernel at cp=1 (kernels.triangle_multiplication)

    def __init__(self, c_z: int, c_hidden: int, outgoing: bool, chunk_size: int | str | None = None):
        super().__init__()
        self.outgoing, self.chunk_size = outgoing, chunk_size
        self.norm_in = nn.LayerNorm(c_z)
        self.a_gate, self.a_proj = LinearNoBias(c_z, c_hidden), LinearNoBias(c_z, c_hidden)
        self.b_gate, self.b_proj = LinearNoBias(c_z, c_hidden), LinearNoBias(c_z, c_hidden)
        self.gate = LinearNoBias(c_z, c_z)
        self.norm_out = nn.LayerNorm(c_hidden)
        self.out = LinearNoBias(c_hidden, c_z)

    def _ab(self, x: torch.Tensor, pair_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # a and b through one gate and one projection matmul each (stacked weights: x is read twice,
        # not four times). The mask multiplies last: the backward then keeps the mask (no grad)
        # rather than a masked copy of the gate, one N^2 c tensor fewer.
        gate = F.linear(x, torch.cat([self.a_gate.weight, self.b_gate.weight]))
        proj = F.linear(x, torch.cat([self.a_proj.weight, self.b_proj.weight]))
        a, b = (torch.sigmoid(gate) * proj * pair_mask).chunk(2, dim=-1)
        return a, b

    def _gate(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.gate(x))

    def _post(self, t: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        return g * self.out(self.norm_out(t))

    def _product(self, a: torch.Tensor, b: torch.Tensor, layout: PairLayout, n: int) -> torch.Tensor:
        chunk = self.chunk_size if chunking.in_place(self.chunk_size) else None
        if self.outgoing:
            return layout.triangle_out(a, b, n, chunk)
        # sum_k a_ki b_kj is the outgoing product of b^T and a^T, transposed
        t = layout.transposed().triangle_out(b.transpose(0, 1), a.transpose(0, 1), n, chunk)
        return t.transpose(0, 1)

    def forward(self, z: torch.Tensor, mask: torch.Tensor, layout: PairLayout) -> torch.Tensor:
        if kernels.fuses_triangle_multiplication(self.kernels, layout.single):
            return kernels.triangle_multiplication(self, z, layout.pair_mask(mask))
        n = mask.shape[0]
        x = self.norm_in(z)
        a, b = self._ab(x, layout.pair_mask(mask)[..., None].to(z.dtype))
        return self._post(self._product(a, b, layout, n), self._gate(x))

    def update_(self, z: torch.Tensor, mask: torch.Tensor, layout: PairLayout) -> torch.Tensor:
        """z plus this op's update, written over z chunk by chunk of rows (inference): a and b are
        built chunk by chunk into channel-major buffers (the product reads them as they lie, with no
        copy), then each chunk's output gate is recomputed from its rows of z, not kept whole."""
        if kernels.fuses_triangle_multiplication(self.kernels, layout.single):
            z += kernels.triangle_multiplication(self, z, layout.pair_mask(mask))
            return z
        n, (h, w, c_z) = mask.shape[0], z.shape
        pair_mask = layout.pair_mask(mask)[..., None].to(_compute_dtype(z))  # float32 would promote a, b
        hidden = self.out.in_features
        slices = chunking.row_slices(h, self.chunk_size, w * (c_z + 4 * hidden))
        a = b = None
        for i in slices:
            ai, bi = self._ab(self.norm_in(z[i]), pair_mask[i])
            if a is None:  # a[i, k] at A[c, i, k]; b[j, k] at B[c, k, j] (see `ops.triangle_out`)
                a = ai.new_empty(hidden, h, w).permute(1, 2, 0)
                b = bi.new_empty(hidden, w, h).permute(2, 1, 0)
            a[i], b[i] = ai, bi
            del ai, bi
        t = self._product(a, b, layout, n)
        del a, b
        for i in slices:
            z[i] += self._post(t[i], self._gate(self.norm_in(z[i])))
        return z


class TriangleAttention(nn.Module):
    """Algorithms 14 (starting node: row i attends over k with bias b_jk) and 15 (ending node:
    column j attends over k with bias b_ki), with gating and a per-head bias from z."""

    LOCAL_METHODS = ("_pre", "_queries", "_bias", "_kv", "_attend", "_partial", "_post")
    kernels = "reference"  # the attention kernels (kernels.py), set for the whole model by `kernels.use`

    def __init__(self, c_z: int, heads: int, width: int, starting: bool, chunk_size: int | str | None = None):
        super().__init__()
        self.starting, self.heads, self.width, self.chunk_size = starting, heads, width, chunk_size
        self.norm = nn.LayerNorm(c_z)
        self.q, self.k, self.v = (LinearNoBias(c_z, heads * width) for _ in range(3))
        self.bias = LinearNoBias(c_z, heads)
        self.gate = LinearNoBias(c_z, heads * width)
        self.out = LinearNoBias(heads * width, c_z)

    def _pre(self, z: torch.Tensor):
        x = self.norm(z)
        return (x, *self._queries(x), self.bias(x))

    def _queries(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.q(x).unflatten(-1, (self.heads, self.width)), torch.sigmoid(self.gate(x))

    def _bias(self, z: torch.Tensor) -> torch.Tensor:
        return self.bias(self.norm(z))

    def _kv(self, x: torch.Tensor):
        return (self.k(x).unflatten(-1, (self.heads, self.width)),
                self.v(x).unflatten(-1, (self.heads, self.width)))  # fmt: skip

    def _attend(self, q, k, v, bias, mask_bias) -> torch.Tensor:
        return kernels.attend(self.kernels, q, k, v, bias, mask_bias, triangle=True)

    def _partial(self, q, k, v, bias, mask_bias) -> ops.Partial:
        return kernels.attend_partial(self.kernels, q, k, v, bias, mask_bias, triangle=True)

    def _mask_bias(self, row_keep: torch.Tensor, key_keep: torch.Tensor) -> torch.Tensor:
        """[rows, 1, 1, keys] masking padded keys, and on padded query rows every key (the reference's
        rule); a fused kernel takes one mask for every row, [1, 1, 1, keys]: see kernels.py."""
        keep = row_keep * key_keep if self.kernels == "reference" else key_keep
        return (ops.MASK_BIAS * (keep - 1))[:, None, None, :]

    def _key_bias(self, b: torch.Tensor, key_keep: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """One key piece's b_jk as [h, j, k], read by every chunk of query rows: under a fused kernel with
        the key mask added here once, in the compute dtype (the kernel's mask), not once a chunk."""
        b = b.permute(2, 1, 0).contiguous()
        if self.kernels == "reference":
            return b
        return b.add_(ops.MASK_BIAS * (key_keep - 1)).to(dtype)

    def _post(self, o: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        o = o.permute(0, 2, 1, 3).flatten(-2)  # [i, h, j, d] -> [i, j, h*d]
        return self.out(g * o.to(g.dtype))

    def forward(self, z: torch.Tensor, mask: torch.Tensor, layout: PairLayout) -> torch.Tensor:
        return self._by_node(self._starting, z, mask, layout)

    def update_(self, z: torch.Tensor, mask: torch.Tensor, layout: PairLayout) -> torch.Tensor:
        """z plus this op's update, chunk by chunk of query rows, each chunk's softmax whole over its
        keys (inference). The result is z itself, except on a (P, 1) grid's ending node, where z
        is transposed by data and back."""
        if not self.starting and not layout.transposes_by_data:
            self._starting_(z.transpose(0, 1), mask, layout.transposed(), mask.shape[0])
            return z
        return self._by_node(self._starting_, z, mask, layout)

    def _by_node(self, starting, z: torch.Tensor, mask: torch.Tensor, layout: PairLayout) -> torch.Tensor:
        """The starting-node form `starting` applied as this node needs: the ending node is the
        starting node of z^T (by data on a (P, 1) grid, else on the transposed view)."""
        n = mask.shape[0]
        if self.starting:
            return starting(z, mask, layout, n)
        if layout.transposes_by_data:
            return layout.transpose(starting(layout.transpose(z, n), mask, layout, n), n)
        return starting(z.transpose(0, 1), mask, layout.transposed(), n).transpose(0, 1)

    def _starting(self, z: torch.Tensor, mask: torch.Tensor, layout: PairLayout, n: int) -> torch.Tensor:
        rows = layout.rows(n)
        x, q, g, b = self._pre(z)
        bias_t = layout.transpose(b, n)  # [k in R_r, j in C_c, h] = b_jk
        row_keep = mask[rows.start : rows.stop, None]
        state = None
        for keys, x_keys in layout.key_blocks(x, n):
            for sub, bias in layout.fetch_rows(bias_t, keys, n):
                k, v = self._kv(row_slice(x_keys, sub.start - keys.start, sub.stop - keys.start, dim=1))
                mask_bias = self._mask_bias(row_keep, mask[None, sub.start : sub.stop])
                bias = bias.permute(2, 1, 0).contiguous()  # [h, j, k]: read once per query row i
                args = (q, k, v, bias, mask_bias)
                if layout.single:  # every key in one piece: a plain softmax
                    return self._post(self._attend(*args), g)
                part = self._partial(*args)
                state = part if state is None else ops.merge(state, part)
        return self._post(ops.finish(state), g)

    def _starting_(self, z: torch.Tensor, mask: torch.Tensor, layout: PairLayout, n: int) -> torch.Tensor:
        """The starting node written over z, chunk by chunk of query rows: the bias (H channels) is
        built and fetched whole first; each chunk's keys travel the row ring as in `_starting`."""
        rows = layout.rows(n)
        h, w = z.shape[:2]
        fused = self.kernels != "reference"
        # A row's largest transient: its logits (H w n), or under a fused kernel, which writes none, its
        # normed rows, queries, keys, values, gate and output
        per_row = w * (z.shape[-1] + 5 * self.heads * self.width) if fused else self.heads * w * n
        slices = chunking.row_slices(h, self.chunk_size, per_row)
        bias_t = layout.transpose(pair_bias_rows(z, self._bias, self.chunk_size), n)  # b_jk at [k, j]
        biases = [[(sub, self._key_bias(b, mask[None, sub.start : sub.stop], _compute_dtype(z)))
                   for sub, b in layout.fetch_rows(bias_t, k, n)] for k in layout.key_ranges(n)]  # fmt: skip
        del bias_t
        row_keep = mask[rows.start : rows.stop, None]
        for i in slices:
            x = self.norm(z[i])
            q, g = self._queries(x)
            state = out = None
            for (keys, x_keys), pieces in zip(layout.key_blocks(x, n), biases, strict=True):
                for sub, bias in pieces:
                    k, v = self._kv(row_slice(x_keys, sub.start - keys.start, sub.stop - keys.start, dim=1))
                    mask_bias = (
                        None if fused else self._mask_bias(row_keep[i], mask[None, sub.start : sub.stop])
                    )
                    args = (q, k, v, bias, mask_bias)
                    if layout.single:
                        out = self._attend(*args)
                        continue
                    part = self._partial(*args)
                    state = part if state is None else ops.merge(state, part)
                    del part
            del x, k, v, q
            z[i] += self._post(ops.finish(state) if out is None else out, g)
            del state, out, g
        return z


class Transition(nn.Module):
    """Algorithm 11: LayerNorm, then SwiGLU with hidden width n * c."""

    LOCAL_METHODS = ("_run",)

    def __init__(self, c: int, factor: int, chunk_size: int | str | None = None):
        super().__init__()
        self.chunk_size, self.factor = chunk_size, factor
        self.norm = nn.LayerNorm(c)
        self.a, self.b = LinearNoBias(c, factor * c), LinearNoBias(c, factor * c)
        self.out = LinearNoBias(factor * c, c)

    def _run(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm(x)
        return self.out(ops.swiglu(self.a(x), self.b(x)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._run(x)

    def update_(self, x: torch.Tensor) -> torch.Tensor:
        """x plus this transition of x, written over x chunk by chunk of rows (inference)."""
        per_row = x[0].numel() * (1 + 3 * self.factor)
        for i in chunking.row_slices(x.shape[0], self.chunk_size, per_row):
            x[i] += self._run(x[i])
        return x


class AttentionPairBias(nn.Module):
    """Algorithm 24 as the Pairformer uses it (no conditioning, beta = 0): single-track attention
    over all tokens with a per-head bias from LayerNorm(z) and a sigmoid gate."""

    LOCAL_METHODS = ("_pre", "_pair_bias", "_kv", "_attend", "_partial", "_post")
    kernels = "reference"  # as TriangleAttention's

    def __init__(self, c_s: int, c_z: int, heads: int, chunk_size: int | str | None = None):
        super().__init__()
        self.heads, self.width, self.chunk_size = heads, c_s // heads, chunk_size
        self.norm_s = nn.LayerNorm(c_s)
        self.q = nn.Linear(c_s, c_s)
        self.k, self.v = LinearNoBias(c_s, c_s), LinearNoBias(c_s, c_s)
        self.gate = LinearNoBias(c_s, c_s)
        self.norm_z = nn.LayerNorm(c_z)
        self.bias = LinearNoBias(c_z, heads)
        self.out = LinearNoBias(c_s, c_s)

    def _pre(self, s: torch.Tensor):
        a = self.norm_s(s)
        q = self.q(a).unflatten(-1, (self.heads, self.width))
        return a, q, torch.sigmoid(self.gate(a))

    def _pair_bias(self, z: torch.Tensor) -> torch.Tensor:
        return self.bias(self.norm_z(z))

    def _kv(self, a: torch.Tensor):
        return (self.k(a).unflatten(-1, (self.heads, self.width)),
                self.v(a).unflatten(-1, (self.heads, self.width)))  # fmt: skip

    def _attend(self, q, k, v, bias, mask_bias) -> torch.Tensor:
        return kernels.attend(self.kernels, q, k, v, bias, mask_bias)

    def _partial(self, q, k, v, bias, mask_bias) -> ops.Partial:
        return kernels.attend_partial(self.kernels, q, k, v, bias, mask_bias)

    def _post(self, o: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        o = o.permute(1, 0, 2).flatten(-2)  # [h, i, d] -> [i, h*d]
        return self.out(g * o.to(g.dtype))

    def forward(
        self, s: torch.Tensor, z: torch.Tensor, mask: torch.Tensor, layout: PairLayout
    ) -> torch.Tensor:
        n = mask.shape[0]
        cols = layout.cols(n)
        a, q, g = self._pre(s)
        bias = pair_bias_rows(z, self._pair_bias, self.chunk_size).permute(2, 0, 1)  # [h, i, j]
        k, v = self._kv(layout.col_tokens(a, n))
        mask_bias = ops.MASK_BIAS * (mask[cols.start : cols.stop] - 1)
        if layout.grid.row_group is None:  # one column block: every key is here, a plain softmax
            return self._post(self._attend(q, k, v, bias, mask_bias), g)
        part = layout.merge_row_group(self._partial(q, k, v, bias, mask_bias))
        return self._post(ops.finish(part), g)
