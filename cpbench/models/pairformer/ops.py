"""One-rank math of the Pairformer ops' cores, shared by every layout (one rank, 1d, 2d).

Attention is computed as a mergeable partial (unnormalised output, sum of weights, running max)
over a slice of the keys, so a layout that sees the keys in pieces merges partials with a running
log-sum-exp and gets the same softmax as one rank that sees them all at once.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

MASK_BIAS = 1e9  # added (negated) to the logits of masked keys, as AlphaFold does


class Partial(NamedTuple):
    """Softmax attention over some keys: o = sum_k exp(s_k - m) v_k, l = sum_k exp(s_k - m)."""

    o: torch.Tensor  # [..., H, Q, d] float32
    l: torch.Tensor  # noqa: E741 - the usual name. [..., H, Q, 1]
    # [..., H, Q, 1]: the reference's detached (a constant shift carries no gradient); a fused
    # kernel's is its log-sum-exp, with its gradient (models/pairformer/kernels.py)
    m: torch.Tensor


def triangle_out(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """t_ij = sum_k a_ik * b_jk per channel (the outgoing-edge triangle product), [i, j, c].

    One bmm over channel-major copies of a and b (N^2 c each, cheap): an einsum hands bmm the
    channel-last tensors with a batch stride of 1, which CPU BLAS runs an order of magnitude slower
    (forward and backward), and that product dominates the block.
    """
    return torch.bmm(a.permute(2, 0, 1).contiguous(), b.permute(2, 1, 0).contiguous()).permute(1, 2, 0)


def _logits(q: torch.Tensor, k: torch.Tensor, bias: torch.Tensor, mask_bias: torch.Tensor) -> torch.Tensor:
    """Scaled q.k plus biases, [..., H, Q, K] float32, written by a head-major matmul so the largest
    tensor here is made contiguous once and never copied (an einsum to this layout permutes it)."""
    q = (q * q.shape[-1] ** -0.5).movedim(-2, -3)
    logits = torch.matmul(q, k.movedim(-2, -3).transpose(-1, -2)).float()
    # In place: the logits are the largest tensor here (N^3 H / P in a triangle attention) and
    # neither the matmul nor the additions keep them for the backward.
    return logits.add_(bias.float()).add_(mask_bias)


def attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor, mask_bias: torch.Tensor
) -> torch.Tensor:
    """The normalised output [..., H, Q, d] when every key is here: one fused softmax, the same math
    as `finish(attention_partial(...))` with no running max or sum to keep for the backward."""
    p = softmax_(_logits(q, k, bias, mask_bias))
    return torch.matmul(p.to(v.dtype), v.movedim(-2, -3)).float()


def softmax_(logits: torch.Tensor) -> torch.Tensor:
    """Softmax over the last dim written over the logits (which nothing else keeps), and, under
    autograd, its backward written over the incoming gradient: the N^3 H / P logits, weights and
    their two gradients then share two buffers, not four. Each fresh buffer of that size costs its
    page faults as well as its memory. The same kernels as torch.softmax, so the same round-off."""
    if torch.compiler.is_compiling():  # the compiler fuses and plans buffers itself
        return torch.softmax(logits, dim=-1)
    if logits.requires_grad:
        return _InPlaceSoftmax.apply(logits)
    return torch.ops.aten._softmax.out(logits, -1, False, out=logits)


class _InPlaceSoftmax(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits: torch.Tensor) -> torch.Tensor:
        p = torch.ops.aten._softmax.out(logits, -1, False, out=logits)
        ctx.mark_dirty(logits)
        ctx.save_for_backward(p)
        return p

    @staticmethod
    def backward(ctx, dp: torch.Tensor) -> torch.Tensor:
        (p,) = ctx.saved_tensors
        return torch.ops.aten._softmax_backward_data.out(dp, p, -1, p.dtype, grad_input=_writable_like(dp, p))


def _writable_like(grad: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """The buffer a backward may write its result into: the incoming gradient itself when it is a
    fresh contiguous product that only this node reads (as the attention matmul's is), else a new
    one (a broadcast gradient, say)."""
    return grad if grad.is_contiguous() and grad.shape == like.shape else torch.empty_like(like)


def attention_partial(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor, mask_bias: torch.Tensor
) -> Partial:
    """q [..., Q, H, d], k and v [..., K, H, d]; bias and mask_bias broadcast to [..., H, Q, K].

    Logits are scaled by 1/sqrt(d) and the softmax runs in float32 (also under bf16 autocast).
    """
    logits = _logits(q, k, bias, mask_bias)
    m = logits.amax(dim=-1, keepdim=True).detach()
    p, l = shifted_exp_(logits, m)  # noqa: E741
    o = torch.matmul(p.to(v.dtype), v.movedim(-2, -3)).float()
    return Partial(o, l, m)


def shifted_exp_(logits: torch.Tensor, m: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """p = exp(logits - m) written over the logits, and l = sum_k p; m is a constant shift. Under
    autograd the backward writes over p's incoming gradient, as `softmax_` does."""
    if logits.requires_grad and not torch.compiler.is_compiling():
        return _InPlaceShiftedExp.apply(logits, m)
    p = logits.sub_(m).exp_()  # in place: only exp's output is kept for the backward
    return p, p.sum(dim=-1, keepdim=True)


class _InPlaceShiftedExp(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits: torch.Tensor, m: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        p = logits.sub_(m).exp_()
        ctx.mark_dirty(logits)
        ctx.save_for_backward(p)
        return p, p.sum(dim=-1, keepdim=True)

    @staticmethod
    def backward(ctx, dp: torch.Tensor, dl: torch.Tensor) -> tuple[torch.Tensor, None]:
        (p,) = ctx.saved_tensors
        out = _writable_like(dp, p)
        return torch.add(dp, dl, out=out).mul_(p), None


def swiglu(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """silu(a) * b, keeping only a and b for the backward (autograd would also keep silu(a), one
    more hidden-width tensor: the transitions' hidden width is 4 c, so that is 4 c per pair)."""
    if not (a.requires_grad or b.requires_grad) or torch.compiler.is_compiling():
        return F.silu(a) * b
    return _SwiGLU.apply(a, b)


class _SwiGLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(a, b)
        return F.silu(a).mul_(b)

    @staticmethod
    def backward(ctx, dh: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        a, b = ctx.saved_tensors
        db = F.silu(a).mul_(dh)
        # dh * b, then times silu'(a) by aten's own silu backward, both written over the incoming
        # gradient: one new hidden-width buffer in this backward, not three
        g = torch.mul(dh, b, out=_writable_like(dh, a))
        return torch.ops.aten.silu_backward.grad_input(g, a, grad_input=g), db


def merge(x: Partial, y: Partial) -> Partial:
    """The partial over the union of two disjoint key sets."""
    m = torch.maximum(x.m, y.m)
    sx, sy = torch.exp(x.m - m), torch.exp(y.m - m)
    return Partial(x.o * sx + y.o * sy, x.l * sx + y.l * sy, m)


def finish(p: Partial) -> torch.Tensor:
    """The normalised attention output [..., H, Q, d]."""
    return p.o / p.l
