"""The conditioned transformer pieces of AlphaFold3's diffusion module (Algorithms 23-26), shared by
the token transformer (here, over a `PairLayout`) and the atom transformer (over atom windows).

`ConditionedAttention` holds the weights of attention with pair bias and conditioning and splits
its math at the points where the two callers fetch keys differently: tokens get their keys from
the column group and merge softmax partials over the row group; atoms get theirs from a halo of
neighbouring atoms, window by window.
"""

from __future__ import annotations

import torch
from torch import nn

from cpbench.distributed.comm import op_label
from cpbench.models.pairformer import PairLayout, kernels, ops
from cpbench.models.pairformer.modules import LinearNoBias, pair_bias_rows


class AdaLN(nn.Module):
    """Algorithm 26: normalise a, then scale and shift it by functions of the conditioning s."""

    def __init__(self, c_a: int, c_s: int):
        super().__init__()
        self.norm_a = nn.LayerNorm(c_a, elementwise_affine=False)
        self.norm_s = nn.LayerNorm(c_s, bias=False)
        self.scale = nn.Linear(c_s, c_a)
        self.shift = LinearNoBias(c_s, c_a)

    def forward(self, a: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        s = self.norm_s(s)
        return torch.sigmoid(self.scale(s)) * self.norm_a(a) + self.shift(s)


def _zero_gate(c_s: int, c_a: int) -> nn.Linear:
    """AF3's output gate sigmoid(Linear(s)) with bias -2: a block starts close to the identity."""
    gate = nn.Linear(c_s, c_a)
    nn.init.constant_(gate.bias, -2.0)
    return gate


class ConditionedTransition(nn.Module):
    """Algorithm 25: a SwiGLU transition of AdaLN(a, s), gated by s."""

    def __init__(self, c_a: int, c_s: int, factor: int = 2):
        super().__init__()
        self.adaln = AdaLN(c_a, c_s)
        self.a, self.b = LinearNoBias(c_a, factor * c_a), LinearNoBias(c_a, factor * c_a)
        self.out = LinearNoBias(factor * c_a, c_a)
        self.gate = _zero_gate(c_s, c_a)

    def forward(self, a: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        x = self.adaln(a, s)
        return torch.sigmoid(self.gate(s)) * self.out(ops.swiglu(self.a(x), self.b(x)))


class ConditionedAttention(nn.Module):
    """Algorithm 24 with conditioning: queries, keys and values from AdaLN(a, s), a per-head bias
    from LayerNorm(pair), a sigmoid gate from the normalised a, and the output gated by s."""

    kernels = "reference"  # the attention kernels (models/pairformer/kernels.py), set by `kernels.use`

    def __init__(self, c_a: int, c_s: int, c_pair: int, heads: int):
        super().__init__()
        if c_a % heads:
            raise ValueError(f"heads={heads}: must divide the width {c_a}")
        self.heads, self.width = heads, c_a // heads
        self.adaln = AdaLN(c_a, c_s)
        self.q = nn.Linear(c_a, c_a)
        self.k, self.v = LinearNoBias(c_a, c_a), LinearNoBias(c_a, c_a)
        self.gate = LinearNoBias(c_a, c_a)
        self.norm_pair = nn.LayerNorm(c_pair)
        self.bias = LinearNoBias(c_pair, heads)
        self.out = LinearNoBias(c_a, c_a)
        self.out_gate = _zero_gate(c_s, c_a)

    def heads_of(self, x: torch.Tensor) -> torch.Tensor:
        return x.unflatten(-1, (self.heads, self.width))

    def queries(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Queries [..., H, d] and the gate of the normalised inputs x."""
        return self.heads_of(self.q(x)), torch.sigmoid(self.gate(x))

    def keys_values(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.heads_of(self.k(x)), self.heads_of(self.v(x))

    def pair_bias(self, pair: torch.Tensor) -> torch.Tensor:
        """[..., Q, K, c_pair] -> [..., H, Q, K]."""
        return self.pair_bias_last(pair).movedim(-1, -3)

    def pair_bias_last(self, pair: torch.Tensor) -> torch.Tensor:
        """[..., Q, K, c_pair] -> [..., Q, K, H]."""
        return self.bias(self.norm_pair(pair))

    def output(self, part: ops.Partial, g: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        """Normalised partial [..., H, Q, d] -> gated update [..., Q, c_a]."""
        o = ops.finish(part).movedim(-3, -2).flatten(-2)
        return torch.sigmoid(self.out_gate(s)) * self.out(g * o.to(g.dtype))


class TokenTransformer(nn.Module):
    """Algorithm 23 over tokens: each block attends over every token with a bias from the pair
    block z, then applies a conditioned transition. a [h, samples, c_a] and s [h, 1 or samples, c_s]
    are my row tokens (replicated over the row group) for a batch of diffusion samples; keys come from
    the column group and the row group merges its partials."""

    def __init__(
        self, c_a: int, c_s: int, c_z: int, n_blocks: int, heads: int, chunk_size: int | str | None = None
    ):
        super().__init__()
        self.chunk_size = chunk_size
        self.attention = nn.ModuleList(ConditionedAttention(c_a, c_s, c_z, heads) for _ in range(n_blocks))
        self.transition = nn.ModuleList(ConditionedTransition(c_a, c_s) for _ in range(n_blocks))

    def forward(
        self, a: torch.Tensor, s: torch.Tensor, z: torch.Tensor, mask: torch.Tensor, layout: PairLayout
    ) -> torch.Tensor:
        n = mask.shape[0]
        cols = layout.cols(n)
        mask_bias = ops.MASK_BIAS * (mask[cols.start : cols.stop] - 1)
        s_front = s.movedim(1, 0)  # [S, h, c_s]
        for attention, transition in zip(self.attention, self.transition, strict=True):
            with op_label("diffusion.token_attention"):
                x = attention.adaln(a, s)
                q, g = attention.queries(x.movedim(1, 0))  # the samples in front: [S, h, ...]
                k, v = attention.keys_values(layout.col_tokens(x, n).movedim(1, 0))
                # One bias for every sample: the logits [S, H, h, w] grow with the samples, it does not.
                bias = pair_bias_rows(z, attention.pair_bias_last, self.chunk_size).movedim(-1, -3)
                part = kernels.attend_partial(attention.kernels, q, k, v, bias, mask_bias)
                del bias
                a = a + attention.output(layout.merge_row_group(part), g, s_front).movedim(0, 1)
                del x, q, g, k, v, part  # before the next block: each repeats the first's peak
            with op_label("diffusion.token_transition"):
                a = a + transition(a, s)
        return a
