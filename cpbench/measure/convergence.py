"""workflow=convergence: K training steps, a new batch each from (seed, step), the loss and gradient
norm of every step; checkpoints every `every` steps and resume from the last one. CP does not change
the math, so the curve at any topology must equal cp=1's within fp32 tolerance (`compare`)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
import torch.distributed as dist

from cpbench.core import DoesNotFit, RankContext, Shape
from cpbench.measure.fault import Fault
from cpbench.measure.memory import read_peak_gib, reset_peak
from cpbench.measure.oom import describe, is_oom
from cpbench.measure.step import StepRunner
from cpbench.results.folder import RunFolder
from cpbench.runtime.logs import LOG
from cpbench.runtime.seed import seed_all

COLUMNS = ["step", "loss", "grad_norm", "topology", "cp", "step_ms", "checkpoint_s", "checkpoint_bytes"]
COMPARED = ("loss", "grad_norm")


def batch_seed(seed: int, step: int) -> int:
    """Step k's batch is a pure function of (seed, k): a resumed run draws the batches it missed."""
    return seed * 1_000_003 + step


@dataclass(frozen=True)
class ConvergenceSettings:
    shape: Shape  # every step's
    steps: int
    checkpoint_every: int  # 0: no checkpoints
    seed: int
    fault: Fault
    key: str  # of the settings that decide the curve: a checkpoint of other settings is not resumed
    cap_gib: float | None = None  # the per-rank memory cap, named when a step does not fit
    baseline_gib: float = 0.0  # what the rank held after start-up: a CPU step's peak counts above it


def run_convergence(
    runner: StepRunner,
    ctx: RankContext,
    control: dist.ProcessGroup,
    folder: RunFolder,
    settings: ConvergenceSettings,
    progress: Callable[[str], None],
    record: Callable[[dict], None],
) -> pd.DataFrame | None:
    """Every rank runs it; rank 0 writes convergence.csv after every step (and tells `record` of the
    row), and returns the curve.
    Step time is the slowest rank's step alone: building the batch and checkpoints are not in it."""
    if runner.optimizer is None:
        raise RuntimeError("workflow=convergence needs the native contract and trainable parameters")
    # Imported here: torch.distributed.checkpoint costs about 0.9 s of every process's start-up.
    from cpbench.measure import checkpoint

    lead, shape = ctx.rank == 0, settings.shape
    runner.track_grad_norm = True
    box = [
        checkpoint.latest(folder.checkpoints, settings.key) if lead and settings.checkpoint_every else None
    ]
    dist.broadcast_object_list(box, src=0, group=control)
    start = 0
    if box[0] is not None:
        start = checkpoint.load(box[0], runner.model, runner.optimizer, control)
        LOG.warning("resumed from the checkpoint after step %d: %s", start, box[0])
    rows = []
    if lead and start:
        rows = folder.read_convergence().query("step < @start").to_dict("records")
    for step in range(start, settings.steps):
        progress(f"convergence step {step + 1} of {settings.steps}")
        settings.fault.before_step(ctx.rank, step, start > 0, ctx.device)
        seed = batch_seed(settings.seed, step)
        reset_peak(ctx.device)  # a checkpoint between steps is no step's
        out, phases, failure = _step(runner, shape, dataclasses.replace(ctx, seed=seed), control)
        failure = failure or _over_cap(ctx.device, control, settings)
        if failure:
            raise does_not_fit(shape, settings.cap_gib, f"rank {ctx.rank}, step {step}: {failure}")
        loss = torch.tensor([out.detach().double().item()], dtype=torch.float64)
        dist.all_reduce(loss, group=control)  # the ranks' shares sum to the global loss
        seconds = torch.tensor([phases.total], dtype=torch.float64)
        dist.all_reduce(seconds, op=dist.ReduceOp.MAX, group=control)
        row = {"step": step, "loss": loss.item(), "grad_norm": runner.grad_norm,
               "topology": ctx.topology.kind.value, "cp": ctx.topology.cp, "step_ms": seconds.item() * 1e3,
               "checkpoint_s": None, "checkpoint_bytes": None}  # fmt: skip
        done = step + 1
        if settings.checkpoint_every and done % settings.checkpoint_every == 0:
            saved = checkpoint.save(
                folder.checkpoint(done), done, runner.model, runner.optimizer, control, settings.key
            )
            row.update(checkpoint_s=saved.seconds, checkpoint_bytes=saved.bytes)
        if lead:
            rows.append(row)
            record(row)
            folder.write_convergence(pd.DataFrame(rows, columns=COLUMNS))
    return pd.DataFrame(rows, columns=COLUMNS) if lead else None


