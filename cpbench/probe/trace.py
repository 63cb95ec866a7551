"""The one fake-tensor trace engine: a rank's build_batch + run_step (and backward in training) run on
fake tensors (`FakeTensorMode`: shapes, no data) with its collectives on torch's fake process group,
while a dispatch mode follows the bytes of live tensor storages (torch's `MemTracker` refuses modules
called more than once per step, as the fold model's diffusion steps are). One process traces every
rank it needs in turn. The memory estimate (probe/predict.py) and the time model's count
(steptime/count.py) are its consumers: each makes a `TraceSpec` of the run's settings once and hands
it to the functions here, which size the chunks and pick the autocast rules by it.

It runs before this process joins a real process group (in the launching process, or in a rank
before its runtime starts) and destroys its fake group when done.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace

import torch
import torch.distributed as dist
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.nn.utils.stateless import _reparametrize_module
from torch.testing._internal.distributed.fake_pg import FakeStore
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.weak import WeakIdKeyDictionary

from cpbench.core import RankContext, Shape, Topology
from cpbench.distributed.comm import LEDGER, UNLABELLED
from cpbench.measure.cap import cap_gib
from cpbench.models.pairformer import chunking, kernels
from cpbench.probe.autocast_rules import rules_for
from cpbench.probe.owners import BACKWARD, OUTSIDE, WEIGHTS, ModuleStack
from cpbench.runtime.compile_cache import import_dynamo
from cpbench.runtime.rank import device_type, joined_context, pick_backend
from cpbench.runtime.seed import seed_all
from cpbench.settings.schema import BenchConfig, Workflow
from cpbench.torch_compat import SkipCollectives
from cpbench.workloads.base import Contract, Workload, traits

GIB = 2**30


@dataclass(frozen=True)
class TraceSpec:
    """What a trace takes from the run's settings, made once (`of`): the step (training or not), the
    precision and seed, the backend the ranks run over (gloo stages some collectives through buffers
    the trace counts; a rank's device decides whose autocast rules apply) and the per-rank memory cap
    its ranks' `auto` chunks are sized for. The device also picks the fused attention op a trace runs
    and counts (models/pairformer/kernels.py `for_device`); which kernels run is the workload's own
    setting (`workload.kernels`)."""

    train: bool
    dtype: torch.dtype
    seed: int = 0
    backend: str = "nccl"  # gloo or nccl (runtime/rank.py `pick_backend`)
    chunk_cap_gib: float | None = None  # the per-rank cap (measure/cap.py `cap_gib`); None: no cap

    @staticmethod
    def of(settings: BenchConfig, device_gib: float | None = None) -> TraceSpec:
        """The run's spec; `device_gib`: the memory of the device a forecast is for (its cap where
        memory.budget_gib is null: `cap_gib`)."""
        backend = pick_backend(settings.dist.backend)
        return TraceSpec(
            train=settings.workflow is Workflow.training,
            dtype=getattr(torch, settings.dtype.value),
            seed=settings.seed,
            backend=backend,
            chunk_cap_gib=cap_gib(settings.memory, device_type(backend), device_gib),
        )

    @property
    def gloo(self) -> bool:
        """Whether gloo's staging buffers count (`GLOO_STAGED`)."""
        return self.backend == "gloo"

    @property
    def autocast_device(self) -> str:
        """The device the run's ranks run on, whose autocast rules the trace applies: CUDA's for NCCL
        ranks, applied to the CPU trace (probe/autocast_rules.py)."""
        return device_type(self.backend)


class CannotTrace(RuntimeError):
    """The workload runs an op that fake tensors cannot run (no meta/fake implementation, a
    data-dependent value such as `.item()`): `op` names it."""

    def __init__(self, op: str, detail: str):
        if "_local_scalar_dense" in op:
            detail = "a tensor's value read in Python (.item(), int(t), a data-dependent branch)"
        super().__init__(op if detail in ("", op) else f"{op}: {detail}")
        self.op, self.detail = op, detail

    def __reduce__(self) -> tuple[type, tuple[str, str]]:  # raised again in the launching process
        return CannotTrace, (self.op, self.detail)


ASSUMPTIONS = (
    "live tensor bytes (on gloo, with its all_gather / reduce_scatter staging buffers) only: "
    "no allocator rounding (CPU; CUDA's caching allocator rounds blocks to 512 B), "
    "no workspace (cuBLAS, NCCL buffers), no fragmentation margin, and nothing of the process itself "
    "(interpreter, libraries: the CPU baseline); the optimizer's state is counted as AdamW's 2x the "
    "parameters, its temporaries are not; autocast casts by the op lists of the run's device (CUDA's "
    "for an NCCL run, applied to the CPU trace: probe/autocast_rules.py)"
)


