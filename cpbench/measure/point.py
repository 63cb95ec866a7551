"""One measured point: build the batch (untimed), warm up, time the repeats, agree on the outcome.

How many steps: at least `warmup` and `repeats`; when a cap is above its floor, more warm-up steps
until the step time settles and more repeats while their IQR is wide. Every rank must take the same
number of steps (the steps hold collectives), so those decisions are made on the slowest rank's step
time, agreed by an all-reduce on the control group after each step, outside the timed region.

Every rank agrees on "fits / does not fit" through one collective on the control group before any
further collective runs; memory is released outside the `except` block, since a live traceback
keeps the failing frames' tensors alive.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from cpbench.core import RankContext, Shape
from cpbench.core.phases import COLUMNS as PHASE_COLUMNS
from cpbench.core.phases import slowest_median_ms
from cpbench.distributed.comm import LEDGER
from cpbench.measure import comm_profile
from cpbench.measure.cap import Cap
from cpbench.measure.checksum import local_share
from cpbench.measure.fault import Fault
from cpbench.measure.memory import read_peaks, release, reset_peak
from cpbench.measure.oom import BudgetExceeded, KernelFault, classify, describe, near_cap
from cpbench.measure.stats import (
    PointTimes,
    RepeatTiming,
    comm_mib_per_step,
    first_step_ms,
    repeat_totals_ms,
    settled,
    spread_wide,
)
from cpbench.measure.step import StepRunner
from cpbench.results.row import KERNEL, OOM, Measured
from cpbench.runtime.logs import LOG
from cpbench.runtime.seed import seed_all
from cpbench.settings.schema import TimingConfig


@dataclass(kw_only=True)
class PointResult(Measured):
    """A point's measured columns, and its per-op communication table (comm_ops.csv): per op label,
    calls, bytes sent (forward, backward) and seconds per step, max over ranks."""

    comm_ops: list[dict[str, Any]] = field(default_factory=list)


def _reduce(values: list[float], group: dist.ProcessGroup, op: dist.ReduceOp) -> list[float]:
    t = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(t, op=op, group=group)
    return t.tolist()


class OutOfMemoryAlone(RuntimeError):
    """This rank ran out of memory inside a step and its peers did not come to agree: they wait in a
    collective it will never join. Ending the job at once (peers then fail fast on the closed
    connection) beats their waiting out the process-group timeout; the run restarts and resumes."""


def agree_fits(fits: bool, group: dist.ProcessGroup, wait_s: float | None = None) -> bool:
    """True only when it fit on every rank; waits at most `wait_s` when given."""
    flag = torch.tensor([1.0 if fits else 0.0], dtype=torch.float64)
    work = dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=group, async_op=True)
    if wait_s is None:
        work.wait()
    else:
        try:
            work.wait(timeout=timedelta(seconds=wait_s))
        except RuntimeError as err:
            raise OutOfMemoryAlone(f"out of memory alone, peers did not agree within {wait_s:g} s") from err
    return flag.item() == 1.0


def collectives_in_flight(issued: int, group: dist.ProcessGroup, counted: bool) -> bool:
    """After a point that did not fit: whether some rank may have a collective queued that a peer never
    joined (NCCL runs them asynchronously, so such a kernel waits on the device for ever). Every rank
    issued as many as its peers: none. `counted` False: the model's own collectives are invisible to
    the ledger, so it cannot be ruled out."""
    counts: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(counts, issued, group=group)
    return not counted or len(set(counts)) > 1


def _guarded(fn: Callable[[], Any], starved: Callable[[], bool]) -> tuple[Any, str]:
    """Run fn; an out-of-memory error becomes a message (cuBLAS failing to start counts when `starved`
    says memory was near the cap), a kernel fault becomes KernelFault at once (on a GPU the context is
    dead: no agreement, no release, nothing more on the device), anything else propagates."""
    try:
        return fn(), ""
    except Exception as err:
        failure = classify(err, starved)
        if failure == KERNEL:
            raise KernelFault(describe(err)) from err
        if failure != OOM:
            raise
        return None, describe(err)


@dataclass(frozen=True)
class PointSettings:
    """How a point is measured: the same for every point of a run; a probe step is one repeat. The step
    counts are the run's `timing.*` (`TimingConfig`, where their defaults live)."""

    timing: TimingConfig = field(default_factory=TimingConfig)
    cap: Cap | None = None  # the rank's memory cap
    fault: Fault = field(default_factory=Fault)
    agree_wait_s: float = 10.0  # after an OOM on one rank, how long to wait for the peers to agree
    seed: int = 0  # every build_batch starts from it
    counts_comm: bool = True  # every collective goes through cpbench's ledger: comm figures are complete
    profile_comm: bool = False  # comm time from the torch profiler's communication events instead
    progress: Callable[[str], None] | None = None  # told which step is under way, for a progress line

    def with_steps(self, **counts: int) -> PointSettings:
        """These settings with some of `timing`'s step counts changed."""
        return replace(self, timing=replace(self.timing, **counts))

    def single_step(self) -> PointSettings:
        """One step that stands for a full measurement (a probe step), held to the cap it leaves."""
        cap = self.cap.for_one_step() if self.cap else None
        return replace(self.with_steps(warmup=0, repeats=1, warmup_max=0, repeats_max=1), cap=cap)

    def fixed(self) -> PointSettings:
        """Exactly `warmup` and `repeats` steps: runs to be compared take the same steps."""
        return self.with_steps(warmup_max=self.timing.warmup, repeats_max=self.timing.repeats)