def does_not_fit(shape: Shape, cap_gib: float | None, where: str) -> DoesNotFit:
    """The one line of a convergence run out of memory: what did not fit, where, what to change."""
    cap = f"{cap_gib:g} GiB per rank" if cap_gib is not None else "memory"
    return DoesNotFit(
        f"workflow=convergence: N_tokens={shape.n_tokens} does not fit in {cap} ({where}); lower "
        "shape.n_tokens or raise memory.budget_gib (memory.cpu_budget_gib on CPU)"
    )


def _over_cap(device: torch.device, control: dist.ProcessGroup, settings: ConvergenceSettings) -> str:
    """On CPU the cap holds the measured resident peak (measure/cap.py): a step over it on any rank
    does not fit though no allocation failed, and every rank agrees before the next collective. A GPU's
    cap is the allocator's, which fails the allocation itself."""
    if device.type != "cpu" or settings.cap_gib is None:
        return ""
    worst = torch.tensor([read_peak_gib(device) - settings.baseline_gib], dtype=torch.float64)
    dist.all_reduce(worst, op=dist.ReduceOp.MAX, group=control)
    if worst.item() <= settings.cap_gib:
        return ""
    return f"peak {worst.item():.3f} GiB over the baseline exceeds {settings.cap_gib:g} GiB (largest rank)"


def _step(runner: StepRunner, shape: Shape, ctx: RankContext, control: dist.ProcessGroup) -> tuple:
    """One step on its own batch; an out-of-memory error comes back as its one-line description."""
    try:
        seed_all(ctx.seed)
        batch = runner.workload.build_batch(shape, ctx)
        dist.barrier(group=control)
        out, phases = runner(batch)
        return out, phases, ""
    except Exception as err:
        if not is_oom(err):
            raise
        return None, None, describe(err)


@dataclass(frozen=True)
class Comparison:
    """A curve against a reference over their common steps, within rtol/atol (numpy.isclose)."""

    steps: int  # common steps compared
    rtol: float
    atol: float
    step: int | None = None  # the first step outside the tolerance
    column: str | None = None
    value: float | None = None
    expected: float | None = None

    @property
    def match(self) -> bool:
        return self.steps > 0 and self.step is None

    def line(self) -> str:
        tolerance = f"rtol={self.rtol:g}, atol={self.atol:g}"
        if not self.steps:
            return "no common steps to compare"
        if self.match:
            return f"equal over {self.steps} step(s) ({tolerance})"
        return (
            f"diverges first at step {self.step}: {self.column} {self.value:.9g} vs {self.expected:.9g} "
            f"({tolerance}; {self.steps} common step(s))"
        )

    def as_dict(self) -> dict[str, object]:
        return {**dataclasses.asdict(self), "match": self.match, "summary": self.line()}


def compare(curve: pd.DataFrame, reference: pd.DataFrame, rtol: float, atol: float) -> Comparison:
    """Where `curve` first leaves `reference` (loss or gradient norm), over the steps both have."""
    both = curve.merge(reference, on="step", suffixes=("", "_ref")).sort_values("step")
    for _, row in both.iterrows():
        for column in COMPARED:
            value, expected = float(row[column]), float(row[f"{column}_ref"])
            if not (np.isclose(value, expected, rtol=rtol, atol=atol) and math.isfinite(value)):
                return Comparison(len(both), rtol, atol, int(row["step"]), column, value, expected)
    return Comparison(len(both), rtol, atol)
