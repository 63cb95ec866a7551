"""This rank's model and its step runner, and the one rule for when the model is built again."""

from __future__ import annotations

import time

import torch.distributed as dist

from cpbench.core import Shape
from cpbench.measure.cap import cap_lifted
from cpbench.measure.flops import Counted, count_over_ranks
from cpbench.measure.memory import release
from cpbench.measure.oom import KernelFault
from cpbench.measure.point import OutOfMemoryAlone, PointResult, PointSettings, measure_point
from cpbench.measure.step import StepRunner
from cpbench.probe.in_flight import InFlight
from cpbench.rank.session import RankSession
from cpbench.runtime.logs import LOG
from cpbench.runtime.seed import seed_all
from cpbench.settings.schema import Mode


class ModelRunner:
    """Runs the point and probe steps, and the FLOP counts, on this rank's model. The model is built
    again from the seed when it is not the seed's any more: before a step once a training step moved
    its weights, so that a point's checksum depends on the seed and the shape alone, not on the steps
    before it; before anything once a step ran out of memory (it can leave the model's own
    communication state mid-flight) or a training count left fake gradients on it."""

    def __init__(self, session: RankSession):
        self.session = session
        self._runner: StepRunner | None = self._build()
        self._spoilt = False  # out of memory in a step, or fake gradients: built again before any use
        self._counted: dict[Shape, Counted] = {}  # model FLOPs by shape (measure.count_flops)

    def _build(self) -> StepRunner:
        s = self.session
        seed_all(s.settings.seed)
        model = s.workload.build_model(s.ctx)
        optim = s.settings.optim
        return StepRunner(
            s.workload, model, s.train, s.ctx, optim.lr, optim.weight_decay, s.settings.mode is Mode.accuracy
        )

    def runner(self, stepping: bool = True) -> StepRunner:
        """The step runner, its model the seed's when `stepping` (else only not spoilt)."""
        if self._spoilt or (stepping and self._runner.moved):
            self._runner = None  # the old model is freed before the new one is built
            release(self.session.ctx.device)
            self._runner, self._spoilt = self._build(), False
        return self._runner

    def step(self, shape: Shape, settings: PointSettings) -> PointResult:
        """One point's or probe step's steps, agreed on every rank. No rank starts them before rank 0
        has marked the point or N in flight: a rank that failed building the batch raced the mark,
        and the point it failed at went unrecorded."""
        s = self.session
        dist.barrier(group=s.control)
        try:
            result = measure_point(self.runner(), shape, s.ctx, s.control, settings)
        except OutOfMemoryAlone as err:
            # Only this rank knows the job ends for out of memory (its peers wait in a collective, rank 0
            # among them, writing nothing): record the point or N in flight as not fitting first.
            InFlight(s.folder).close_oom(f"rank {s.ctx.rank}: {err}")
            raise OutOfMemoryAlone(f"N={shape.n_tokens} does not fit: {err}") from err
        except KernelFault as err:
            # The same for a kernel fault: this rank alone may know of it, and on a GPU its context is
            # dead. Only once it stands recorded does the rank leave as for a finding (the ranks restart
            # and never try this N or above); else the error ends the run.
            if not InFlight(s.folder).close_kernel(shape.n_tokens, f"rank {s.ctx.rank}: {err}"):
                raise err.__cause__ or err from None
            raise KernelFault(f"N={shape.n_tokens}: {err}") from err
        self._spoilt = result.status == "oom"
        return result

    def count(self, shape: Shape) -> Counted | None:
        """The step's model FLOPs at this shape over all ranks (measure.count_flops), counted on fake
        tensors once per shape."""
        s = self.session
        if not s.settings.measure.count_flops:
            return None
        if shape not in self._counted:
            start, model, seed = time.perf_counter(), self.runner(stepping=False).model, s.settings.seed
            with cap_lifted(s.ctx.device):
                counted = count_over_ranks(s.workload, model, shape, s.ctx, s.train, seed, s.control)
            self._counted[shape] = counted
            self._spoilt = s.train  # a training trace leaves fake gradients
            if s.lead and counted.error:
                LOG.warning("N=%d: FLOPs not counted (%s)", shape.n_tokens, counted.error)
            elif s.lead:
                LOG.info("N=%d: %.6g model TFLOP per step, counted in %.2f s (fake tensors, untimed)",
                         shape.n_tokens, counted.flops / 1e12, time.perf_counter() - start)  # fmt: skip
        return self._counted[shape]
