"""Predict the per-rank peak memory of a probe step, and the largest N within a budget, without
running a real step: each rank's build_batch + run_step (and backward in training) is traced on fake
tensors (`FakeTensorMode`: shapes, no data) with its collectives on torch's fake process group, and
a dispatch mode follows the bytes of live tensor storages (torch's `MemTracker` refuses modules called more
than once per step, as the fold model's diffusion steps are). One process traces every rank it needs in turn.

It runs before this process joins a real process group (in the launching process, or in a rank
before its runtime starts) and destroys its fake group when done.
"""

from __future__ import annotations

import functools
import math
import weakref
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace

import numpy as np
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
from cpbench.models.pairformer import chunking
from cpbench.probe.autocast_rules import rules_for
from cpbench.probe.owners import BACKWARD, OUTSIDE, WEIGHTS, ModuleStack, top_owners
from cpbench.probe.search import align_down, align_up
from cpbench.runtime.compile_cache import import_dynamo
from cpbench.runtime.rank import device_type, joined_context, pick_backend, visible_gpus
from cpbench.runtime.seed import seed_all
from cpbench.settings.schema import BenchConfig, Workflow
from cpbench.sweep import run_shape
from cpbench.torch_compat import SkipCollectives
from cpbench.workloads.base import Contract, Workload, traits

GIB = 2**30
MAX_TRACES = 12  # fake traces per prediction: the ramp, the fit's crossing and its check


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


@dataclass(frozen=True)
class Estimate:
    n: int
    peak_gib: float  # the largest traced rank's peak of live tensors (model, batch, step)


@dataclass
class Prediction:
    """Traced peaks at a few N, and the largest N predicted to fit `budget_gib` (per rank, over what a
    rank holds after start-up)."""

    estimates: list[Estimate] = field(default_factory=list)
    budget_gib: float | None = None
    proposal: int | None = None
    ranks: tuple[int, ...] = ()  # the ranks traced, one per distinct role on the grid
    # What real steps held beyond their traces (the process, workspaces: see ASSUMPTIONS), in turn:
    # N_tokens, missed_gib, proposal. The last one's miss is added to every estimate (`calibrated`).
    calibrations: tuple[dict, ...] = ()
    # Who holds the peak at the proposal (the first traced rank): (holder, bytes), largest first.
    owners: tuple[tuple[str, int], ...] = ()

    @property
    def missed_gib(self) -> float:
        return self.calibrations[-1]["missed_gib"] if self.calibrations else 0.0

    @property
    def calibrated_at(self) -> int | None:
        return self.calibrations[-1]["N_tokens"] if self.calibrations else None

    def as_json(self) -> dict:
        return {
            "budget_gib": self.budget_gib,
            "proposal": self.proposal,
            "ranks": list(self.ranks),
            "estimates": [{"N_tokens": e.n, "peak_gib": e.peak_gib} for e in self.estimates],
            "calibration": {"N_tokens": self.calibrated_at, "missed_gib": self.missed_gib},
            "calibrations": list(self.calibrations),
            "owners_at_proposal": [{"holder": name, "gib": size / GIB} for name, size in self.owners],
            "assumes": ASSUMPTIONS,
        }

    def at(self, n: int) -> float | None:
        """The predicted peak at N: the traced one, else the quadratic through the nearest three
        (plus what a real step was measured to hold beyond its trace, once calibrated)."""
        points = sorted({e.n: e.peak_gib for e in self.estimates}.items())
        if not points:
            return None
        exact = dict(points)
        if n in exact:
            return exact[n] + self.missed_gib
        near = sorted(points, key=lambda p: abs(p[0] - n))[:3]
        xs, ys = (np.array(v, dtype=float) for v in zip(*near, strict=True))
        return float(np.poly1d(np.polyfit(xs, ys, deg=len(near) - 1))(n)) + self.missed_gib

    def calibrated(self, n: int, measured_gib: float, multiple: int) -> Prediction:
        """This prediction once a real step at N measured `measured_gib` (over the start-up baseline):
        the difference, memory the trace cannot see, is added to every estimate, and the proposal
        moves to where the shifted curve crosses the budget (between the traces: no new trace)."""
        missed = measured_gib - (self.at(n) - self.missed_gib)
        proposal = self.proposal
        if self.budget_gib is not None:
            proposal = _proposal_within(self.estimates, self.budget_gib - missed, multiple)
        step = {"N_tokens": n, "missed_gib": missed, "proposal": proposal}
        return replace(self, proposal=proposal, calibrations=(*self.calibrations, step))


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
        raise RuntimeError("probe.predict: a process group is already running in this process")
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=topology.cp)
    try:
        yield joined_context(topology, torch.device("cpu"), dtype, seed)
    finally:
        dist.destroy_process_group()


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
    def of(workload: Workload, topology: Topology, train: bool, dtype: torch.dtype, seed: int) -> TracedForm:
        cut = traits(workload).peak_form
        form = cut(train) if cut is not None else workload
        if form is workload:
            return TracedForm(workload)
        with fake_rank(topology, 0, dtype, seed) as ctx:  # both models on the meta device, to count them
            meta = replace(ctx, device=torch.device("meta"))
            (full_bytes, full_params), (form_bytes, form_params) = (_sizes(w, meta) for w in (workload, form))
        return TracedForm(form, full_bytes - form_bytes, full_params - form_params)


