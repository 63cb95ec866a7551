"""Fault injection for the never-hang guarantees: one chosen rank runs out of memory (a real
failing allocation) or is killed, at N_tokens >= a threshold, either while its batch is built
(before the step's first collective) or inside the step between two collectives."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from cpbench.distributed.comm import LEDGER


def _strike(kind: str, device: torch.device) -> None:
    if kind == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    torch.empty(2**62, dtype=torch.uint8, device=device)  # no allocator can serve this: a real OOM


class Fault:
    def __init__(self, rank: int | None, at_n: int | None, where: str, kind: str):
        self.rank, self.at_n, self.where, self.kind = rank, at_n, where, kind

    @staticmethod
    def off() -> Fault:
        return Fault(None, None, "step", "oom")

    def armed(self, rank: int, n_tokens: int) -> bool:
        return self.rank == rank and self.at_n is not None and n_tokens >= self.at_n

    def before_batch(self, rank: int, n_tokens: int, device: torch.device) -> None:
        if self.where == "batch" and self.armed(rank, n_tokens):
            _strike(self.kind, device)

    @contextmanager
    def in_step(self, rank: int, n_tokens: int, device: torch.device) -> Iterator[None]:
        """Strike in the first submodule call that follows the step's first collective."""
        if self.where != "step" or not self.armed(rank, n_tokens):
            yield
            return
        seen: list[int] = []  # the collective count at the step's first submodule call

        def hook(module, args):
            calls = sum(LEDGER.calls.values())
            if not seen:
                seen.append(calls)
            elif calls > seen[0]:
                _strike(self.kind, device)

        handle = torch.nn.modules.module.register_module_forward_pre_hook(hook)
        try:
            yield
        finally:
            handle.remove()
