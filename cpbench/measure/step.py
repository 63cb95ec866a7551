"""One step of a workflow, each phase timed on its own, under the workload's contract."""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from cpbench.core import RankContext, phases
from cpbench.distributed.comm import all_reduce_sum, op_label
from cpbench.distributed.dtensor import is_dtensor
from cpbench.workloads.base import Contract, Workload, traits


@dataclass(frozen=True)
class Phases:
    """Seconds of one step on this rank. Inference is all forward; a step the workload runs whole
    (the foldcp contract in training) has no phases of its own: NaN, reported blank."""

    forward: float
    backward: float = 0.0
    optimizer: float = 0.0
    total: float | None = None  # forward + backward + optimizer unless given
    # Seconds of one pass of each phase the model marks inside the step (core/phases.py).
    named: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.total is None:
            object.__setattr__(self, "total", self.forward + self.backward + self.optimizer)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class StepClock:
    """Phase boundaries within one step. On a GPU they are CUDA events, read once the step is over:
    the step runs with no synchronisation inside it, as a real run does. On CPU, the wall clock."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.marks: list[Any] = []

    def mark(self) -> None:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.marks.append(event)
        else:
            self.marks.append(time.perf_counter())

    def seconds(self) -> list[float]:
        """Seconds between consecutive marks (on a GPU, after waiting for the last one)."""
        if self.cuda:
            self.marks[-1].synchronize()
            return [a.elapsed_time(b) / 1e3 for a, b in itertools.pairwise(self.marks)]
        return [b - a for a, b in itertools.pairwise(self.marks)]


class StepRunner:
    """native: the workload's forward (its loss in training), then backward, the sum of replicated
    parameters' gradients over the CP ranks and an AdamW step. foldcp: run_step is the whole step,
    and the driver adds nothing to it."""

    def __init__(
        self,
        workload: Workload,
        model: torch.nn.Module,
        train: bool,
        ctx: RankContext,
        lr: float,
        weight_decay: float,
        track_grad_norm: bool = False,
    ):
        self.workload, self.model, self.train, self.device = workload, model, train, ctx.device
        self.contract = traits(workload).contract
        # A DTensor parameter's gradient belongs to the model: it is complete, or sharded as the model
        # decided; summing it over ranks would be wrong.
        params = [p for p in model.parameters() if p.requires_grad]
        self.replicated = [p for p in params if not is_dtensor(p)]
        native_train = train and self.contract is Contract.native
        self.optimizer = (
            torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay) if native_train and params else None
        )
        self.grad_group = dist.group.WORLD if ctx.world_size > 1 else None
        self.track_grad_norm = track_grad_norm and self.optimizer is not None
        # The last step's gradient norm when tracked (mode=accuracy, workflow=convergence): a checked
        # quantity, the same on every rank; off in plain timed steps (a pass over the gradients).
        self.grad_norm: float | None = None
        self.steps_taken = 0  # in training, each one has moved the weights away from the seed's

    @property
    def moved(self) -> bool:
        """Whether the model is no longer as built: a training step has run."""
        return self.train and self.steps_taken > 0

    @property
    def returns_loss(self) -> bool:
        """native training: the step's output is the loss (each rank's share of it)."""
        return self.train and self.contract is Contract.native

    @property
    def fresh_batch_per_step(self) -> bool:
        """The fold-cp driver builds a batch before every step (outside the timer)."""
        return self.contract is Contract.foldcp

    def __call__(self, batch: Any) -> tuple[Any, Phases]:
        """Run one step; return its output and the seconds of each phase."""
        self.steps_taken += 1
        if self.contract is Contract.foldcp:
            return self._whole_step(batch)
        synchronize(self.device)  # the previous step's work is not this one's
        clock = StepClock(self.device)
        clock.mark()
        # inference keeps no autograd graph, as in a real run
        with phases.timing(self.device) as timer, torch.set_grad_enabled(self.train):
            out = self.workload.run_step(self.model, batch, self.train)
        clock.mark()
        if not self.train:
            seconds = clock.seconds()  # on a GPU, waits for the step: the phases' events are done
            return out, Phases(*seconds, named=timer.per_pass())
        if out is not None and out.requires_grad:
            out.backward()
        clock.mark()
        if self.optimizer is not None:
            self._sum_gradients()
            if self.track_grad_norm:
                self.grad_norm = self._grad_norm()
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
        clock.mark()
        seconds = clock.seconds()
        return out, Phases(*seconds, named=timer.per_pass())

    def _whole_step(self, batch: Any) -> tuple[Any, Phases]:
        synchronize(self.device)
        start = time.perf_counter()
        with phases.timing(self.device) as timer:
            out = self.workload.run_step(self.model, batch, self.train)
        synchronize(self.device)
        seconds, named = time.perf_counter() - start, timer.per_pass()
        if self.train:
            return out, Phases(math.nan, math.nan, math.nan, total=seconds, named=named)
        return out, Phases(forward=seconds, named=named)

    @torch.no_grad()
    def _grad_norm(self) -> float:
        """The L2 norm (float64) of every gradient after the sum over ranks; a DTensor's over its whole
        tensor (a collective: every rank takes the step, so every rank runs it)."""
        grads = [p.grad for p in self.model.parameters() if p.grad is not None]
        grads = [g.full_tensor() if is_dtensor(g) else g for g in grads]
        return math.sqrt(math.fsum(float(g.double().pow(2).sum()) for g in grads))

    @torch.no_grad()
    def _sum_gradients(self) -> None:
        """Each rank holds its shard's share of a replicated parameter's gradient: add them up."""
        if self.grad_group is None:
            return
        grads = [p.grad for p in self.replicated if p.grad is not None]
        if not grads:
            return
        with op_label("grad_sync"):
            flat = all_reduce_sum(torch.cat([g.reshape(-1) for g in grads]), self.grad_group)
        offset = 0
        for g in grads:
            g.copy_(flat[offset : offset + g.numel()].view_as(g))
            offset += g.numel()
