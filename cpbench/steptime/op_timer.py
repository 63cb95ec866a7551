"""Each aten op of a real step timed on its own, with its work counted as the fake-tensor count
counts it (`measure.flops.op_work`): what the calibration fits each op's cost to. A step's time
cannot tell its ops apart (a batched matmul's FLOPs and the softmax bytes of its logits both grow
as N^3), its ops one by one can.

On a GPU each op is synchronised before and after, so that its time is its kernels' and launch's.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from cpbench.measure.flops import op_work


@dataclass
class OpTimes:
    """Per aten op: the times it ran, its FLOPs or bytes, and its seconds."""

    runs: Counter[str] = field(default_factory=Counter)
    work: Counter[str] = field(default_factory=Counter)
    seconds: Counter[str] = field(default_factory=Counter)
    flop_ops: set[str] = field(default_factory=set)

    @property
    def step_s(self) -> float:
        return sum(self.seconds.values())

    def scaled_to(self, seconds: float) -> OpTimes:
        """These times in their proportions, summing to `seconds`."""
        factor = seconds / self.step_s
        scaled = Counter({op: s * factor for op, s in self.seconds.items()})
        return OpTimes(self.runs.copy(), self.work.copy(), scaled, set(self.flop_ops))


class OpTimer(TorchDispatchMode):
    """Times every aten op that runs while it is active, into `times`."""

    def __init__(self, device: torch.device) -> None:
        super().__init__()
        self.times = OpTimes()
        self._sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        kwargs = kwargs or {}
        self._sync()
        start = time.perf_counter()
        out = func(*args, **kwargs)
        self._sync()
        seconds = time.perf_counter() - start
        work = op_work(func, args, kwargs, out)
        if work is not None:
            op, flops, nbytes = work
            self.times.runs[op] += 1
            self.times.work[op] += flops or nbytes
            self.times.seconds[op] += seconds
            if flops:
                self.times.flop_ops.add(op)
        return out