def _sizes(workload: Workload, ctx: RankContext) -> tuple[int, int]:
    """Bytes of a workload's model state (weights and buffers) and of its trainable parameters."""
    with torch.device(ctx.device):
        model = workload.build_model(ctx)
    state = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    return state, sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)


def trace_peak(workload: Workload, topology: Topology, shape: Shape, train: bool, dtype: torch.dtype,
               seed: int, rank: int, gloo: bool = False,
               form: TracedForm | None = None) -> float:  # fmt: skip
    """One rank's peak bytes of a probe step (the model, the batch, the step's tensors). The model is
    built for real (its weights are small beside the activations, and module moves do not take fake
    parameters); the batch and the step are traced on fake tensors, each chunk loop two chunks deep
    (`chunking.peak_only`). `form` (default: the workload's own) is what runs."""
    return sum(_trace(workload, topology, shape, train, dtype, seed, rank, gloo, form).values())


def peak_owners(workload: Workload, topology: Topology, shape: Shape, train: bool, dtype: torch.dtype,
                seed: int, rank: int, gloo: bool = False) -> dict[str, int]:  # fmt: skip
    """`trace_peak`'s bytes by who holds them at the peak: the module whose forward allocated them
    (owners.py), the weights, the optimizer's state."""
    return _trace(workload, topology, shape, train, dtype, seed, rank, gloo, None)


