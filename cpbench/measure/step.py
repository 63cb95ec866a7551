"""One step of a workflow, each phase timed on its own."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from cpbench.core import RankContext
from cpbench.distributed.comm import all_reduce_sum, op_label
from cpbench.workloads.base import Workload


@dataclass(frozen=True)
class Phases:
    """Seconds of one step's phases on this rank (inference: all forward)."""

    forward: float
    backward: float = 0.0
    optimizer: float = 0.0

    @property
    def total(self) -> float:
        return self.forward + self.backward + self.optimizer


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class StepRunner:
    """Inference: the workload's forward. Training: forward (the workload's loss), backward, the
    sum of replicated parameters' gradients over the CP ranks, and an AdamW step."""

    def __init__(
        self,
        workload: Workload,
        model: torch.nn.Module,
        train: bool,
        ctx: RankContext,
        lr: float,
        weight_decay: float,
    ):
        self.workload, self.model, self.train, self.device = workload, model, train, ctx.device
        params = [p for p in model.parameters() if p.requires_grad]
        self.params = params
        self.optimizer = (
            torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay) if train and params else None
        )
        self.grad_group = dist.group.WORLD if ctx.world_size > 1 else None

    def __call__(self, batch: Any) -> tuple[torch.Tensor | None, Phases]:
        """Run one step; return its output and the seconds of each phase."""
        synchronize(self.device)
        start = time.perf_counter()
        with torch.set_grad_enabled(self.train):  # inference keeps no autograd graph, as in a real run
            out = self.workload.run_step(self.model, batch, self.train)
        synchronize(self.device)
        forward_end = time.perf_counter()
        if not self.train:
            return out, Phases(forward=forward_end - start)
        if out is not None and out.requires_grad:
            out.backward()
        synchronize(self.device)
        backward_end = time.perf_counter()
        if self.optimizer is not None:
            self._sum_gradients()
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
        synchronize(self.device)
        end = time.perf_counter()
        return out, Phases(forward_end - start, backward_end - forward_end, end - backward_end)

    @torch.no_grad()
    def _sum_gradients(self) -> None:
        """Each rank holds its shard's share of a replicated parameter's gradient: add them up."""
        if self.grad_group is None:
            return
        grads = [p.grad for p in self.params if p.grad is not None]
        if not grads:
            return
        with op_label("grad_sync"):
            flat = all_reduce_sum(torch.cat([g.reshape(-1) for g in grads]), self.grad_group)
        offset = 0
        for g in grads:
            g.copy_(flat[offset : offset + g.numel()].view_as(g))
            offset += g.numel()
