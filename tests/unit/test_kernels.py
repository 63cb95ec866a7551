"""The fused attention kernels (models/pairformer/kernels.py) against the materialised softmax: the
output, the log-sum-exp a CP merge reads, and the gradients of q, k, v and the bias, at every shape the
models call them with; partials over pieces of the keys merge to the whole; the FLOP count; the trace
for a CUDA rank; the refusal of cueq where it cannot run. The models with each kernel set equal the
reference end to end at cp=1, 1d and 2d: tests/e2e/test_fold_cp.py and test_fold_chunked.py."""

from __future__ import annotations

import importlib.util
import sys
import types

import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from support.tiny_fold import TINY
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils.flop_counter import FlopCounterMode

from cpbench.core import Shape, Topology
from cpbench.measure import flops
from cpbench.models.pairformer import kernels, ops
from cpbench.models.pairformer.layout import PairLayout
from cpbench.models.pairformer.modules import TriangleAttention, TriangleMultiplication
from cpbench.probe.trace import fake_rank
from cpbench.report.analysis import like_for_like
from cpbench.workloads.fold import FoldWorkload

ONE_RANK = Topology("1d", 1, (1, 1))
# (q's leading dims, bias shape, mask shape) as each model calls it: triangle attention (rows of
# queries, a bias shared by the rows, a key mask); attention with pair bias (no leading dim); the
# diffusion token attention (samples in front, one bias for all); the atom windows with samples.
CALLS = {
    "triangle": ((5,), (2, 6, 7), (1, 1, 1, 7)),
    "pair-bias": ((), (2, 6, 7), (7,)),
    "token": ((3,), (2, 6, 7), (7,)),
    "atom-windows": ((4, 3), (4, 1, 2, 6, 7), (4, 1, 1, 1, 7)),
}


def _inputs(lead: tuple, bias_shape: tuple, mask_shape: tuple, dtype=torch.float64):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(*lead, 6, 2, 4, generator=g, dtype=dtype)
    k, v = (torch.randn(*lead, 7, 2, 4, generator=g, dtype=dtype) for _ in range(2))
    bias = torch.randn(*bias_shape, generator=g, dtype=dtype)
    keep = torch.ones(mask_shape, dtype=dtype)
    keep[..., -2:] = 0  # two padded keys
    return [x.requires_grad_() for x in (q, k, v, bias)] + [ops.MASK_BIAS * (keep - 1)]


def _plain(q, k, v, bias, mask_bias):
    """Softmax attention written out: the output and the log-sum-exp."""
    s = q.movedim(-2, -3) @ k.movedim(-2, -3).transpose(-1, -2) * q.shape[-1] ** -0.5 + bias + mask_bias
    return torch.softmax(s, -1) @ v.movedim(-2, -3), torch.logsumexp(s, -1, keepdim=True)