def _trace(workload: Workload, topology: Topology, shape: Shape, train: bool, dtype: torch.dtype,
           seed: int, rank: int, gloo: bool, form: TracedForm | None) -> dict[str, int]:  # fmt: skip
    form = form or TracedForm.of(workload, topology, train, dtype, seed)
    cut_bytes, cut_params, workload = form.cut_bytes, form.cut_params, form.workload
    with fake_rank(topology, rank, dtype, seed) as ctx:
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
        tracker = LiveBytes(cut_bytes, gloo, lambda: _holder(stack))
        tracker.hold(weights.values())
        try:
            with (
                _reparametrize_module(model, weights, tie_weights=True),
                fake,
                SkipCollectives(),
                stack.hooked(),
                tracker,
                chunking.peak_only(),
                # autocast's op lists of the run's device: CUDA's for NCCL ranks (dist.backend: gloo or nccl)
                rules_for(device_type("gloo" if gloo else "nccl")),
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


def estimate(workload: Workload, topology: Topology, shape: Shape, train: bool, dtype: torch.dtype,
             seed: int, ranks: tuple[int, ...], gloo: bool = False,
             form: TracedForm | None = None) -> Estimate:  # fmt: skip
    """The largest per-rank peak over the traced ranks at one shape."""
    form = form or TracedForm.of(workload, topology, train, dtype, seed)
    peak = max(trace_peak(workload, topology, shape, train, dtype, seed, r, gloo, form) for r in ranks)
    return Estimate(shape.n_tokens, peak / GIB)


def predict(
    workload: Workload,
    topology: Topology,
    shape_at: Callable[[int], Shape],
    train: bool,
    dtype: torch.dtype,
    seed: int,
    budget_gib: float | None,
    start: int,
    factor: float,
    max_tokens: int | None,
    points: list[int] | None = None,
    gloo: bool = False,
) -> Prediction:
    """Trace at `points` when given; otherwise ramp N from `start` by `factor` until the predicted
    peak passes the budget, fit a quadratic of peak in N through the last three traces, and trace at
    its crossing of the budget (rounded down to the grid), stepping down until the trace fits."""
    m = topology.tiling.multiple
    prediction = Prediction(budget_gib=budget_gib, ranks=traced_ranks(topology))
    form = TracedForm.of(workload, topology, train, dtype, seed)

    def trace(n: int) -> Estimate:
        e = estimate(workload, topology, shape_at(n), train, dtype, seed, prediction.ranks, gloo, form)
        prediction.estimates.append(e)
        return e

    if points is not None:
        for n in points:
            trace(n)
        return prediction
    if budget_gib is None:
        raise ValueError("probe.predict needs a budget: memory.budget_gib (or on CPU memory.cpu_budget_gib)")
    n = max(m, align_down(start, m))
    cap = align_down(max_tokens, m) if max_tokens else None
    while len(prediction.estimates) < MAX_TRACES:
        e = trace(n)
        if e.peak_gib > budget_gib:
            break
        nxt = max(align_up(n * factor, m), n + m)
        if cap is not None and n >= cap:
            prediction.proposal = n  # everything up to the cap fits
            return prediction
        n = min(nxt, cap) if cap is not None else nxt
    fits = [e for e in prediction.estimates if e.peak_gib <= budget_gib]
    if not fits:  # the start is over budget: halve until a trace fits
        while n > m and len(prediction.estimates) < MAX_TRACES:
            n = max(m, align_down(n / factor, m))
            if trace(n).peak_gib <= budget_gib:
                break
        fits = [e for e in prediction.estimates if e.peak_gib <= budget_gib]
        if not fits:
            return prediction
    lo = max(e.n for e in fits)
    guess = _proposal_within(prediction.estimates, budget_gib, m)
    while len(prediction.estimates) < MAX_TRACES and guess > lo:
        if trace(guess).peak_gib <= budget_gib:
            prediction.proposal = guess
            return prediction
        guess -= m * max(1, math.ceil(0.01 * guess / m))  # 1% steps down
    prediction.proposal = lo
    return prediction


def _proposal_within(estimates: list[Estimate], budget_gib: float, m: int) -> int | None:
    """The largest N the traces put within the budget: the largest trace that fits, or above it the
    crossing of the quadratic through the three largest traces, below the smallest trace over it."""
    fits = [e.n for e in estimates if e.peak_gib <= budget_gib]
    if not fits:
        return None
    lo, over = max(fits), [e.n for e in estimates if e.peak_gib > budget_gib]
    guess = _crossing(estimates, budget_gib, m, lo)
    return guess if guess is not None and (not over or guess < min(over)) else lo


def _crossing(estimates: list[Estimate], budget_gib: float, m: int, lo: int) -> int | None:
    """Where the quadratic through the three largest traces first crosses the budget above the
    largest trace that fits (`lo`), rounded down to m."""
    points = sorted({e.n: e.peak_gib for e in estimates}.items())[-3:]
    if len(points) < 2:
        return None
    xs, ys = (np.array(v, dtype=float) for v in zip(*points, strict=True))
    model = np.poly1d(np.polyfit(xs, ys, deg=len(points) - 1)) - budget_gib
    roots = [r.real for r in model.roots if abs(r.imag) < 1e-9 and r.real > lo]
    return align_down(min(roots), m) if roots else None


def for_run(settings: BenchConfig, workload: Workload, topology: Topology) -> Prediction:
    """The run's prediction; CannotTrace names the op when the workload cannot run on fake tensors."""
    p, budget = settings.probe, cap_gib(settings.memory, device_type(pick_backend(settings.dist.backend)))
    with chunking.sized_for(budget):  # the chunks the ranks run under this budget
        prediction = predict(
            workload,
            topology,
            lambda n: run_shape(settings, n),
            settings.workflow is Workflow.training,
            getattr(torch, settings.dtype.value),
            settings.seed,
            budget,
            p.start,
            p.factor,
            p.max_tokens,
            gloo=pick_backend(settings.dist.backend) == "gloo",
        )
    if prediction.proposal:
        prediction.owners = tuple(holders_at(settings, workload, topology, prediction.proposal))
    return prediction


def holders_at(
    settings: BenchConfig, workload: Workload, topology: Topology, n: int
) -> list[tuple[str, int]]:
    """Who holds the run's peak at N on its first traced rank (bytes, largest first), traced with the
    chunks its ranks run; CannotTrace where the workload cannot run on fake tensors."""
    backend = pick_backend(settings.dist.backend)
    shape, dtype = run_shape(settings, n), getattr(torch, settings.dtype.value)
    with chunking.sized_for(cap_gib(settings.memory, device_type(backend))):
        held = peak_owners(workload, topology, shape, settings.workflow is Workflow.training, dtype,
                           settings.seed, traced_ranks(topology)[0], backend == "gloo")  # fmt: skip
    return top_owners(held)


def summary(prediction: Prediction) -> list[str]:
    """What `python -m cpbench.predict` prints: the peak at each traced N, the proposal, the assumptions."""
    lines = [f"{'N_tokens':>9}  predicted peak GiB/rank (over the start-up baseline)"]
    lines += [f"{e.n:>9}  {e.peak_gib:.4f}" for e in sorted(prediction.estimates, key=lambda e: e.n)]
    ranks = ", ".join(str(r) for r in prediction.ranks)
    lines.append(f"traced ranks: {ranks}; budget {prediction.budget_gib:g} GiB per rank")
    lines.append(f"predicted max N_tokens: {prediction.proposal if prediction.proposal else 'none fits'}")
    if prediction.owners:
        held = ", ".join(f"{name} {size / GIB:.3f} GiB" for name, size in prediction.owners)
        lines.append(f"at N={prediction.proposal} the peak is held by: {held}")
    if not visible_gpus():  # the target device is not here: say what the estimate leaves out
        lines.append(f"assumes: {ASSUMPTIONS}")
    return lines
