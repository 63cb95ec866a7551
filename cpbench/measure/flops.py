"""Model FLOPs of one step, counted by `torch.utils.flop_counter.FlopCounterMode` on fake tensors:
shapes flow through every op, no data is computed, and the timed steps never run under the counter.

A model FLOP is what the counter's registry counts: matrix products (mm, addmm, bmm, baddbmm, the
einsums and linears that lower to them), convolutions and fused attention, through aten, forward and
(in training) backward. Elementwise ops, reductions, softmax and the optimizer count nothing. An op
outside aten (a custom kernel) cannot be seen into: it counts nothing and is named in `uncounted`.
A forward recomputed in the backward (activation checkpointing: a forward op run with grad enabled
inside an autograd node) is counted apart: model FLOPs leave it out, hardware FLOPs (HFU) keep it.

Each rank counts its own share: a DTensor op is left to DTensor, whose local ops are then counted at
the local shapes, and DTensor's own shape propagation (the op run again at the global shape) is kept
out; counted at the global shape, every rank would count the whole model.
Collectives are skipped: the `c10d` ops return a completed work at once (the functional collectives
have fake kernels of their own), so a rank's count needs no peer and moves no byte.

The same pass files each aten op's runs and work (FLOPs, or the bytes it reads and writes) and each
collective's bytes by the ranks it spans, under the phase and CP op label running: the tally the
time model prices (measure/tally.py, cpbench/steptime/).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import torch
import torch.distributed as dist
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from torch.utils._pytree import tree_leaves
from torch.utils.flop_counter import FlopCounterMode, flop_registry

from cpbench.core import RankContext, Shape
from cpbench.core.phases import innermost, timing
from cpbench.distributed.comm import LEDGER
from cpbench.distributed.dtensor import is_dtensor_type
from cpbench.measure.point import PointResult
from cpbench.measure.tally import REST, StepTally, Tally, add_into
from cpbench.runtime.compile_cache import import_dynamo
from cpbench.runtime.seed import seed_all
from cpbench.runtime.startup import loaded
from cpbench.torch_compat import SkipCollectives
from cpbench.workloads.base import Contract, Workload, traits

# Operator namespaces whose ops compute nothing a FLOP counter should see, or are counted through.
_SEEN_THROUGH = frozenset({"aten", "prims", "prim", "c10d", "_c10d_functional", "profiler", "higher_order"})


# Ops that return a tensor over their input's storage without a view's schema: no bytes move.
_ZERO_COPY = frozenset({"_unsafe_view", "_reshape_alias", "lift_fresh"})


def _bytes(t: torch.Tensor) -> int:
    """What an op reads or writes of a tensor: its elements, at most its storage (a broadcast
    input, expanded to the output's shape, is read once)."""
    return min(t.numel() * t.element_size(), t.untyped_storage().nbytes())


def op_work(func: Any, args: tuple, kwargs: dict, out: Any) -> tuple[str, int, int] | None:
    """An aten op's work as the time model prices it: (its name, FLOPs, bytes), FLOPs for an op with
    a FLOP formula (its bytes 0), else the bytes it reads and writes, none for a view, a zero-copy
    op or an allocation (each run still costs its dispatch); None outside aten. The same on fake
    tensors (the count) and real ones (cpbench/steptime/op_timer.py, which times each op)."""
    packet = func.overloadpacket
    if packet in flop_registry:
        return str(packet), int(flop_registry[packet](*args, **kwargs, out_val=out)), 0
    if func.namespace != "aten":
        return None
    if func.is_view or packet.__name__ in _ZERO_COPY or packet.__name__.startswith(("empty", "new_empty")):
        return str(packet), 0, 0
    leaves = (*tree_leaves((args, kwargs)), *tree_leaves(out))
    return str(packet), 0, sum(_bytes(t) for t in leaves if isinstance(t, torch.Tensor))


class _LocalShares(TorchDispatchMode):
    """Defers a DTensor op to DTensor, so that the counter sees the local ops it runs; names the ops
    from outside aten that the counter cannot count; adds up the FLOPs of recomputed forward ops;
    with `tallying`, tallies the step's work for the time model (measure/tally.py), by phase and op
    label (off in a run's counts: it costs a point's count about a tenth more)."""

    def __init__(self, tallying: bool) -> None:
        super().__init__()
        self.uncounted: Counter[str] = Counter()
        self.recomputed = 0
        self.tallying = tallying
        self.tally: StepTally = {}

    def here(self) -> Tally:
        """The tally of the phase and the CP op label running now."""
        return self.tally.setdefault((innermost() or REST, LEDGER.label), Tally())

    def sent(self, nbytes: int, span: tuple[int, ...]) -> None:
        tally = self.here()
        tally.calls[span] += 1
        tally.sent[span] += nbytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        if any(is_dtensor_type(t) for t in types):
            return NotImplemented
        if func.namespace not in _SEEN_THROUGH:
            self.uncounted[str(func.overloadpacket)] += 1
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if self.tallying and (work := op_work(func, args, kwargs, out)) is not None:
            op, flops, nbytes = work
            tally = self.here()
            tally.runs[op] += 1
            if flops:
                tally.flops[op] += flops
            else:
                tally.bytes[op] += nbytes
        # The backward runs its own ops with grad disabled; a checkpoint recomputes with it enabled.
        recomputing = torch.is_grad_enabled() and torch._C._current_autograd_node() is not None
        if recomputing and func.overloadpacket in flop_registry:
            self.recomputed += int(flop_registry[func.overloadpacket](*args, **kwargs, out_val=out))
        return out


@dataclass(frozen=True)
class StepFlops:
    """One rank's counted FLOPs of one step, by aten op, and the ops it could not count; with the
    step's work as the time model prices it (`tally`)."""

    flops: int
    by_op: dict[str, int] = field(default_factory=dict)
    uncounted: tuple[str, ...] = ()
    recomputed: int = 0  # of `flops`, those of forward ops recomputed in the backward (checkpointing)
    tally: StepTally = field(default_factory=dict)


@contextmanager
def _dtensor_metadata_uncounted() -> Iterator[None]:
    """Before it runs an op's local ops, DTensor decides the op's placements and derives its output
    shape by running the op on fake tensors of the global shape. That is bookkeeping, not the model's
    work: DTensor does it as outside a trace, with no mode of ours active (it makes a fake mode of its
    own) and on real index tensors (its strided shards' offsets). Under our fake mode the placement
    decision alone cost a DTensor model about a second per count. Imported on the first count, so that
    a process that never counts (the launching one) never loads DTensor's module."""
    from torch.distributed.tensor._sharding_prop import ShardingPropagator

    # The decision, and the shape it derives (also reached on its own).
    bookkeeping = ("propagate_op_sharding_non_cached", "_propagate_tensor_meta_non_cached")
    originals = {name: getattr(ShardingPropagator, name) for name in bookkeeping}

    def outside_the_count(method: Callable[..., Any]) -> Callable[..., Any]:
        def run(self: ShardingPropagator, *args: Any, **kwargs: Any) -> Any:
            with _disable_current_modes():
                return method(self, *args, **kwargs)

        return run

    for name, method in originals.items():
        setattr(ShardingPropagator, name, outside_the_count(method))
    try:
        yield
    finally:
        for name, method in originals.items():
            setattr(ShardingPropagator, name, method)


class FlopCount:
    """Counts what runs inside it on fake tensors; `result()` once it has closed. `tally`: the
    step's work for the time model too (`StepFlops.tally`)."""

    def __init__(self, tally: bool = False) -> None:
        self._counter, self._local = FlopCounterMode(display=False), _LocalShares(tally)
        self._modes = ExitStack()

    def __enter__(self) -> FlopCount:
        # Imported on first use: with sympy it costs a launching process that never counts half a second.
        from torch.fx.experimental.symbolic_shapes import ShapeEnv

        fake = FakeTensorMode(allow_non_fake_inputs=True, shape_env=ShapeEnv())  # symbolic .tolist()
        self._modes.enter_context(_dtensor_metadata_uncounted())
        # The last sees an op first: a DTensor op goes to DTensor before another mode of ours sees it.
        for mode in (fake, self._counter, SkipCollectives(), self._local):
            self._modes.enter_context(mode)
        if self._local.tallying:
            self._modes.enter_context(timing(torch.device("cpu")))  # the phases open, for the tally
            self._modes.enter_context(_observed(self._local.sent))
        return self

    def __exit__(self, *exc: object) -> None:
        self._modes.close()

    def result(self) -> StepFlops:
        by_op: Counter[str] = Counter()
        for op, flops in self._counter.get_flop_counts().get("Global", {}).items():
            by_op[str(op)] += int(flops)
        uncounted = tuple(sorted(self._local.uncounted))
        return StepFlops(
            sum(by_op.values()), dict(by_op), uncounted, self._local.recomputed, self._local.tally
        )


@contextmanager
def _observed(observer: Callable[[int, tuple[int, ...]], None]) -> Iterator[None]:
    """The ledger tells `observer` of each collective while the count runs."""
    outer, LEDGER.observer = LEDGER.observer, observer
    try:
        yield
    finally:
        LEDGER.observer = outer


_loaded = False


def load_counter() -> None:
    """Count one small forward, for what the counter imports and caches on its first use (tens of
    MiB on CPU and about 2 s): loaded before the memory cap is set, it is part of the rank's
    baseline, not of the cap. Once per process; a rank forked from a process that loaded it has it.
    No backward: the rank server loads this before it forks the ranks, and autograd's first backward
    would initialise CUDA there (cpbench/runtime/fresh_process.py); a rank's first counted backward
    then costs about 0.06 s and 3 MiB more here. What it loads lives as long as the process and is
    frozen out of the garbage collector, as a process's imports are (`runtime.startup.loaded`): left
    in, torch._dynamo's objects were walked by every collection after it, 0.05 s each here, and a
    rank collects before every point."""
    global _loaded
    if _loaded:
        return
    _loaded = True
    with loaded():
        import_dynamo()
        with FlopCount():
            weight = torch.ones(8, 8)
            mixed = torch.nn.functional.linear(weight, weight).softmax(-1)
            torch.einsum("ij,jk->ik", mixed, weight).sum()


def corners(groups: tuple[dict[str, int], ...]) -> list[tuple[dict[str, int], int]]:
    """The pass counts to count a step at, each with its weight, so that the weighted sum of the
    counts is the count at the loops' own counts. `groups`: loops by name and passes, in groups whose
    passes cost the same whatever another group's count (one after another, as a trunk and a
    sampler run), loops within a group nested or not. Every loop of more than 2 passes is counted at
    1 and 2 (the others as they are): within a group each corner of those, weighted as linear
    interpolation in each loop; the groups' gains over the all-1 count add. Exact for a count that
    is a sum over the groups of one affine in each of its loops, as it is when every pass of a loop
    costs the same: 1 + sum of (2^k - 1) counts for groups of k loops, each of at most 2 passes."""
    base: dict[str, int] = {name: 1 for group in groups for name, n in group.items() if n > 2}
    weights: dict[tuple[tuple[str, int], ...], int] = {tuple(sorted(base.items())): 1}
    for group in groups:
        points: list[tuple[dict[str, int], int]] = [(base, 1)]
        for name, n in group.items():
            if n > 2:
                points = [
                    ({**p, name: x}, w * (2 - n if x == 1 else n - 1)) for p, w in points for x in (1, 2)
                ]
        for passes, weight in points:
            key = tuple(sorted(passes.items()))
            weights[key] = weights.get(key, 0) + weight - (passes == base)
    return [(dict(key), w) for key, w in weights.items() if w]


def _passes(groups: tuple[dict[str, int], ...], at: dict[str, int]) -> int:
    """A walk's length in loop passes: each group's nested passes, at the counts `at` gives (else its own)."""
    return sum(math.prod(at.get(name, n) for name, n in group.items()) for group in groups)


def forms_to_count(groups: tuple[dict[str, int], ...]) -> list[tuple[dict[str, int], int]]:
    """The corners, where their walks are shorter than the step's own; else the step's own form, once
    (its chunk loops still one chunk). fold_small's loops (4 sampling steps, the rest at 1 or 2): its
    two corners walk 16 loop passes, its step 13; counted once, a point's count takes about a third
    less time."""
    points = corners(groups)
    return points if sum(_passes(groups, passes) for passes, _ in points) < _passes(groups, {}) else [({}, 1)]


def counted_forms(workload: Workload, forms: list[tuple[dict[str, int], int]], shape: Shape, ctx: RankContext,
                  train: bool, seed: int, tally: bool = False) -> StepFlops:  # fmt: skip
    """The weighted sum of the counts of the step's cut forms (`flop_form`), each with a model of its own."""
    by_op: Counter[str] = Counter()
    uncounted: set[str] = set()
    recomputed = 0
    work: StepTally = {}
    for passes, weight in forms:
        form = workload.flop_form(passes)
        counted = _count(form, form.build_model(ctx), shape, ctx, train, seed, tally)
        by_op.update({op: weight * flops for op, flops in counted.by_op.items()})
        uncounted |= set(counted.uncounted)
        recomputed += weight * counted.recomputed
        add_into(work, counted.tally, weight)
    by_op = Counter({op: f for op, f in by_op.items() if f})
    return StepFlops(sum(by_op.values()), dict(by_op), tuple(sorted(uncounted)), recomputed, work)


def count_step(workload: Workload, model: torch.nn.Module, shape: Shape, ctx: RankContext, train: bool,
               seed: int, tally: bool = False) -> StepFlops:  # fmt: skip
    """This rank's FLOPs of one step at `shape`: build_batch and run_step (and in native training the
    backward the driver runs) with the run's model. Every loop of the step runs whole (recycling,
    sampling steps, chunks), so each counts in proportion to its passes with nothing multiplied. A
    workload that declares which loops repeat identical passes (`flop_loops`, `flop_form`: a
    Pairformer's blocks, a fold model's trunk passes and sampling steps) is counted at 1 and 2
    passes of each, with every chunk loop one chunk, and extrapolated (`corners`): a fold step of 200
    sampling steps at N=2048 walks thousands of passes otherwise (docs/measurement.md). A training
    trace leaves fake gradients (and, under foldcp, optimizer state) behind: the caller builds the
    model again before a real step. Where the corners walk more loop passes than the step itself,
    the step is counted once in its own form, its chunk loops one chunk (`forms_to_count`). `tally`:
    with the step's work for the time model (`StepFlops.tally`)."""
    if traits(workload).flop_form is not None:
        forms = forms_to_count(workload.flop_loops(train))
        return counted_forms(workload, forms, shape, ctx, train, seed, tally)
    return _count(workload, model, shape, ctx, train, seed, tally)


def _count(workload: Workload, model: torch.nn.Module, shape: Shape, ctx: RankContext, train: bool,
           seed: int, tally: bool = False) -> StepFlops:  # fmt: skip
    contract = traits(workload).contract
    with FlopCount(tally) as count:
        seed_all(seed)
        batch = workload.build_batch(shape, ctx)
        with torch.set_grad_enabled(train):
            out = workload.run_step(model, batch, train)
        if train and contract is Contract.native and isinstance(out, torch.Tensor) and out.requires_grad:
            out.backward()
    return count.result()


@dataclass(frozen=True)
class Counted:
    """The step's FLOPs over all ranks (None when some rank could not trace it: `error` says why)."""

    flops: int | None
    uncounted: tuple[str, ...] = ()
    error: str = ""
    recomputed: int = 0  # of `flops`, a checkpointed forward's recomputation


def count_over_ranks(workload: Workload, model: torch.nn.Module, shape: Shape, ctx: RankContext,
                     train: bool, seed: int, group: dist.ProcessGroup) -> Counted:  # fmt: skip
    """Every rank counts its share and the shares are summed; an op fake tensors cannot run on any
    rank leaves the count blank on all of them, with the first rank's reason."""
    try:
        mine, error = count_step(workload, model, shape, ctx, train, seed), ""
    except Exception as err:  # an op with no fake kernel, a value read in Python: no count, said why
        mine, error = StepFlops(0), f"{type(err).__name__}: {(str(err).strip() or '?').splitlines()[0]}"
    total = torch.tensor([mine.flops, 1 if error else 0, mine.recomputed], dtype=torch.int64)
    dist.all_reduce(total, group=group)
    reports: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(reports, (mine.uncounted, error), group=group)
    uncounted = tuple(sorted({op for ops, _ in reports for op in ops}))
    if total[1].item():
        return Counted(None, uncounted, next(e for _, e in reports if e))
    return Counted(int(total[0].item()), uncounted, recomputed=int(total[2].item()))


@dataclass(frozen=True)
class Efficiency:
    """A point's hardware figures: `model_tflop` the whole step over all ranks, `tflops_per_rank` the
    achieved rate of one rank (its share over the step's median walltime), `mfu` that rate over the
    device's dense peak (None when the peak is unknown); `hardware_tflop` and `hfu` the same with a
    checkpointed forward's recomputation counted (equal to the model's figures without one)."""

    model_tflop: float
    tflops_per_rank: float | None
    mfu: float | None
    hardware_tflop: float | None = None
    hfu: float | None = None


def efficiency(flops: int, ranks: int, walltime_ms: float | None, peak_tflops: float | None,
               recomputed: int = 0) -> Efficiency:  # fmt: skip
    """Achieved TFLOP/s per rank, MFU and HFU from the counted FLOPs of a step (`recomputed` of them
    a checkpointed forward's recomputation) and its median walltime."""
    model, hardware = (flops - recomputed) / 1e12, flops / 1e12
    if not walltime_ms:
        return Efficiency(model, None, None, hardware)
    per_rank = model / ranks / (walltime_ms / 1e3)
    hfu = hardware / ranks / (walltime_ms / 1e3) / peak_tflops if peak_tflops else None
    return Efficiency(model, per_rank, per_rank / peak_tflops if peak_tflops else None, hardware, hfu)


def with_efficiency(result: PointResult, counted: Counted | None, ranks: int,
                    peak_tflops: float | None) -> PointResult:  # fmt: skip
    """A measured point with its model FLOPs, achieved TFLOP/s per rank and MFU, where counted."""
    if counted is None or counted.flops is None or result.status != "ok":
        return result
    figures = efficiency(counted.flops, ranks, result.walltime_ms, peak_tflops, counted.recomputed)
    return replace(result, **asdict(figures), flops_uncounted=" ".join(counted.uncounted))