def comm_timing(device: torch.device, settings: PointSettings) -> str:
    """How a run's comm ms is measured, for the reader of its report."""
    if settings.profile_comm and device.type == "cuda":
        return (
            "the NCCL kernels' device time (ncclDevKernel_*, ncclKernel_*) in the torch profiler's CUDA "
            "trace inside the timed steps (measure.profile_comm); blank where the trace cannot tell"
        )
    if settings.profile_comm:
        return "the torch profiler's gloo/NCCL spans inside the timed steps (measure.profile_comm)"
    if not settings.counts_comm:
        return "not measured: the model's collectives do not go through cpbench (try measure.profile_comm)"
    if device.type == "cuda":
        return "CUDA events around each collective of cpbench's layer, no synchronisation inside the steps"
    return "the wall clock around each collective of cpbench's layer (gloo returns when it is done)"


def measure_point(
    runner: StepRunner, shape: Shape, ctx: RankContext, control: dist.ProcessGroup, settings: PointSettings
) -> PointResult:
    """Fits = every rank finished with no out-of-memory error and, under a cap, a peak within it."""
    release(ctx.device)
    reset_peak(ctx.device)
    fault, cap = settings.fault, settings.cap
    issued_before = LEDGER.issued

    def build() -> Any:
        fault.before_batch(ctx.rank, shape.n_tokens, ctx.device)
        seed_all(settings.seed)
        return runner.workload.build_batch(shape, ctx)

    def steps() -> Any:
        with fault.in_step(ctx.rank, shape.n_tokens, ctx.device):
            try:
                return _run_repeats(runner, batches, control, settings)
            except PeerOverBudget:  # the rank over it says so; this one stops with it
                return None

    def note(failure: str) -> None:
        if failure:  # into every rank's log file, when it happens
            LOG.debug("rank %d, N=%d: %s", ctx.rank, shape.n_tokens, failure)

    def starved() -> bool:
        return near_cap(ctx.device, cap)

    batch, failure = _guarded(build, starved)
    note(failure)
    batches, batch = _Batches(batch, build, runner.fresh_batch_per_step), None
    timed = None
    # build_batch may run collectives of its own (distribute_tensor): peers of a rank that failed
    # before joining one are stuck in it, so a failed rank waits for them only so long.
    try:
        built = agree_fits(not failure, control, settings.agree_wait_s if failure else None)
    except OutOfMemoryAlone as err:
        raise OutOfMemoryAlone(f"{err}: {failure}") from err
    if built:
        timed, failure = _guarded(steps, starved)
    peaks = read_peaks(ctx.device)  # before `release`: the allocator still holds its peak's segments
    peak_local = peaks.gib
    # Judged on the figure the cap binds on (measure/cap.py): on a GPU the allocator's reserved peak.
    if not failure and cap is not None and (over := cap.exceeded(peaks)):
        failure = describe(BudgetExceeded(over))
    batches = None
    if built:
        note(failure)  # in a step, or over the cap
    # After a failure inside the steps the peers may be stuck in a collective: wait for them briefly.
    # The agreement runs on the control group (gloo, on the CPU) before any device work: on a GPU,
    # `release` (empty_cache) waits for this rank's queued kernels, and a collective whose peer left
    # never ends.
    try:
        fits = agree_fits(not failure, control, settings.agree_wait_s if failure and timed is None else None)
    except OutOfMemoryAlone as err:
        raise OutOfMemoryAlone(f"{err}: {failure}") from err
    if (
        not fits
        and ctx.device.type == "cuda"
        and collectives_in_flight(LEDGER.issued - issued_before, control, settings.counts_comm)
    ):
        raise OutOfMemoryAlone(f"out of memory with collectives left in flight on the GPU: {failure}")
    release(ctx.device)
    # A figure a rank does not have (CPU, NVML unreadable) is -1 in the reduction, and blank after it.
    gpu = (peaks.reserved_gib, peaks.device_used_gib, peaks.alloc_retries, peaks.alloc_ooms)
    gpu = [-1.0 if v is None else v for v in gpu]
    # One all-reduce: the max of -peak is minus the min over ranks.
    peak, negated_min, *gpu = _reduce([peak_local, -peak_local, *gpu], control, dist.ReduceOp.MAX)
    reserved, used, *counts = (None if v < 0 else v for v in gpu)
    retries, ooms = (None if v is None else int(v) for v in counts)
    memory = dict(peak_mem_min_gib=-negated_min, peak_reserved_gib=reserved, device_used_gib=used,
                  alloc_retries=retries, alloc_ooms=ooms)  # fmt: skip
    if not fits:
        messages = [None] * dist.get_world_size(control)
        dist.all_gather_object(messages, failure, group=control)
        first = next((f"rank {r}: {m}" for r, m in enumerate(messages) if m), "")
        return PointResult(status="oom", peak_mem_gib=peak, **memory, failure=OOM, error=first)
    result = _summarise(timed, peak, control, loss=runner.returns_loss)
    per_s = shape.n_tokens / (result.walltime_ms / 1e3) if result.walltime_ms else None
    result = replace(result, **memory, tokens_per_s=per_s)
    if settings.profile_comm:  # a rank whose trace cannot tell (None) blanks the figure
        seconds, blind = _reduce([timed.profiled_s or 0.0, float(timed.profiled_s is None)], control,
                                 dist.ReduceOp.MAX)  # fmt: skip
        comm_ms = None if blind else seconds * 1e3
        return replace(result, comm_ms=comm_ms, comm_mib_per_step=None, comm_ops=[])
    if not settings.counts_comm:  # collectives the ledger cannot see: blank, not a misleading 0
        return replace(result, comm_ms=None, comm_mib_per_step=None, comm_ops=[])
    return result


