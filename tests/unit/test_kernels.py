"""The fused attention kernels (models/pairformer/kernels.py) against the materialised softmax: the
output, the log-sum-exp a CP merge reads, and the gradients of q, k, v and the bias, at every shape the
models call them with; partials over pieces of the keys merge to the whole; the FLOP count; the trace
for a CUDA rank; the refusal of cueq where it cannot run. The models with each kernel set equal the
reference end to end at cp=1, 1d and 2d: tests/e2e/test_fold_cp.py and test_fold_chunked.py."""

from __future__ import annotations

import importlib.util

import pandas as pd
import pytest
import torch
from support.tiny_fold import TINY
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils.flop_counter import FlopCounterMode

from cpbench.core import Shape, Topology
from cpbench.measure import flops
from cpbench.models.pairformer import kernels, ops
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
    assert kernels.cueq_refusal("cpu") == on_cpu
    if importlib.util.find_spec(kernels.CUEQ_PACKAGE) is None:
        why = kernels.cueq_refusal("cuda")
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