@pytest.mark.parametrize("call", CALLS)
def test_the_fused_output_lse_and_every_gradient_are_the_softmaxs(call):
    q, k, v, bias, mask_bias = _inputs(*CALLS[call])
    part = kernels.attend_partial("sdpa", q, k, v, bias, mask_bias)
    out, lse = _plain(q, k, v, bias, mask_bias)
    torch.testing.assert_close(ops.finish(part).double(), out, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(part.m.double(), lse, rtol=1e-5, atol=1e-6)
    g = torch.Generator().manual_seed(1)
    weights = [torch.randn(x.shape, generator=g, dtype=x.dtype) for x in (out, lse)]
    fused = torch.autograd.grad((part.o * weights[0]).sum() + (part.m * weights[1]).sum(), (q, k, v, bias))
    plain = torch.autograd.grad((out * weights[0]).sum() + (lse * weights[1]).sum(), (q, k, v, bias))
    for name, a, b in zip(["q", "k", "v", "bias"], fused, plain, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=lambda m, name=name: f"d{name}: {m}")


def test_a_bias_laid_out_by_another_dim_order_gives_the_same_answer():
    """The single attention's bias is [H, i, j] permuted from z's [i, j, H]: its rows are not where a
    contiguous bias's are (torch 2.6's CPU kernel read them as if they were)."""
    q, k, v, _, mask_bias = _inputs(*CALLS["pair-bias"], dtype=torch.float32)
    bias = torch.randn(6, 7, 2).permute(2, 0, 1)
    fused = kernels.attend("sdpa", q, k, v, bias, mask_bias)
    torch.testing.assert_close(fused, kernels.attend("reference", q, k, v, bias, mask_bias))


def test_partials_over_pieces_of_the_keys_merge_to_the_whole_with_its_gradients():
    """As a CP rank merges its peers' key blocks: two halves, by log-sum-exp, equal one piece."""
    q, k, v, bias, mask_bias = _inputs(*CALLS["triangle"], dtype=torch.float32)
    halves = [
        kernels.attend_partial("sdpa", q, k[:, keys], v[:, keys], bias[..., keys], mask_bias[..., keys])
        for keys in (slice(0, 3), slice(3, 7))
    ]
    merged = ops.finish(ops.merge(*halves))
    whole = kernels.attend("sdpa", q, k, v, bias, mask_bias)
    torch.testing.assert_close(merged, whole)
    weight = torch.randn(whole.shape, generator=torch.Generator().manual_seed(1), dtype=whole.dtype)
    for a, b in zip(*(torch.autograd.grad((o * weight).sum(), (q, k, v, bias)) for o in (merged, whole)),
                    strict=True):  # fmt: skip
        torch.testing.assert_close(a, b)


def test_bfloat16_stays_within_a_percent_of_the_reference():
    """GPUs run the kernels in bfloat16: the fused path and the reference at rtol 1e-2."""
    q, k, v, bias, mask_bias = _inputs(*CALLS["triangle"], dtype=torch.float32)
    low = [x.detach().bfloat16() for x in (q, k, v, bias)]
    fused = kernels.attend("sdpa", *low, mask_bias)
    reference = kernels.attend("reference", *low, mask_bias)
    torch.testing.assert_close(fused, reference, rtol=1e-2, atol=1e-2)


def test_the_backward_holds_one_chunk_of_logits_at_a_time():
    """Under a small `auto` bound the backward walks the queries a few rows at a time, and gives the
    same gradients as in one chunk."""
    from cpbench.models.pairformer import chunking

    q, k, v, bias, mask_bias = _inputs(*CALLS["triangle"])
    grads = []
    for cap in (None, 1e-7):  # 1e-7 GiB: about 400 elements a chunk, one query row of 5 x 2 x 7
        with chunking.sized_for(cap):
            out = kernels.attend("sdpa", q, k, v, bias, mask_bias)
            grads.append(torch.autograd.grad(out.sum(), (q, k, v, bias)))
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b)


def test_the_mask_is_padded_to_aligned_rows_for_the_cuda_kernel():
    mask = torch.randn(1, 2, 6, 7)
    aligned = kernels._aligned(mask)
    assert torch.equal(aligned, mask) and aligned.stride(-1) == 1
    assert all(s % kernels.BIAS_ALIGNMENT == 0 for s in aligned.stride()[:-1]), aligned.stride()
    ready = torch.randn(1, 2, 6, 16)
    assert kernels._aligned(ready) is ready


def _tiny_fold(name: str) -> FoldWorkload:
    """The tiny fold model with one trunk pass: every attention of a training step runs under autograd
    (with more, the passes before the last run without it)."""
    return FoldWorkload(**{**TINY, "n_cycles": 1}, kernels=name)


@pytest.mark.parametrize("train", [False, True], ids=["inference", "training"])
def test_the_fused_model_counts_the_references_flops_and_its_backward_recomputes_the_scores(train):
    """The CPU flash op has a FLOP formula (torch counts it as 0): in inference the fused model counts
    what the reference does; in training its backward recomputes q k^T from the log-sum-exp, one of
    the op's two products, so it counts half the op's forward more."""
    shape = Shape(8, 72, 3)
    counted = {}
    for name in ("reference", "sdpa"):
        workload = _tiny_fold(name)
        with fake_rank(ONE_RANK, 0, torch.float32, 0) as ctx:
            counted[name] = flops._count(workload, workload.build_model(ctx), shape, ctx, train, seed=0)
    fused_op = counted["sdpa"].by_op.get(str(torch.ops.aten._scaled_dot_product_flash_attention_for_cpu), 0)
    assert fused_op > 0, counted["sdpa"].by_op
    extra = fused_op // 2 if train else 0
    assert counted["sdpa"].flops == counted["reference"].flops + extra


def test_a_trace_for_cuda_ranks_runs_the_cuda_kernel_and_counts_the_same():
    """On fake CPU tensors the trace for a CUDA rank runs the memory-efficient op (its meta kernel),
    not the CPU one, and torch's formula counts what ours counts for the CPU op."""
    counts = {}
    for device in ("cpu", "cuda"):
        with FakeTensorMode(), FlopCounterMode(display=False) as counter, kernels.for_device(device):
            q, k, v, bias, mask_bias = _inputs(*CALLS["triangle"], dtype=torch.float32)
            kernels.attend("sdpa", q, k, v, bias, mask_bias)
        counts[device] = {str(op): n for op, n in counter.get_flop_counts()["Global"].items()}
    assert list(counts["cpu"]) == ["aten._scaled_dot_product_flash_attention_for_cpu"]
    assert list(counts["cuda"]) == ["aten._scaled_dot_product_efficient_attention"]
    assert sum(counts["cpu"].values()) == sum(counts["cuda"].values()) > 0