class _Batches:
    """The batch of each step: the one built (and agreed on) first, then, when the contract asks, a new
    one before every later step; the previous batch is freed before the next is built."""

    def __init__(self, first: Any, build: Callable[[], Any], fresh: bool):
        self.current, self.build, self.fresh, self.used = first, build, fresh, False

    def next(self) -> Any:
        if self.fresh and self.used:
            self.current = None
            self.current = self.build()
        self.used = True
        return self.current


@dataclass
class RankSteps:
    """What one rank's steps of a point leave, gathered on the control group and reduced by `stats`."""

    timings: list[RepeatTiming]
    share: float | None  # this rank's share of the checksum of the first step's output
    bytes_per_step: float
    ops: list[dict[str, Any]]
    # per step, in the profiler's communication events (measure.profile_comm); None: it cannot tell
    profiled_s: float | None
    first_step_s: float
    warmup_steps: int
    grad_norm: float | None
    # Per timed repeat, seconds of one pass of each phase the model marks (core/phases.py).
    phases: list[dict[str, float]] = field(default_factory=list)


class PeerOverBudget(Exception):
    """Another rank's peak went over the cap: this one stops stepping with it."""


def _agree_after_step(seconds: float, control: dist.ProcessGroup, cap: Cap | None, device) -> float:
    """The slowest rank's step time (ms): what every rank decides on, so that all take the same steps.
    In the same all-reduce, whether any rank's peak is over the cap already: then every rank stops
    here (the rank over it raises BudgetExceeded, its peers PeerOverBudget), rather than taking the
    point's remaining steps to fail it at the end."""
    over = cap is not None and (peak := cap.peak_now_gib(device)) > cap.gib
    slowest, anyone = _reduce([seconds * 1e3, float(over)], control, dist.ReduceOp.MAX)
    if over:
        raise BudgetExceeded(cap.over(peak))
    if anyone:
        raise PeerOverBudget
    return slowest


@dataclass
class FirstStep:
    """What the point's first step returned: its checksum share and gradient norm. A training step
    moves the weights, so only the first step, taken from the seed's weights (the driver rebuilds the
    model before a training point), is the same whatever the warm-up count and the points before."""

    share: float | None = None
    grad_norm: float | None = None
    taken: bool = False

    def see(self, out: Any, runner: StepRunner) -> None:
        if not self.taken:
            self.share, self.grad_norm, self.taken = local_share(out), runner.grad_norm, True


def _warm_up(
    runner: StepRunner, batches: _Batches, control, settings: PointSettings, first: FirstStep
) -> list[float]:
    """The warm-up steps' times (seconds, this rank's), `warmup` of them or, with a higher cap, until
    the slowest rank's step time settles."""
    say, timing = settings.progress or (lambda where: None), settings.timing
    most = max(timing.warmup, timing.warmup_max)
    adaptive = most > timing.warmup
    seconds, agreed = [], []
    while len(seconds) < most:
        say(f"warm-up step {len(seconds) + 1} of {timing.warmup}" + (f" to {most}" if adaptive else ""))
        out, p = runner(batches.next())
        first.see(out, runner)
        out = None
        seconds.append(p.total)
        if adaptive:
            agreed.append(_agree_after_step(p.total, control, settings.cap, runner.device))
        if len(seconds) >= timing.warmup and (not adaptive or settled(agreed, timing.settle_pct)):
            break
    return seconds


