"""The attention kernels a built-in model runs (`workload.kernels`): every attention with a pair bias
(triangle attention, attention with pair bias, the diffusion token and atom attentions) goes
through `attend` or `attend_partial` here.

- `reference`: the logits written whole (ops.py), what cpbench measured before fused kernels.
- `sdpa`: torch's fused scaled-dot-product kernel, which never writes the logits: the CPU flash op
  on CPU, the memory-efficient (cutlass) op on CUDA, both taking the bias as an additive mask and
  returning the log-sum-exp, so that CP partials merge as the reference's do (ops.merge).
- `cueq`: NVIDIA cuEquivariance (CUDA only, the `cuequivariance_torch` package). Its triangle
  attention kernel runs triangle attention, once per ring step under CP (the blocks merge by their
  log-sum-exp, as Fold-CP's do); `sdpa` runs the other attentions. Its triangle multiplication
  (`triangle_multiplicative_update`) fuses the whole layer, norms, projections, product and gates,
  so it runs where one rank holds the whole sum over k: at cp=1 alone. Under CP the layer is
  cpbench's own (the product a matmul ring, as Fold-CP's). A fake-tensor trace (the estimate, the
  time model) runs stand-ins: the device's sdpa op for the attention (the same output and
  log-sum-exp allocated, the same FLOPs counted) and the unfused layer for the multiplication (its
  intermediates too: an upper bound on what the kernel holds).

Neither fused forward gives the bias a gradient that fits (the CPU op gives none; CUDA's backward
allocates it at the bias's broadcast size, the logits' size again for a triangle bias shared by
every row), so the backward is cpbench's own (`_Fused.backward`): chunk by chunk of queries it
recomputes the weights from the saved log-sum-exp, as FlashAttention's backward does, and never
holds more than a chunk's logits.

A fused kernel takes one mask for every query row: triangle attention passes its key mask alone
(the reference adds the row mask too, [rows, 1, 1, keys], which summed with the bias is the logits'
size). Only padded rows then differ from the reference, and nothing downstream reads them.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from contextlib import contextmanager
from importlib import metadata

import torch
import torch.nn.functional as F
from torch.utils import flop_counter

from cpbench.models.pairformer import chunking, ops

KERNELS = ("reference", "sdpa", "cueq")
CUEQ_PACKAGE = "cuequivariance_torch"
CUEQ_INSTALL = "pip install 'cpbench[cueq-cu12]' (or cueq-cu13: the CUDA major version of torch's build)"
# The memory-efficient kernel reads the bias in aligned rows: each stride but the last a multiple of
# 16 elements (128 bits of float32 is 4, of bfloat16 8; 16 serves both).
BIAS_ALIGNMENT = 16
GRID_Z = 65535  # CUDA's largest grid along y and z
CUEQ_HIDDEN_MULTIPLE = 32  # triangle_multiplicative_update's limitation (its docstring, 0.13)
_target: str | None = None  # the device a trace is for (`for_device`); None: the tensors' own


def check_kernels(value: object) -> None:
    """Fail by name unless `value` is one of `KERNELS`."""
    if value not in KERNELS:
        raise ValueError(f"kernels={value!r}: allowed values are {', '.join(KERNELS)}")


def cueq_refusal(device_type: str, tri_mul_hidden: int) -> str | None:
    """Why `cueq` cannot run on this device type here, or on this model, in one line (None: it can)."""
    if device_type != "cuda":
        return f"kernels=cueq runs NVIDIA's CUDA kernels only; this run's ranks are on {device_type}"
    if importlib.util.find_spec(CUEQ_PACKAGE) is None:
        return f"kernels=cueq needs the {CUEQ_PACKAGE} package, not installed here: {CUEQ_INSTALL}"
    if tri_mul_hidden % CUEQ_HIDDEN_MULTIPLE:
        return (f"kernels=cueq: cuEquivariance's triangle multiplication takes hidden widths in multiples of "
                f"{CUEQ_HIDDEN_MULTIPLE}, not workload.tri_mul_hidden={tri_mul_hidden}")  # fmt: skip
    return None


def version_of(kernels: str) -> str:
    """The package, with its version, that runs the named kernels."""
    if kernels == "cueq":
        try:
            return f"cuequivariance-torch {metadata.version('cuequivariance-torch')}"
        except metadata.PackageNotFoundError:
            return "cuequivariance-torch (not installed)"
    return f"torch {torch.__version__}"


def use(model: torch.nn.Module, kernels: str) -> None:
    """Every attention module of `model` (each declares a `kernels` attribute) runs `kernels`: one
    setting for the whole model, set once it is built."""
    check_kernels(kernels)
    for module in model.modules():
        if "kernels" in vars(type(module)):
            module.kernels = kernels


@contextmanager
def for_device(device_type: str) -> Iterator[None]:
    """Pick the fused op of `device_type` whatever device the tensors are on: a trace runs on fake
    CPU tensors for CUDA ranks, and must run (and count) the op those ranks run."""
    global _target
    before, _target = _target, device_type
    try:
        yield
    finally:
        _target = before


def attend(kernels: str, q, k, v, bias, mask_bias, triangle: bool = False) -> torch.Tensor:
    """The normalised output [..., H, Q, d] (float32) over every key, by the named kernels; q
    [..., Q, H, d], k and v [..., K, H, d], bias and mask_bias broadcast to [..., H, Q, K] (a fused
    kernel's mask_bias may be None where the bias holds the mask already)."""
    if kernels == "reference":
        return ops.attention(q, k, v, bias, mask_bias)
    return _fused(kernels, q, k, v, bias, mask_bias, triangle).o


def attend_partial(kernels: str, q, k, v, bias, mask_bias, triangle: bool = False) -> ops.Partial:
    """The mergeable partial over these keys (ops.Partial), by the named kernels. A fused kernel's
    is (output, 1, log-sum-exp): exp(lse) is the sum of weights, so the output is o / l with l = 1
    at the shift m = lse, and it merges with the others by ops.merge unchanged."""
    if kernels == "reference":
        return ops.attention_partial(q, k, v, bias, mask_bias)
    return _fused(kernels, q, k, v, bias, mask_bias, triangle)


def fuses_triangle_multiplication(kernels: str, single_rank: bool) -> bool:
    """Whether a triangle multiplication runs as cuEquivariance's one kernel: `cueq` on one rank
    (under CP no rank holds the sum over k), in a real step (a trace runs the unfused layer)."""
    return kernels == "cueq" and single_rank and _target is None


def triangle_multiplication(op: torch.nn.Module, z: torch.Tensor, pair_mask: torch.Tensor) -> torch.Tensor:
    """`op`'s update of z [N, N, c_z] (a TriangleMultiplication), by cuEquivariance's fused layer: its
    two input projections and gates stacked a over b (its p_in and g_in, [2 hidden, c_z]: a is the
    first half, as in `op._ab`), the pair mask applied to them, and gate * out(norm_out(t))."""
    from cuequivariance_torch.primitives.triangle import triangle_multiplicative_update

    update = triangle_multiplicative_update(
        z[None], "outgoing" if op.outgoing else "incoming", mask=pair_mask[None].to(z.dtype),
        norm_in_weight=op.norm_in.weight, norm_in_bias=op.norm_in.bias,
        p_in_weight=torch.cat([op.a_proj.weight, op.b_proj.weight]),
        g_in_weight=torch.cat([op.a_gate.weight, op.b_gate.weight]),
        norm_out_weight=op.norm_out.weight, norm_out_bias=op.norm_out.bias,
        p_out_weight=op.out.weight, g_out_weight=op.gate.weight, eps=op.norm_in.eps,
    )  # fmt: skip
    return update[0]


def _fused(kernels: str, q, k, v, bias, mask_bias, triangle: bool) -> ops.Partial:
    lead = q.shape[:-3]
    q4, k4, v4 = (_batched(x.movedim(-2, -3)) for x in (q, k, v))  # [B, H, Q or K, d]
    # The additive mask: the bias where a key is valid (None: the caller added the mask to the bias).
    mask = bias.to(q.dtype) if mask_bias is None else bias.to(q.dtype) + mask_bias.to(q.dtype)
    mask = _batched(mask.expand(*lead, *mask.shape[-3:]) if mask.dim() > 4 else mask)
    if mask.stride(-1) != 1 or (mask.shape[-2] > 1 and mask.stride(-2) != mask.shape[-1]):
        # both kernels read a mask's rows as they lie in memory (torch 2.6's CPU op ignored other
        # strides: a permuted pair bias, [H, i, j] of z's [i, j, H], gave wrong outputs)
        mask = mask.contiguous()
    kernel = "cueq" if kernels == "cueq" and triangle else "sdpa"
    o, lse = _Fused.apply(q4, k4, v4, mask, q.shape[-1] ** -0.5, kernel)
    o = o.reshape(*lead, *o.shape[-3:]).float()
    lse = lse.reshape(*lead, *lse.shape[-2:])[..., None]
    return ops.Partial(o, torch.ones_like(lse), lse)


def _batched(x: torch.Tensor) -> torch.Tensor:
    """[..., H, L, d] as the [B, H, L, d] the kernels take: the leading dims flattened into one (a
    copy only where a broadcast dim must be made real), or a batch of one added."""
    if x.dim() == 3:
        return x[None]
    return x if x.dim() == 4 else x.reshape(-1, *x.shape[-3:])


class _Fused(torch.autograd.Function):
    """A fused forward (output and log-sum-exp) with a chunked backward that gives q, k, v and the
    additive mask their gradients, and takes the log-sum-exp's own (a CP merge reads it)."""

    @staticmethod
    def forward(ctx, q, k, v, mask, scale: float, kernel: str):  # noqa: ANN001, ANN205
        o, lse = _forward(q, k, v, mask, scale, kernel)
        ctx.save_for_backward(q, k, v, mask, o, lse)
        ctx.scale = scale
        return o, lse

    @staticmethod
    def backward(ctx, do: torch.Tensor, dlse: torch.Tensor | None):  # noqa: ANN205
        q, k, v, mask, o, lse = ctx.saved_tensors
        scale = ctx.scale
        wants_q, wants_k, wants_v, wants_mask = ctx.needs_input_grad[:4]
        acc = torch.promote_types(q.dtype, torch.float32)  # sums in float32 at least
        dq = torch.empty(q.shape, dtype=acc, device=q.device) if wants_q else None
        dk, dv = (torch.zeros(x.shape, dtype=acc, device=x.device) if wanted else None
                  for x, wanted in ((k, wants_k), (v, wants_v)))  # fmt: skip
        dmask = torch.zeros(mask.shape, dtype=acc, device=mask.device) if wants_mask else None
        # d lse / d s_k = p_k, so the log-sum-exp's gradient joins the softmax's: ds = p (dp - D + dlse)
        shift = (do.to(acc) * o.to(acc)).sum(-1)
        if dlse is not None:
            shift = shift - dlse.to(acc)
        b, h, n_q = q.shape[:3]
        for rows in chunking.row_slices(n_q, chunking.AUTO, b * h * k.shape[-2]):
            q_c, do_c = q[..., rows, :], do[..., rows, :].to(v.dtype)
            p = torch.matmul(q_c, k.transpose(-1, -2)).to(acc).mul_(scale)
            p = p.add_(_rows_of(mask, rows)).sub_(lse[..., rows, None]).exp_()  # the weights
            if wants_v:
                dv += torch.matmul(p.transpose(-1, -2).to(v.dtype), do_c)
            ds = torch.matmul(do_c, v.transpose(-1, -2)).to(acc)
            ds = ds.sub_(shift[..., rows, None]).mul_(p)
            del p
            if wants_mask:
                _rows_of(dmask, rows).add_(ds.sum_to_size(_rows_of(mask, rows).shape))
            ds = ds.to(k.dtype)
            if wants_q:
                dq[..., rows, :] = torch.matmul(ds, k).mul_(scale)
            if wants_k:
                dk += torch.matmul(ds.transpose(-1, -2), q_c).mul_(scale)
            del ds
        grads = [None if g is None else g.to(x.dtype) for g, x in ((dq, q), (dk, k), (dv, v), (dmask, mask))]
        return (*grads, None, None)  # no gradient for the scale and the kernel's name


def _rows_of(mask: torch.Tensor, rows: slice) -> torch.Tensor:
    """The mask's query rows `rows` (all of it where it broadcasts over the queries)."""
    return mask if mask.shape[-2] == 1 else mask[..., rows, :]


def _forward(q, k, v, mask, scale: float, kernel: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(output [B, H, Q, d], log-sum-exp [B, H, Q] float32) of the device's fused op."""
    device = _target or q.device.type
    if kernel == "cueq" and _target is None:  # a trace runs its stand-in: the device's sdpa op below
        from cuequivariance_torch.primitives.triangle import triangle_attention

        # [B, H, Q, d] with B the rows: cuEquivariance takes [1, rows, H, Q, d], its bias
        # [1, 1, H, Q, K] (shared by the rows) and gives the log-sum-exp beside the output.
        o, lse, _ = triangle_attention(
            q[None], k[None], v[None], mask[None], None, scale=scale, return_aux=True
        )
        return o[0], lse.reshape(q.shape[:3]).float()
    if device == "cuda":
        mask = _aligned(mask).expand(*q.shape[:3], k.shape[-2])
        pieces = [
            torch.ops.aten._scaled_dot_product_efficient_attention(
                q[b], k[b], v[b], mask[b], True, scale=scale
            )[:2]
            for b in _grid_batches(q.shape[0])
        ]
        o, lse = (torch.cat(parts) if len(parts) > 1 else parts[0] for parts in zip(*pieces, strict=True))
        return o, lse[..., : q.shape[-2]]  # the kernel pads the log-sum-exp's rows to a multiple of 32
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, attn_mask=mask, scale=scale)


def _grid_batches(batch: int) -> list[slice]:
    """The batch in slices the memory-efficient kernel can launch: its grid puts the batch on the z
    axis, at most `GRID_Z` blocks (more is "invalid configuration argument": pytorch#146704). A triangle
    attention's batch is its rank's rows; the atom windows' is windows x samples (48 in training)."""
    return [slice(i, min(i + GRID_Z, batch)) for i in range(0, batch, GRID_Z)]


def _aligned(mask: torch.Tensor) -> torch.Tensor:
    """The mask in rows whose stride is a multiple of `BIAS_ALIGNMENT` (a slice of a padded copy)."""
    keys = mask.shape[-1]
    if mask.stride(-1) == 1 and all(s % BIAS_ALIGNMENT == 0 for s in mask.stride()[:-1]):
        return mask
    return F.pad(mask, (0, -keys % BIAS_ALIGNMENT))[..., :keys]


def _count_cpu_flash(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:  # noqa: ANN001
    """The CPU flash op's FLOPs, by torch's formula for its CUDA siblings (q k^T and p v)."""
    return flop_counter.sdpa_flop_count(query_shape, key_shape, value_shape)


# torch.utils.flop_counter counts the CUDA fused ops and not the CPU one (0 FLOPs): a forecast would
# price attention's compute as bytes moved.
_CPU_FLASH = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
if _CPU_FLASH not in flop_counter.flop_registry:
    flop_counter.register_flop_formula(_CPU_FLASH)(_count_cpu_flash)
