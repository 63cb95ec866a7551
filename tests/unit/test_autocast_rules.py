"""probe/autocast_rules.py: CUDA autocast's op lists applied to CPU tensors, checked against CUDA
autocast itself.

The oracle: on this CPU-only build CUDA autocast runs over fake CUDA tensors, forced on
(`torch.autocast("cuda")` turns itself off where CUDA is not available: the `cuda_autocast` fixture
lets it run) and without autograd (an op that records a gradient on a fake CUDA tensor aborts the
process). A few Python bindings look the CUDA device up before they dispatch and fail here
(indexing, `Tensor.to` a device, `contiguous`): in the model-level oracle `_CudaBindings` calls the
aten ops they dispatch to instead.
"""

from __future__ import annotations

import functools
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from hydra import compose, initialize_config_module
from hydra.utils import instantiate
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.nn.utils.stateless import _reparametrize_module
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from cpbench.core import Topology
from cpbench.models.pairformer import chunking
from cpbench.probe import autocast_rules, trace
from cpbench.probe.trace import TraceSpec
from cpbench.runtime.seed import seed_all
from cpbench.settings.schema import register
from cpbench.sweep import resolve_shape
from cpbench.torch_compat import SkipCollectives

BF, F32, I64 = torch.bfloat16, torch.float32, torch.int64
CUDA = torch.device("cuda")
ONE_RANK = Topology("1d", 1, (1, 1))


# The oracle needs fake CUDA tensors that never reach a driver: a CPU-only torch build (or a GPU). A
# CUDA build on a machine without one (the floor lane's torch 2.6 wheel) reaches for the driver in some
# fake kernels ("CUDA driver version is insufficient"), so there the emulation runs unchecked by it.
ORACLE_RUNS = not torch.backends.cuda.is_built() or torch.cuda.is_available()
needs_oracle = pytest.mark.skipif(not ORACLE_RUNS, reason="a CUDA build without a GPU: no fake-CUDA oracle")