def test_cueq_is_refused_where_it_cannot_run_saying_why():
    on_cpu = "kernels=cueq runs NVIDIA's CUDA kernels only; this run's ranks are on cpu"
    assert kernels.cueq_refusal("cpu", 128) == on_cpu
    if importlib.util.find_spec(kernels.CUEQ_PACKAGE) is None:
        why = kernels.cueq_refusal("cuda", 128)
        assert why.startswith("kernels=cueq needs the cuequivariance_torch package, not installed here")
        assert "pip install 'cpbench[cueq-cu12]'" in why


def test_rows_of_two_kernel_sets_are_two_experiments():
    rows = pd.DataFrame({"workload": ["fold"] * 2, "workflow": ["inference"] * 2, "dtype": ["float32"] * 2,
                         "kernels": ["reference", "sdpa"], "cp": [1, 1]})  # fmt: skip
    groups = like_for_like(rows)
    assert [label for label, _ in groups] == ["fold, reference kernels, inference, float32",
                                              "fold, sdpa kernels, inference, float32"]  # fmt: skip


def test_a_model_runs_the_kernels_its_workload_names_in_every_attention():
    with fake_rank(ONE_RANK, 0, torch.float32, 0) as ctx:
        model = _tiny_fold("sdpa").build_model(ctx)
    attending = [m for m in model.modules() if "kernels" in vars(type(m))]
    assert len(attending) > 4 and {m.kernels for m in attending} == {"sdpa"}
    with pytest.raises(ValueError, match="kernels='flash': allowed values are reference, sdpa, cueq"):
        _tiny_fold("flash")


def test_the_cuda_kernel_is_launched_in_batches_its_grid_can_hold(monkeypatch):
    """The memory-efficient kernel puts the batch on its grid's z axis (at most 65,535 blocks): a
    larger batch goes in slices, and the output and log-sum-exp come back whole."""
    z = kernels.GRID_Z
    assert kernels._grid_batches(2 * z + 1) == [slice(0, z), slice(z, 2 * z), slice(2 * z, 2 * z + 1)]
    monkeypatch.setattr(kernels, "GRID_Z", 2)
    with FakeTensorMode(), kernels.for_device("cuda"):
        q, k, v, bias, mask_bias = _inputs(*CALLS["triangle"], dtype=torch.float32)
        part = kernels.attend_partial("sdpa", q, k, v, bias, mask_bias)
    assert part.o.shape == (5, 2, 6, 4) and part.m.shape == (5, 2, 6, 1)


def test_the_fused_model_in_bfloat16_is_the_references_within_a_percent():
    """As GPUs run it: the tiny fold model under bf16 autocast on one rank, `sdpa` against `reference`,
    the denoising loss, every gradient and the sampled positions at rtol 1e-2."""
    from support.cp_ranks import one_rank
    from support.tiny_fold import fold_run

    from cpbench.core import RankContext

    ctx = one_rank(
        RankContext(0, 1, torch.device("cpu"), None, ONE_RANK, torch.bfloat16, 0, (0, 0), None, None)
    )
    shape = Shape(11, 120, 3)
    (loss_r, grads_r, x_r), (loss_s, grads_s, x_s) = (
        fold_run(ctx, shape, kernels=k)[:3] for k in ("reference", "sdpa")
    )
    torch.testing.assert_close(loss_s, loss_r, rtol=1e-2, atol=1e-3)
    # bf16 round-off through the sampler's steps moves a coordinate by up to about 1 % of the structure's
    # scale, near zero as well: the tolerance is 1 % of the largest coordinate
    torch.testing.assert_close(x_s, x_r, rtol=1e-2, atol=1e-2 * x_r.abs().max().item())
    for i, (g_s, g_r) in enumerate(zip(grads_s, grads_r, strict=True)):
        torch.testing.assert_close(g_s, g_r, rtol=1e-2, atol=1e-2, msg=lambda m, i=i: f"parameter {i}: {m}")