def traced_ranks(topology: Topology) -> tuple[int, ...]:
    """Ranks whose shards differ in role: the first and last block (a diagonal one on a 2d grid)
    and, beside the first, an off-diagonal one. With N tiling the grid evenly the rest repeat them."""
    world = topology.cp
    return tuple(sorted({0, min(1, world - 1), world - 1}))


# gloo stages these collectives through a flat buffer as large as the argument named here (measured:
# all_gather_into_tensor of 200 MB raises the resident peak by 200 MB; all_to_all and all_reduce do not).
GLOO_STAGED = {"c10d._allgather_base_.default": 0, "c10d._reduce_scatter_base_.default": 1}


class LiveBytes(TorchDispatchMode):
    """The peak of live tensor storage bytes: each storage an op creates is counted once (views and
    in-place results share it) until it is freed; with `gloo`, plus the staging buffer of a collective
    while it runs."""

    def __init__(self, held: int = 0, gloo: bool = False, where: Callable[[], str] = lambda: OUTSIDE):
        super().__init__()
        self.gloo = gloo
        self.live = self.peak = held
        self._seen: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self.failed_op: str | None = None  # the op that could not run on fake tensors
        # Live bytes by who allocated them (`where`: the module running; owners.py), and at the peak.
        self._where = where
        self.live_by: dict[str, int] = {WEIGHTS: held} if held else {}
        self.at_peak: dict[str, int] = dict(self.live_by)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        staged = GLOO_STAGED.get(str(func)) if self.gloo else None
        if staged is not None and self.live + args[staged].nbytes > self.peak:
            self.peak = self.live + args[staged].nbytes
            self.at_peak = {**self.live_by, "(gloo staging buffer)": args[staged].nbytes}
        try:
            out = func(*args, **(kwargs or {}))
        except Exception:
            self.failed_op = self.failed_op or str(func)
            raise
        owner = None
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                storage = t.untyped_storage()
                if storage not in self._seen:
                    size = storage.nbytes()
                    owner = owner or (BACKWARD if torch._C._current_autograd_node() else self._where())
                    self._seen[storage] = weakref.ref(storage, functools.partial(self._free, size, owner))
                    self.live += size
                    self.live_by[owner] = self.live_by.get(owner, 0) + size
        self._note_peak()
        return out

    def _note_peak(self) -> None:
        if self.live > self.peak:
            self.peak, self.at_peak = self.live, dict(self.live_by)

    def hold(self, tensors: Iterable[torch.Tensor]) -> None:
        """Count these tensors' storages as live from the start, once (a view of one is no new storage)."""
        for t in tensors:
            storage = t.untyped_storage()
            if storage not in self._seen:
                self._seen[storage] = None
                self.live += storage.nbytes()
                self.live_by[WEIGHTS] = self.live_by.get(WEIGHTS, 0) + storage.nbytes()
        self._note_peak()

    def _free(self, size: int, owner: str, _ref: object) -> None:
        self.live -= size
        self.live_by[owner] -= size


@contextmanager
def fake_rank(topology: Topology, rank: int, dtype: torch.dtype, seed: int) -> Iterator[RankContext]:
    """Rank `rank` of a fake process group (collectives return at once), with the run's mesh."""
    if dist.is_initialized():
        raise RuntimeError("probe.trace: a process group is already running in this process")
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=topology.cp)
    try:
        yield joined_context(topology, torch.device("cpu"), dtype, seed)
    finally:
        dist.destroy_process_group()


def fake_ranks(topology: Topology, spec: TraceSpec) -> Iterator[tuple[int, RankContext]]:
    """Each traced rank in turn on its fake process group (`fake_rank`), with the chunks the run's
    ranks take and the fused attention op of their device."""
    with chunking.sized_for(spec.chunk_cap_gib), kernels.for_device(spec.autocast_device):
        for rank in traced_ranks(topology):
            with fake_rank(topology, rank, spec.dtype, spec.seed) as ctx:
                yield rank, ctx


def _op_of(err: Exception) -> str:
    func = getattr(err, "func", None)  # fake tensors' own exceptions name the op
    return str(func) if func is not None else type(err).__name__


@dataclass(frozen=True)
class TracedForm:
    """What a trace runs: the workload's `peak_form` (its loops cut to the passes that set the peak)
    and what the whole model holds beyond the traced one's: weight and buffer bytes, and bytes of
    trainable parameters (for AdamW's state)."""

    workload: Workload
    cut_bytes: int = 0
    cut_params: int = 0

    @staticmethod
    def of(workload: Workload, topology: Topology, spec: TraceSpec) -> TracedForm:
        cut = traits(workload).peak_form
        form = cut(spec.train) if cut is not None else workload
        if form is workload:
            return TracedForm(workload)
        # Both models on the meta device, to count them.
        with fake_rank(topology, 0, spec.dtype, spec.seed) as ctx:
            meta = replace(ctx, device=torch.device("meta"))
            (full_bytes, full_params), (form_bytes, form_params) = (_sizes(w, meta) for w in (workload, form))
        return TracedForm(form, full_bytes - form_bytes, full_params - form_params)


