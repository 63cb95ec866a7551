"""CUDA autocast's op lists, applied to CPU tensors, for the fake-tensor trace of a GPU run.

The trace (probe/trace.py) runs on CPU fake tensors, so the models' bf16 autocast takes CPU's op
lists, and these differ from CUDA's: CPU autocast leaves layer_norm, softmax, sum, exp... in bf16
where CUDA autocast runs them in float32, so the trace of a GPU run held some N^2-sized transients at
half their size. CUDA autocast itself cannot run in the trace: `torch.autocast("cuda")` turns itself
off on a CPU-only build, and forced on, it works on fake CUDA tensors only without autograd (any op
that records a gradient aborts the process: "PyTorch is not linked with support for cuda devices").

So, while `cuda_rules()` is active, the AutocastCPU dispatch key (where autocast casts: above
autograd, so the casts are recorded and tensors are saved for the backward in the dtype CUDA saves
them in) applies CUDA's policies to CPU tensors: every aten op that the installed torch's CUDA
autocast casts gets a kernel with its CUDA policy, and every other op that CPU autocast would cast
falls through uncast, as on CUDA. The policies are those of torch 2.13's `ATen/autocast_mode.h`
(`AT_FORALL_*`, plus `autocast_mode.cpp`'s cudnn convolutions and banned binary_cross_entropy; and the
overloads torch 2.6's lists still held, with its `_cudnn_rnn`);
tests/unit/test_autocast_rules.py checks that they name every op with an AutocastCUDA kernel in the
torch it runs under, and op by op against CUDA autocast forced on over fake CUDA tensors. An op a
later torch adds to CUDA's lists keeps CPU's rule until it is added here.

The kernels are registered process-wide while the context is active: nothing else in the process
may run CPU autocast meanwhile. Not emulated: autocast's weight cache for the ops that CUDA lowers and
CPU does not (einsum, mv, convolution, the RNN cells...: CPU_LOWERS_ALIKE keeps it for the others);
cpbench's models and adapters run without the cache. Custom (non-aten) ops keep their CPU autocast.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from functools import cache

import torch

LOWER = "lower_precision_fp"  # inputs cast to autocast's dtype (bf16 here)
FP32 = "fp32"  # inputs cast to float32
FP32_SET_OPT_DTYPE = "fp32_set_opt_dtype"  # an unset `dtype` argument set to float32
FP32_APPEND_DTYPE = "fp32_append_dtype"  # redispatched to the overload with a dtype, float32
PROMOTE = "promote"  # inputs cast to the widest floating type among them
BANNED = "banned"

_LISTS = {
    LOWER: """
        _convolution.deprecated _convolution conv1d conv2d conv3d conv_tbc conv_transpose1d
        conv_transpose2d.input conv_transpose3d.input convolution prelu addmm addmv addr matmul einsum
        mm mv linalg_vecdot linear addbmm baddbmm bmm chain_matmul linalg_multi_dot
        _thnn_fused_lstm_cell _thnn_fused_gru_cell lstm_cell gru_cell rnn_tanh_cell rnn_relu_cell
        _scaled_dot_product_flash_attention scaled_dot_product_attention
        cudnn_convolution cudnn_convolution_transpose _cudnn_rnn""",
    FP32: """
        acos asin cosh erfinv exp expm1 log log10 log2 log1p reciprocal rsqrt sinh tan
        pow.Tensor_Scalar pow.Tensor_Tensor pow.Scalar softplus layer_norm native_layer_norm rms_norm
        group_norm frobenius_norm.dim nuclear_norm nuclear_norm.dim cosine_similarity poisson_nll_loss
        cosine_embedding_loss nll_loss nll_loss2d hinge_embedding_loss kl_div l1_loss smooth_l1_loss
        huber_loss mse_loss margin_ranking_loss multilabel_margin_loss soft_margin_loss
        triplet_margin_loss multi_margin_loss binary_cross_entropy_with_logits dist pdist cdist renorm
        logsumexp upsample_nearest1d _upsample_nearest_exact1d upsample_nearest2d
        _upsample_nearest_exact2d upsample_nearest3d _upsample_nearest_exact3d upsample_linear1d
        upsample_bilinear2d _upsample_bilinear2d_aa upsample_trilinear3d upsample_bicubic2d
        _upsample_bicubic2d_aa""",
    FP32_SET_OPT_DTYPE: """
        prod prod.dim_int softmax.int log_softmax.int cumprod cumsum linalg_vector_norm
        linalg_matrix_norm linalg_matrix_norm.str_ord sum sum.dim_IntList
        prod.dim_Dimname softmax.Dimname log_softmax.Dimname cumprod.dimname cumsum.dimname
        sum.dim_DimnameList""",  # the Dimname overloads: torch 2.6's lists (the floor) still hold them
    FP32_APPEND_DTYPE: "norm.Scalar norm.ScalarOpt_dim norm.names_ScalarOpt_dim",
    PROMOTE: "addcdiv addcmul atan2 bilinear cross dot vdot grid_sampler index_put tensordot scatter_add",
    BANNED: "binary_cross_entropy",
}
# CUDA's policy of each aten op that CUDA autocast casts ("name.overload"; no overload: the default).
CUDA_POLICY: dict[str, str] = {op: policy for policy, ops in _LISTS.items() for op in ops.split()}
APPENDED = {
    "norm.Scalar": "norm.ScalarOpt_dtype",
    "norm.ScalarOpt_dim": "norm.ScalarOpt_dim_dtype",
    "norm.names_ScalarOpt_dim": "norm.names_ScalarOpt_dim_dtype",
}
# Ops that CPU autocast already lowers as CUDA does: their CPU kernel stays (with its weight cache).
_ALIKE = """
    conv1d conv2d conv3d bmm mm linalg_vecdot baddbmm addmm addbmm linear _convolution.deprecated
    matmul conv_tbc conv_transpose1d conv_transpose2d.input conv_transpose3d.input prelu
    scaled_dot_product_attention"""
CPU_LOWERS_ALIKE = frozenset(_ALIKE.split())

_KEY = "AutocastCPU"
_EXCLUDE = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastCPU)
_active: list[torch.library.Library] = []  # the registrations while active (nested entries share them)


def rules_for(device_type: str) -> AbstractContextManager[None]:
    """The autocast rules of a run on `device_type` for CPU tensors: CUDA's for "cuda", CPU's own else."""
    return cuda_rules() if device_type == "cuda" else nullcontext()


@contextmanager
def cuda_rules() -> Iterator[None]:
    """CPU autocast applies CUDA autocast's policies while this is active (see the module's docstring)."""
    if _active:  # already on: one set of registrations
        yield
        return
    cuda, cpu = cast_ops("AutocastCUDA"), cast_ops(_KEY)
    lib = torch.library.Library("aten", "IMPL")
    try:
        with warnings.catch_warnings():  # "Overriding a previously registered kernel": that is the point
            warnings.simplefilter("ignore")
            for name in sorted(cpu - cuda):
                lib.impl(name, torch.library.fallthrough_kernel, _KEY)
            for name in sorted(cuda & CUDA_POLICY.keys()):
                policy = CUDA_POLICY[name]
                if not (policy == LOWER and name in CPU_LOWERS_ALIKE and name in cpu):
                    lib.impl(name, _kernel(name, policy), _KEY)
        _active.append(lib)
        yield
    finally:
        if _active:
            _active.pop()
        lib._destroy()


@cache
def cast_ops(key: str) -> frozenset[str]:
    """The aten ops ("name.overload") with a kernel of their own at an autocast dispatch key in the
    installed torch (AutocastCUDA's are registered in CPU-only builds too), read from the dispatcher
    once, before any registration here adds to it."""
    if _active:
        raise RuntimeError("cast_ops() read while CUDA's rules are registered")
    names = (n for n in torch._C._dispatch_get_all_op_names() if n.startswith("aten::"))
    return frozenset(
        n.removeprefix("aten::") for n in names if torch._C._dispatch_has_kernel_for_dispatch_key(n, key)
    )


def overload(name: str) -> torch._ops.OpOverload:
    """The aten OpOverload named "name.overload" (no overload: the default)."""
    base, _, which = name.partition(".")
    return getattr(getattr(torch.ops.aten, base), which or "default")


def _eligible(x: object) -> bool:
    """What CUDA autocast casts, with CPU standing for CUDA: a floating tensor other than float64."""
    return (
        isinstance(x, torch.Tensor)
        and x.device.type == "cpu"
        and x.is_floating_point()
        and x.dtype != torch.float64
    )


def _cast(x: object, dtype: torch.dtype) -> object:
    """autocast's cast of one argument: an eligible tensor, or each in a list of them; the rest as is."""
    if isinstance(x, (list, tuple)):
        return type(x)(_cast(t, dtype) for t in x)
    return x.to(dtype) if _eligible(x) and x.dtype != dtype else x


def _widest(args: Iterable[object], start: torch.dtype) -> torch.dtype:
    """The promote policy's type: float32 where any eligible argument is float32, else autocast's."""
    for x in args:
        items = x if isinstance(x, (list, tuple)) else (x,)
        if any(_eligible(t) and t.dtype == torch.float32 for t in items):
            return torch.float32
    return start


def _kernel(name: str, policy: str) -> Callable[..., object]:
    """The AutocastCPU kernel applying CUDA's `policy` to op `name`; the op then runs below autocast."""
    op = overload(name)
    schema = op._schema

    def run(*args: object, **kwargs: object) -> object:
        with torch._C._ExcludeDispatchKeyGuard(_EXCLUDE):
            if policy == BANNED:
                raise RuntimeError(f"{name} is unsafe to autocast (CUDA autocast refuses it)")
            if policy == FP32_SET_OPT_DTYPE:
                if _eligible(args[0]):
                    args, kwargs = _set_dtype(schema, args, kwargs)
                return op(*args, **kwargs)
            if policy == FP32_APPEND_DTYPE:
                dtype = torch.float32 if _eligible(args[0]) else args[0].dtype
                return overload(APPENDED[name])(*_positional(schema, args), dtype=dtype)
            if policy == PROMOTE:
                dtype = _widest((*args, *kwargs.values()), torch.get_autocast_dtype("cpu"))
            else:
                dtype = torch.float32 if policy == FP32 else torch.get_autocast_dtype("cpu")
            # Last argument first, as the C++ wrapper's casts run (GCC evaluates call arguments right to left)
            kwargs = dict(reversed([(k, _cast(v, dtype)) for k, v in reversed(kwargs.items())]))
            return op(*reversed([_cast(a, dtype) for a in reversed(args)]), **kwargs)

    return run


def _set_dtype(schema: torch._C.FunctionSchema, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """The call with its optional `ScalarType? dtype` argument set to float32 where it is not set."""
    for i, arg in enumerate(schema.arguments):
        if str(arg.real_type) == "Optional[ScalarType]":
            if i < len(args) and not arg.kwarg_only:
                if args[i] is None:
                    args = (*args[:i], torch.float32, *args[i + 1 :])
            elif kwargs.get(arg.name) is None:
                kwargs = {**kwargs, arg.name: torch.float32}
    return args, kwargs


def _positional(schema: torch._C.FunctionSchema, args: tuple) -> tuple:
    """Every positional argument of a call, defaults filled in (a boxed call leaves trailing ones out)."""
    positional = [a for a in schema.arguments if not a.kwarg_only]
    return (*args, *(a.default_value for a in positional[len(args) :]))