@pytest.fixture
def cuda_autocast(monkeypatch):
    """`torch.autocast("cuda", torch.bfloat16)` on: its C++ rules then cast fake CUDA tensors here."""
    monkeypatch.setattr(torch.cuda.amp.common, "amp_definitely_not_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)


def test_every_op_cuda_autocast_casts_in_this_torch_has_its_policy():
    """The ops with an AutocastCUDA kernel in the installed torch (torch 2.13: the 119 of the table)."""
    cuda = autocast_rules.cast_ops("AutocastCUDA")
    unknown = cuda - set(autocast_rules.CUDA_POLICY)
    assert len(cuda) > 100 and not unknown, sorted(unknown)
    assert autocast_rules.cast_ops("AutocastCPU") >= autocast_rules.CPU_LOWERS_ALIKE


class _Dispatched(TorchDispatchMode):
    """Each op dispatched below autocast, with its outputs' dtypes and shapes (not their device; nor
    the device queries of C++ code, which only a fake CUDA tensor answers through dispatch)."""

    def __init__(self):
        super().__init__()
        self.ops: list[tuple] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func is torch.ops.prim.device.default:
            return out
        leaves = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
        self.ops.append((str(func), [(t.dtype, tuple(t.shape)) for t in leaves]))
        return out


# op sample: (aten ops it covers, the call, its tensor inputs as (shape, dtype), whether CPU autocast's
# own lists dispatch it otherwise than CUDA's). Activations come in bf16, weights in float32.
X, X32, W, W32 = ((4, 8), BF), ((4, 8), F32), ((8,), F32), ((8, 8), F32)
IDX, IDX2, ROWS, ROWS32 = ((2,), I64), ((2, 8), I64), ((2, 8), BF), ((2, 8), F32)
NORM = torch.ops.aten.norm
LN = functools.partial(torch.ops.aten.native_layer_norm, normalized_shape=(8,), eps=1e-5)
SAMPLES = {
    "linear": (["linear"], F.linear, [X, W32, W], False),
    "matmul": (["matmul"], torch.matmul, [((2, 4, 8), BF), W32], False),
    "mm": (["mm"], torch.mm, [X, W32], False),
    "addmm": (["addmm"], torch.addmm, [W, X, W32], False),
    "bmm": (["bmm"], torch.bmm, [((2, 4, 8), F32), ((2, 8, 3), BF)], False),
    "einsum": (["einsum"], functools.partial(torch.einsum, "ijc,kjc->ikc"), [((4, 5, 3), F32)] * 2, True),
    "mv": (["mv"], torch.mv, [X32, W], True),
    "conv2d": (["conv2d"], F.conv2d, [((1, 2, 5, 5), BF), ((3, 2, 3, 3), F32)], False),
    "layer_norm": (["layer_norm"], lambda x, w, b: F.layer_norm(x, (8,), w, b), [X, W, W], True),
    "native_layer_norm": (["native_layer_norm"], lambda x, w, b: LN(x, weight=w, bias=b), [X, W, W], True),
    "rms_norm": (["rms_norm"], lambda x, w: F.rms_norm(x, (8,), w), [X, W], True),
    "group_norm": (["group_norm"], lambda x: F.group_norm(x, 2), [((2, 4, 3), BF)], True),
    "sum": (["sum"], torch.sum, [X], True),
    "sum.dim_IntList": (["sum.dim_IntList"], lambda x: x.sum(-1, keepdim=True), [X], True),
    "sum, int64: not cast": ([], torch.sum, [((4, 8), I64)], False),
    "prod.dim_int": (["prod.dim_int"], lambda x: x.prod(0), [X], True),
    "cumsum": (["cumsum"], lambda x: x.cumsum(1), [X], True),
    "softmax.int": (["softmax.int"], lambda x: torch.softmax(x, -1), [X], True),
    "softmax.int, dtype set": ([], lambda x: torch.softmax(x, -1, dtype=BF), [X32], False),
    "log_softmax.int": (["log_softmax.int"], lambda x: F.log_softmax(x, -1), [X], True),
    "linalg_vector_norm": (["linalg_vector_norm"], torch.linalg.vector_norm, [X], True),
    "norm.Scalar": (["norm.Scalar"], NORM.Scalar, [X], True),
    "norm.ScalarOpt_dim": (["norm.ScalarOpt_dim"], lambda x: NORM.ScalarOpt_dim(x, 2, [1]), [X], True),
    "exp": (["exp"], torch.exp, [X], True),
    "exp, float64: not cast": ([], torch.exp, [((4, 8), torch.float64)], False),
    "log": (["log"], torch.log, [X], True),
    "reciprocal": (["reciprocal"], torch.reciprocal, [X], True),
    "rsqrt": (["rsqrt"], torch.rsqrt, [X], True),
    "pow.Tensor_Scalar": (["pow.Tensor_Scalar"], lambda x: x**2, [X], True),
    "pow.Scalar": (["pow.Scalar"], lambda x: 2**x, [X], True),
    "mse_loss": (["mse_loss"], F.mse_loss, [X, X32], False),
    "binary_cross_entropy": (["binary_cross_entropy"], F.binary_cross_entropy, [X, X], True),
    "addcmul": (["addcmul"], torch.addcmul, [X32, X, X], True),
    "addcmul, all bf16": ([], torch.addcmul, [X, X, X], False),
    "dot": (["dot"], torch.dot, [W, ((8,), BF)], True),
    "index_put": (["index_put"], lambda x, i, v: torch.index_put(x, (i,), v), [X, IDX, ROWS32], True),
    "scatter_add": (["scatter_add"], lambda x, i, v: x.scatter_add(0, i, v), [X32, IDX2, ROWS], True),
    "cat": (["cat"], lambda a, b: torch.cat([a, b]), [X, ROWS32], True),
    "stack": (["stack"], lambda a, b: torch.stack([a, b]), [X, X32], True),
    "silu: in no list": ([], F.silu, [X], False),
}  # fmt: skip


def _dispatched(sample: str, device: str, autocast) -> list[tuple] | str:
    """The ops a sample dispatches on fake tensors on `device` under `autocast`, without autograd; or
    the type of the error it raises."""
    _, call, inputs, _ = SAMPLES[sample]
    seen = _Dispatched()
    with FakeTensorMode(), torch.no_grad():
        args = [torch.zeros(shape, dtype=dtype, device=device) for shape, dtype in inputs]
        try:
            with autocast, seen:
                call(*args)
        except RuntimeError as err:
            return type(err).__name__
    return seen.ops


@needs_oracle
@pytest.mark.filterwarnings("ignore:Mismatch dtype between input and weight")  # CPU's rms_norm, bf16 x fp32
@pytest.mark.parametrize("sample", list(SAMPLES))
def test_each_op_casts_as_cuda_autocast_does(sample, cuda_autocast):
    """Op by op: on CPU under CUDA's rules, the ops dispatched below autocast (the casts included) and
    their dtypes are those of CUDA autocast forced on over fake CUDA tensors; CPU autocast's own
    lists give others where the sample says so."""
    installed = autocast_rules.cast_ops("AutocastCUDA") | autocast_rules.cast_ops("AutocastCPU")
    if not set(SAMPLES[sample][0]) <= installed:
        pytest.skip(f"torch {torch.__version__} autocasts none of {SAMPLES[sample][0]}")
    cuda = _dispatched(sample, "cuda", torch.autocast("cuda", BF, cache_enabled=False))
    with autocast_rules.cuda_rules():
        emulated = _dispatched(sample, "cpu", torch.autocast("cpu", BF, cache_enabled=False))
    cpu = _dispatched(sample, "cpu", torch.autocast("cpu", BF, cache_enabled=False))
    assert emulated == cuda
    assert (cpu != cuda) == SAMPLES[sample][3], (cpu, cuda)


# Peaks already traced in this module, by (workload, N, spec): a trace that one test makes for its ops
# and another for its peak runs once (the profiler records ops; it holds no tensor of the trace's).
_PEAKS: dict[tuple[str, int, TraceSpec], float] = {}


def _peak(name: str, n: int, spec: TraceSpec) -> float:
    """`trace.trace_peak` of the workload at N=n, one rank, traced once per module."""
    if (name, n, spec) not in _PEAKS:
        workload, shape_cfg = _workload(name)
        shape = resolve_shape(shape_cfg, n_tokens=n)
        _PEAKS[name, n, spec] = trace.trace_peak(workload, ONE_RANK, shape, spec, 0)
    return _PEAKS[name, n, spec]


@functools.cache
def _model_ops(name: str, train: bool) -> set[str]:
    """The aten ops a bf16 trace of the workload calls (names without overloads), at any depth."""
    workload, shape_cfg = _workload(name)
    shape, spec = resolve_shape(shape_cfg, n_tokens=32), TraceSpec(train, BF)
    with torch.autograd.profiler.profile() as prof:  # records every op the dispatcher is called with
        _PEAKS[name, 32, spec] = trace.trace_peak(workload, ONE_RANK, shape, spec, 0)
    names = {e.name() for e in prof.kineto_results.events()}
    return {name.removeprefix("aten::") for name in names if name.startswith("aten::")}


def _workload(name: str):
    register()
    with initialize_config_module("cpbench.configs", version_base=None):
        cfg = compose("config", [f"workload={name}"])
    return instantiate(cfg.workload), cfg.shape


@pytest.mark.parametrize("name", ["fold_small", "pairformer_small"])
def test_every_op_the_models_autocast_is_checked_op_by_op(name):
    """Each op with an autocast kernel (CUDA's or CPU's) that the model's bf16 trace calls, in either
    workflow, has a sample above: the op-by-op check covers what the models run."""
    called = _model_ops(name, False) | _model_ops(name, True)
    listed = {
        op.partition(".")[0] for op in {*autocast_rules.CUDA_POLICY, *autocast_rules.cast_ops("AutocastCPU")}
    }
    sampled = {op.partition(".")[0] for ops, *_ in SAMPLES.values() for op in ops}
    assert called & listed, "the profiler saw no autocast op"
    assert called & listed <= sampled, sorted(called & listed - sampled)


def test_the_rules_hold_only_inside_the_context_and_autograd_runs_under_them():
    x = torch.randn(4, 8, requires_grad=True)
    w = torch.randn(8, 8, requires_grad=True)

    def step() -> tuple[torch.dtype, torch.dtype]:
        with torch.autocast("cpu", BF, cache_enabled=False):
            y = F.layer_norm(F.linear(x, w), (8,))
            return y.dtype, y.sum().dtype

    assert step() == (BF, BF)  # CPU's lists
    with autocast_rules.cuda_rules(), autocast_rules.cuda_rules():  # nested: one set of kernels
        with torch.autocast("cpu", BF, cache_enabled=False):
            y = F.layer_norm(F.linear(x, w), (8,))
            loss = y.sum()
        assert (y.dtype, loss.dtype) == (F32, F32)
        loss.backward()  # the backward of the casts autocast recorded
        assert x.grad.dtype == F32 and w.grad.dtype == F32
    assert step() == (BF, BF)
    with pytest.raises(ZeroDivisionError), autocast_rules.cuda_rules():
        raise ZeroDivisionError
    assert step() == (BF, BF)  # gone after an error too
    with autocast_rules.rules_for("cpu"):
        assert step() == (BF, BF)
    with autocast_rules.rules_for("cuda"):
        assert step() == (F32, F32)


class _CudaBindings(TorchFunctionMode):
    """The Python bindings that look the CUDA device up before they dispatch, which fail on a
    CPU-only build, run as the aten ops they dispatch to: `Tensor.to` a CUDA device (`_to_copy`),
    `contiguous` (`clone`), basic indexing (a view, `as_strided`) and tensor indexing (`index`,
    `index_put_`). Any other index raises."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        x = args[0] if args else None
        on_cuda = isinstance(x, torch.Tensor) and x.device.type == "cuda"
        if func is torch.Tensor.to:
            device, dtype, _, _ = torch._C._nn._parse_to(*args[1:], **kwargs)
            if device is not None and device.type == "cuda" and x.device.type != "cuda":
                return torch.ops.aten._to_copy.default(x, dtype=dtype or x.dtype, device=CUDA)
        elif func is torch.Tensor.contiguous and on_cuda and not kwargs and len(args) == 1:
            return (
                x
                if x.is_contiguous()
                else torch.ops.aten.clone.default(x, memory_format=torch.contiguous_format)
            )
        elif func is torch.Tensor.__getitem__ and on_cuda:
            return (
                _view(x, args[1]) if _basic(args[1]) else torch.ops.aten.index.Tensor(x, _indices(x, args[1]))
            )
        elif func is torch.Tensor.__setitem__ and on_cuda:
            value = args[2]
            if _basic(args[1]):
                view = _view(x, args[1])
                if isinstance(value, torch.Tensor):
                    torch.ops.aten.copy_.default(view, value)
                else:
                    torch.ops.aten.fill_.Scalar(view, value)
            else:
                if not isinstance(value, torch.Tensor):
                    value = torch.ops.aten.scalar_tensor.default(value, dtype=x.dtype, device=CUDA)
                torch.ops.aten.index_put_.default(x, _indices(x, args[1]), value)
            return None
        return func(*args, **kwargs)


def _basic(index) -> bool:
    items = index if isinstance(index, tuple) else (index,)
    return all(i is None or i is Ellipsis or isinstance(i, (int, slice)) for i in items)


def _view(x: torch.Tensor, index) -> torch.Tensor:
    """x[index] for a basic index: the view's geometry read off a meta tensor of x's, taken of x."""
    span = x.storage_offset() + sum((n - 1) * s for n, s in zip(x.shape, x.stride(), strict=True)) + 1
    meta = torch.empty(span, dtype=x.dtype, device="meta").as_strided(x.shape, x.stride(), x.storage_offset())
    v = meta[index]
    return torch.ops.aten.as_strided.default(x, v.shape, v.stride(), v.storage_offset())


def _indices(x: torch.Tensor, index) -> list[torch.Tensor | None]:
    """A tensor index as aten's: tensors and whole-dimension slices (Ellipsis spelled out) only."""
    items = list(index) if isinstance(index, tuple) else [index]
    if Ellipsis in items:
        at = items.index(Ellipsis)
        items[at : at + 1] = [slice(None)] * (x.dim() - len(items) + 1)
    if not all(isinstance(i, torch.Tensor) or i == slice(None) for i in items):
        raise NotImplementedError(f"index {index!r}")
    return [i if isinstance(i, torch.Tensor) else None for i in items]


def _fake_cuda_peak(workload, shape) -> int:
    """The inference trace of `trace._trace` (the same form, weights, tracker, chunks, collectives)
    on fake CUDA tensors under CUDA autocast itself, without autograd."""
    form = trace.TracedForm.of(workload, ONE_RANK, TraceSpec(False, BF))
    with trace.fake_rank(ONE_RANK, 0, BF, 0) as ctx:
        seed_all(0)
        model = form.workload.build_model(ctx)
        fake = FakeTensorMode(allow_non_fake_inputs=True)
        named = {**dict(model.named_parameters()), **dict(model.named_buffers())}
        with fake, torch.no_grad():
            weights = {k: torch.ops.aten._to_copy.default(fake.from_tensor(t.detach()), device=CUDA)
                       for k, t in named.items()}  # fmt: skip
        tracker = trace.LiveBytes(form.cut_bytes)
        tracker.hold(weights.values())
        with (
            _reparametrize_module(model, weights, tie_weights=True),
            fake,
            SkipCollectives(),
            tracker,
            chunking.peak_only(),
            torch.no_grad(),
            _CudaBindings(),
        ):
            seed_all(0)
            batch = form.workload.build_batch(shape, replace(ctx, device=CUDA))
            out = form.workload.run_step(model, batch, False)
            assert out.device.type == "cuda"
        return tracker.peak


def test_a_bf16_trace_for_a_gpu_run_holds_the_float32_transients_cuda_autocast_makes(cuda_autocast):
    """fold_small at N=32, bf16 inference, one rank: traced for an NCCL run (CUDA's lists) it peaks
    higher than for a gloo run (CPU's), and to the byte where CUDA autocast itself peaks on fake CUDA
    tensors. In float32 (no autocast) the two targets trace alike."""
    workload, shape_cfg = _workload("fold_small")
    shape = resolve_shape(shape_cfg, n_tokens=32)
    gpu = _peak("fold_small", 32, TraceSpec(False, BF, backend="nccl"))  # also the op test's inference trace
    cpu = _peak("fold_small", 32, TraceSpec(False, BF, backend="gloo"))
    if ORACLE_RUNS:
        assert gpu == _fake_cuda_peak(workload, shape)
    assert gpu > cpu, (gpu, cpu)
    specs = (TraceSpec(False, F32, backend="nccl"), TraceSpec(False, F32, backend="gloo"))
    fp32 = [trace.trace_peak(workload, ONE_RANK, shape, spec, 0) for spec in specs]
    assert fp32[0] == fp32[1]


def test_training_is_traced_under_cuda_rules_with_its_backward():
    """What the oracle cannot run (autograd on fake CUDA tensors aborts): fold_small's bf16 training
    step traced for a GPU run peaks higher than for a CPU run (CUDA's float32 ops' results, and what
    their backward keeps, are float32 where CPU's lists leave them bf16)."""
    gpu = _peak("fold_small", 32, TraceSpec(True, BF, backend="nccl"))  # also the op test's training trace
    cpu = _peak("fold_small", 32, TraceSpec(True, BF, backend="gloo"))
    assert gpu > cpu, (gpu, cpu)
