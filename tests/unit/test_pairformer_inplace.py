"""The Pairformer ops' hand-written backwards (the softmax, the shifted exponential of the partials,
SwiGLU) against plain autograd on the textbook formulas: outputs and every input gradient, with a
fresh incoming gradient (written over in place) and with a broadcast one (which must not be)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from cpbench.models.pairformer import ops

B, Q, K, H, D = 3, 5, 7, 2, 4


def _inputs(dtype: torch.dtype = torch.float32) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, n, H, D, generator=gen).to(dtype) for n in (Q, K, K))
    bias = torch.randn(H, Q, K, generator=gen).to(dtype)
    return [x.requires_grad_() for x in (q, k, v, bias)]


def _mask_bias() -> torch.Tensor:
    keep = torch.ones(B, K)
    keep[0, -2:] = 0
    keep[1, :] = 0  # a fully masked row: uniform weights
    return (ops.MASK_BIAS * (keep - 1))[:, None, None, :]


def _reference(q, k, v, bias, mask_bias):
    logits = torch.einsum("bqhd,bkhd->bhqk", q.float(), k.float()) / D**0.5 + bias.float() + mask_bias
    return torch.einsum("bhqk,bkhd->bhqd", torch.softmax(logits, dim=-1), v.float())


def _grads(fn, inputs, reduce):
    out = fn(*inputs)
    grads = torch.autograd.grad(reduce(out), inputs)
    return out.detach(), grads


FULL = {
    "one fused softmax": lambda q, k, v, bias, mb: ops.attention(q, k, v, bias, mb),
    "merged partials": lambda q, k, v, bias, mb: ops.finish(
        ops.merge(
            ops.attention_partial(q, k[:, :3], v[:, :3], bias[..., :3], mb[..., :3]),
            ops.attention_partial(q, k[:, 3:], v[:, 3:], bias[..., 3:], mb[..., 3:]),
        )
    ),
}
COTANGENT = torch.randn(B, H, Q, D, generator=torch.Generator().manual_seed(1))
REDUCTIONS = {
    "fresh gradient": lambda out: (out * COTANGENT).sum(),
    "broadcast gradient": lambda out: out.sum(),
}


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("path", FULL)
def test_attention_backward_matches_autograd(path: str, reduction: str) -> None:
    inputs, mask_bias = _inputs(), _mask_bias()
    got, got_grads = _grads(lambda *x: FULL[path](*x, mask_bias), inputs, REDUCTIONS[reduction])
    ref, ref_grads = _grads(lambda *x: _reference(*x, mask_bias), inputs, REDUCTIONS[reduction])
    torch.testing.assert_close(got, ref)
    for name, a, b in zip(("q", "k", "v", "bias"), got_grads, ref_grads, strict=True):
        torch.testing.assert_close(a, b, msg=f"{path}, {reduction}: d{name}")


def test_in_place_softmax_takes_a_broadcast_gradient() -> None:
    """A broadcast incoming gradient (stride 0) gets a buffer of its own, not written over."""
    logits = torch.randn(B, H, Q, K, requires_grad=True)
    grad = torch.randn(H, Q, K)
    (got,) = torch.autograd.grad(ops.softmax_(logits * 1.0).sum(0), logits, grad)
    (ref,) = torch.autograd.grad(torch.softmax(logits, dim=-1).sum(0), logits, grad)
    torch.testing.assert_close(got, ref, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_swiglu_equals_autograd_bit_for_bit(dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(2)
    a, b = (torch.randn(6, 9, generator=gen).to(dtype).requires_grad_() for _ in range(2))
    cotangent = torch.randn(6, 9, generator=gen).to(dtype)
    for reduce in (lambda h: (h * cotangent).sum(), lambda h: h.sum()):
        got, got_grads = _grads(ops.swiglu, [a, b], reduce)
        ref, ref_grads = _grads(lambda x, y: F.silu(x) * y, [a, b], reduce)
        for x, y in zip([got, *got_grads], [ref, *ref_grads], strict=True):
            torch.testing.assert_close(x, y, rtol=0, atol=0)


def test_a_retained_graph_gives_the_same_gradients_twice() -> None:
    """The backwards write over their incoming gradients only, never over what they saved."""
    inputs, mask_bias = _inputs(), _mask_bias()
    out = ops.attention(*inputs, mask_bias) + ops.finish(ops.attention_partial(*inputs, mask_bias))
    out = ops.swiglu(out, out * 2.0)
    first = torch.autograd.grad((out * COTANGENT).sum(), inputs, retain_graph=True)
    second = torch.autograd.grad((out * COTANGENT).sum(), inputs)
    for a, b in zip(first, second, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