def _sizes(workload: Workload, ctx: RankContext) -> tuple[int, int]:
    """Bytes of a workload's model state (weights and buffers) and of its trainable parameters."""
    with torch.device(ctx.device):
        model = workload.build_model(ctx)
    state = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    return state, sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)


@dataclass(frozen=True)
class Estimate:
    n: int
    peak_gib: float  # the largest traced rank's peak of live tensors (model, batch, step)


def estimate(workload: Workload, topology: Topology, shape: Shape, spec: TraceSpec, ranks: tuple[int, ...],
             form: TracedForm | None = None) -> Estimate:  # fmt: skip
    """The largest per-rank peak over the traced ranks at one shape."""
    form = form or TracedForm.of(workload, topology, spec)
    peak = max(trace_peak(workload, topology, shape, spec, r, form) for r in ranks)
    return Estimate(shape.n_tokens, peak / GIB)


def trace_peak(workload: Workload, topology: Topology, shape: Shape, spec: TraceSpec, rank: int,
               form: TracedForm | None = None) -> float:  # fmt: skip
    """One rank's peak bytes of a probe step (the model, the batch, the step's tensors). The model is
    built for real (its weights are small beside the activations, and module moves do not take fake
    parameters); the batch and the step are traced on fake tensors, each chunk loop two chunks deep
    (`chunking.peak_only`). `form` (default: the workload's own) is what runs."""
    return sum(_trace(workload, topology, shape, spec, rank, form).values())


def peak_owners(
    workload: Workload, topology: Topology, shape: Shape, spec: TraceSpec, rank: int
) -> dict[str, int]:
    """`trace_peak`'s bytes by who holds them at the peak: the module whose forward allocated them
    (owners.py), the weights, the optimizer's state."""
    return _trace(workload, topology, shape, spec, rank, None)


def _trace(workload: Workload, topology: Topology, shape: Shape, spec: TraceSpec, rank: int,
           form: TracedForm | None) -> dict[str, int]:  # fmt: skip
    form = form or TracedForm.of(workload, topology, spec)
    cut_bytes, cut_params, workload = form.cut_bytes, form.cut_params, form.workload
    train, seed = spec.train, spec.seed
    with (
        fake_rank(topology, rank, spec.dtype, seed) as ctx,
        chunking.sized_for(spec.chunk_cap_gib),
        kernels.for_device(spec.autocast_device),
    ):
        seed_all(seed)
        model = workload.build_model(ctx)
        params = [p for p in model.parameters() if p.requires_grad]
        contract = traits(workload).contract
        # AdamW's exp_avg and exp_avg_sq, alive from the first training step on.
        optim_bytes = 2 * (sum(p.numel() * p.element_size() for p in params) + cut_params) if train else 0
        import_dynamo()  # what the fake mode imports, without the empty folder it leaves
        fake = FakeTensorMode(allow_non_fake_inputs=True)
        weights = _fake_weights(model, fake)
        stack = ModuleStack(model)
        tracker = LiveBytes(cut_bytes, spec.gloo, lambda: _holder(stack))
        tracker.hold(weights.values())
        try:
            with (
                _reparametrize_module(model, weights, tie_weights=True),
                fake,
                SkipCollectives(),
                stack.hooked(),
                tracker,
                chunking.peak_only(),
                rules_for(spec.autocast_device),  # autocast's op lists of the run's device
            ):
                seed_all(seed)
                batch = workload.build_batch(shape, ctx)
                with torch.set_grad_enabled(train):
                    out = workload.run_step(model, batch, train)
                if train and contract is Contract.native and out is not None and out.requires_grad:
                    out.backward()
        except Exception as err:  # any op fake tensors cannot run: name it
            op = tracker.failed_op or _op_of(err)
            raise CannotTrace(op, (str(err).strip() or "?").splitlines()[0]) from err
        return {**tracker.at_peak, "(optimizer state)": optim_bytes} if optim_bytes else tracker.at_peak


def _holder(stack: ModuleStack) -> str:
    """Who allocates now: the CP op's label where one is set (comm.op_label), else the module."""
    return LEDGER.label if LEDGER.label != UNLABELLED else stack.current


def _fake_weights(model: torch.nn.Module, fake: FakeTensorMode) -> dict[str, torch.Tensor]:
    """Fake copies of the model's weights and buffers, by name, to swap in for the trace: fake
    tensors' dispatch cache skips every op that reads a real tensor, and most ops read a weight."""
    named = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    return {name: fake.from_tensor(t) for name, t in named.items()}