class _Cueq:
    """cuequivariance_torch 0.13's two triangle kernels, by their signatures and documented math
    (primitives/triangle.py), on CPU: the kernels themselves run on CUDA alone, so here cpbench's
    calls are checked by construction (shapes, the weights' order, the mask), not for speed."""

    def __init__(self):
        self.calls = []

    def triangle_attention(self, q, k, v, bias, mask=None, scale=None, return_aux=False, *, kv_lengths=None):
        self.calls.append("triangle_attention")
        assert q.dim() == 5 and bias.shape == (q.shape[0], 1, *q.shape[2:4], k.shape[3]), bias.shape
        logits = torch.einsum("bnhqd,bnhkd->bnhqk", q * (scale or q.shape[-1] ** -0.5), k) + bias.float()
        lse = logits.logsumexp(-1, keepdim=True)
        out = torch.einsum("bnhqk,bnhkd->bnhqd", (logits - lse).exp().to(v.dtype), v)
        return (out, lse, logits.amax(-1, keepdim=True)) if return_aux else out

    def triangle_multiplicative_update(self, x, direction="outgoing", mask=None, norm_in_weight=None,
                                       norm_in_bias=None, p_in_weight=None, p_in_bias=None, g_in_weight=None,
                                       g_in_bias=None, norm_out_weight=None, norm_out_bias=None,
                                       p_out_weight=None, p_out_bias=None, g_out_weight=None,
                                       g_out_bias=None, eps=1e-5, precision=None):  # fmt: skip
        self.calls.append("triangle_multiplicative_update")
        assert x.dim() == 4 and mask.shape == x.shape[:3] and p_in_weight.shape[1] == x.shape[-1]
        x_in = F.layer_norm(x, x.shape[-1:], norm_in_weight, norm_in_bias, eps)
        gated = F.linear(x_in, p_in_weight) * torch.sigmoid(F.linear(x_in, g_in_weight))
        a, b = (gated * mask[..., None]).chunk(2, -1)
        equation = "bikd,bjkd->bijd" if direction == "outgoing" else "bkid,bkjd->bijd"
        t = F.layer_norm(torch.einsum(equation, a, b), a.shape[-1:], norm_out_weight, norm_out_bias, eps)
        return F.linear(t, p_out_weight) * torch.sigmoid(F.linear(x_in, g_out_weight))


@pytest.fixture
def cueq(monkeypatch):
    """The stand-in installed where cpbench imports the package from."""
    stand_in, module = _Cueq(), types.ModuleType("cuequivariance_torch.primitives.triangle")
    module.triangle_attention = stand_in.triangle_attention
    module.triangle_multiplicative_update = stand_in.triangle_multiplicative_update
    for name in ("cuequivariance_torch", "cuequivariance_torch.primitives"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, module.__name__, module)
    return stand_in


@pytest.mark.parametrize("outgoing", [True, False], ids=["outgoing", "incoming"])
def test_cueq_runs_the_triangle_layers_as_the_reference_does_at_one_rank(cueq, outgoing):
    """At cp=1 `cueq` hands the whole triangle multiplication to its one kernel (weights stacked a over
    b, the pair mask on the projections), and triangle attention to its attention kernel with the
    rows as its N and the bias shared by them: output and every gradient the reference's, in training
    (forward) and in inference (the in-place update). A trace runs neither (nothing to import)."""
    torch.manual_seed(0)
    n, c_z, layout = 6, 8, PairLayout()
    z, mask = torch.randn(n, n, c_z, dtype=torch.float64), torch.ones(n, dtype=torch.float64)
    mask[-1] = 0  # a padded token: the multiplication masks it as the reference does
    ops_ = TriangleMultiplication(c_z, 4, outgoing), TriangleAttention(c_z, 2, 4, outgoing)
    for op in (op_.double() for op_ in ops_):
        answers = {}
        for name in ("reference", "cueq"):
            op.kernels, z.grad = name, None
            op.zero_grad()
            out = op(z.requires_grad_(), mask, layout)
            weights = torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out)
            (out * weights * mask[:, None, None] * mask[None, :, None]).sum().backward()  # valid pairs
            with torch.no_grad():
                in_place = op.update_(z.detach().clone(), mask, layout)
            grads = [z.grad, *(p.grad for p in op.parameters())]
            answers[name] = (out.detach(), in_place, grads)
        valid = (slice(None, -1), slice(None, -1))  # attention's padded rows differ (kernels.py): unread
        (out, in_place, grads), (ref_out, ref_in_place, ref_grads) = answers["cueq"], answers["reference"]
        torch.testing.assert_close(out[valid], ref_out[valid])
        torch.testing.assert_close(in_place[valid], ref_in_place[valid])
        for got, want in zip(grads, ref_grads, strict=True):
            torch.testing.assert_close(got, want)
    assert set(cueq.calls) == {"triangle_attention", "triangle_multiplicative_update"}
    cueq.calls.clear()
    with kernels.for_device("cuda"), FakeTensorMode():
        op = TriangleMultiplication(c_z, 4, outgoing)
        op.kernels = "cueq"
        op(torch.empty(n, n, c_z), torch.ones(n), layout)
    assert cueq.calls == []


def test_cueq_refuses_a_triangle_multiplication_width_its_kernel_does_not_take(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: object())  # the package "installed"
    assert kernels.cueq_refusal("cuda", 128) is None
    assert kernels.cueq_refusal("cuda", 48) == (
        "kernels=cueq: cuEquivariance's triangle multiplication takes hidden widths in multiples of 32, "
        "not workload.tri_mul_hidden=48"
    )