def _run_repeats(runner: StepRunner, batches: _Batches, control, settings: PointSettings) -> RankSteps:
    say, timing = settings.progress or (lambda where: None), settings.timing
    first = FirstStep()
    warm = _warm_up(runner, batches, control, settings, first)
    most = max(timing.repeats, timing.repeats_max)
    adaptive = most > timing.repeats
    LEDGER.reset()
    timings, named, agreed, out, batch = [], [], [], None, None
    device = runner.device.type
    profiler = comm_profile.profiler(device) if settings.profile_comm else contextlib.nullcontext()
    with profiler:
        while len(timings) < most:
            say(f"timed step {len(timings) + 1} of {timing.repeats}" + (f" to {most}" if adaptive else ""))
            out = batch = None  # the last output and batch are freed before the next, as in a real run
            batch = batches.next()  # built outside the timer
            # Start together (outside the timed region), stopping first if a step so far went over the cap.
            _agree_after_step(0.0, control, settings.cap, runner.device)
            comm_before = LEDGER.total_seconds
            with torch.profiler.record_function(comm_profile.STEP_EVENT):
                out, p = runner(batch)
            comm = LEDGER.total_seconds - comm_before
            first.see(out, runner)
            timings.append(RepeatTiming(p.total, p.forward, p.backward, p.optimizer, comm))
            named.append(p.named)
            if adaptive:
                agreed.append(_agree_after_step(p.total, control, settings.cap, runner.device))
            if len(timings) >= timing.repeats and (not adaptive or not spread_wide(agreed, timing.iqr_pct)):
                break
    profiled = comm_profile.comm_seconds(profiler.events(), device) if settings.profile_comm else 0.0
    if profiled is None:
        LOG.warning(
            "measure.profile_comm: the trace of %s holds no NCCL kernel where collectives ran, or no "
            "device activity at all: comm_ms is left blank",
            runner.device,
        )
    return RankSteps(
        timings=timings,
        phases=named,
        share=first.share,
        bytes_per_step=LEDGER.total_bytes / len(timings),
        ops=LEDGER.table(),
        profiled_s=None if profiled is None else profiled / len(timings),
        first_step_s=(warm or [timings[0].total])[0],
        warmup_steps=len(warm),
        grad_norm=first.grad_norm,
    )


def _summarise(steps: RankSteps, peak: float, control, loss: bool = False) -> PointResult:
    """Every rank's figures, gathered on the control group and reduced by the pure functions of
    `stats`, so that their unit tests pin what a run reports. With `loss`, the output is the loss."""
    gathered: list[Any] = [None] * dist.get_world_size(control)
    dist.all_gather_object(gathered, steps, group=control)
    counted = [s.share for s in gathered if s.share is not None]  # blank when no rank returned a tensor
    checksum = math.fsum(counted) if counted else None
    repeats = len(steps.timings)
    per_rank = [s.timings for s in gathered]
    phase_ms = slowest_median_ms([s.phases for s in gathered])
    return PointResult(
        status="ok",
        peak_mem_gib=peak,
        **asdict(PointTimes.across_ranks(per_rank)),
        **{column: phase_ms.get(name) for name, column in PHASE_COLUMNS.items()},
        comm_mib_per_step=comm_mib_per_step([s.bytes_per_step for s in gathered]),
        checksum=checksum,
        loss=checksum if loss else None,
        grad_norm=steps.grad_norm,  # the summed gradients: the same on every rank
        warmup_steps=steps.warmup_steps,
        repeats=repeats,
        first_step_ms=first_step_ms([s.first_step_s for s in gathered]),
        repeats_ms=" ".join(f"{ms!r}" for ms in repeat_totals_ms(per_rank)),
        comm_ops=_slowest_ops([s.ops for s in gathered], repeats),
    )


def _slowest_ops(per_rank: Sequence[list[dict[str, Any]]], repeats: int) -> list[dict[str, Any]]:
    """Each op's per-step figures, the largest over ranks (ranks of a 2d grid send unequal amounts)."""
    merged: dict[str, dict[str, Any]] = {}
    for rank_ops in per_rank:
        for op in rank_ops:
            row = merged.setdefault(op["op"], {"op": op["op"]})
            for key in ("calls", "fwd_bytes", "bwd_bytes", "seconds"):
                row[key] = max(row.get(key, 0), op[key] / repeats)
    return sorted(merged.values(), key=lambda r: -r["seconds"])
