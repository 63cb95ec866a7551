"""Every collective a CP workload issues goes through here: autograd-correct wrappers that also
account, per op label, the bytes this rank sends and the time spent waiting on the collective.

Bytes sent per rank follow the ring algorithms' volumes for a group of P ranks and a tensor of
B bytes: all_reduce 2(P-1)/P * B, all_gather (P-1) * B_in, reduce_scatter (P-1)/P * B_in,
all_to_all (P-1)/P * B. A group of one rank (None) is a no-op and costs nothing.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
import torch.distributed as dist


@dataclass
class CommLedger:
    """Per-rank totals since the last reset, keyed by op label."""

    bytes_sent: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    seconds: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    calls: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    label: str = "other"

    def reset(self) -> None:
        self.bytes_sent.clear()
        self.seconds.clear()
        self.calls.clear()

    @property
    def total_bytes(self) -> int:
        return sum(self.bytes_sent.values())

    @property
    def total_seconds(self) -> float:
        return sum(self.seconds.values())


LEDGER = CommLedger()


@contextmanager
def op_label(name: str) -> Iterator[None]:
    """Attribute the collectives issued inside (forward and the backward they create) to `name`."""
    previous, LEDGER.label = LEDGER.label, name
    try:
        yield
    finally:
        LEDGER.label = previous


def _account(label: str, nbytes: float, run) -> None:
    on_cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
    if on_cuda:
        torch.cuda.synchronize()
    start = time.perf_counter()
    run()
    if on_cuda:
        torch.cuda.synchronize()
    LEDGER.seconds[label] += time.perf_counter() - start
    LEDGER.bytes_sent[label] += int(nbytes)
    LEDGER.calls[label] += 1


def _size(group: dist.ProcessGroup | None) -> int:
    return 1 if group is None else dist.get_world_size(group)


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _all_reduce(x: torch.Tensor, group, label: str) -> torch.Tensor:
    p = _size(group)
    out = x.contiguous().clone()
    _account(label, 2 * (p - 1) / p * _nbytes(out), lambda: dist.all_reduce(out, group=group))
    return out


def _all_gather(x: torch.Tensor, group, label: str) -> torch.Tensor:
    """Concatenate along dim 0 in group-rank order."""
    p = _size(group)
    x = x.contiguous()
    out = x.new_empty((p * x.shape[0], *x.shape[1:]))
    _account(label, (p - 1) * _nbytes(x), lambda: dist.all_gather_single(out, x, group=group))
    return out


def _reduce_scatter(x: torch.Tensor, group, label: str) -> torch.Tensor:
    """Sum over the group, then keep this rank's slice of dim 0."""
    p = _size(group)
    x = x.contiguous()
    out = x.new_empty((x.shape[0] // p, *x.shape[1:]))
    _account(label, (p - 1) / p * _nbytes(x), lambda: dist.reduce_scatter_single(out, x, group=group))
    return out


def _all_to_all(x: torch.Tensor, group, label: str) -> torch.Tensor:
    """Chunk i of dim 0 goes to group rank i; received chunks are stacked along dim 0."""
    p = _size(group)
    x = x.contiguous()
    out = torch.empty_like(x)
    _account(label, (p - 1) / p * _nbytes(x), lambda: dist.all_to_all_single(out, x, group=group))
    return out


class _AllReduceSum(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group, label):
        ctx.group, ctx.label = group, label
        return _all_reduce(x, group, label)

    @staticmethod
    def backward(ctx, grad):
        return _all_reduce(grad, ctx.group, ctx.label + ".bwd"), None, None


class _AllGather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group, label):
        ctx.group, ctx.label = group, label
        return _all_gather(x, group, label)

    @staticmethod
    def backward(ctx, grad):
        return _reduce_scatter(grad, ctx.group, ctx.label + ".bwd"), None, None


class _ReduceScatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group, label):
        ctx.group, ctx.label = group, label
        return _reduce_scatter(x, group, label)

    @staticmethod
    def backward(ctx, grad):
        return _all_gather(grad, ctx.group, ctx.label + ".bwd"), None, None


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group, label):
        ctx.group, ctx.label = group, label
        return _all_to_all(x, group, label)

    @staticmethod
    def backward(ctx, grad):
        # Exchanging chunk i with rank i is its own inverse.
        return _all_to_all(grad, ctx.group, ctx.label + ".bwd"), None, None


def all_reduce_sum(x: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
    """Sum over the group; every rank gets the result (its gradient is summed back likewise)."""
    return x if group is None else _AllReduceSum.apply(x, group, LEDGER.label)


def all_gather(x: torch.Tensor, group: dist.ProcessGroup | None, dim: int = 0) -> torch.Tensor:
    """Concatenate the group's shards along `dim`; the backward is a reduce-scatter."""
    if group is None:
        return x
    out = _AllGather.apply(x.movedim(dim, 0), group, LEDGER.label)
    return out.movedim(0, dim)


def reduce_scatter(x: torch.Tensor, group: dist.ProcessGroup | None, dim: int = 0) -> torch.Tensor:
    """Sum over the group and keep this rank's slice of `dim`; the backward is an all-gather."""
    if group is None:
        return x
    return _ReduceScatter.apply(x.movedim(dim, 0), group, LEDGER.label).movedim(0, dim)


def all_to_all(
    x: torch.Tensor, group: dist.ProcessGroup | None, scatter_dim: int, gather_dim: int
) -> torch.Tensor:
    """Split `scatter_dim` over the group and concatenate what arrives along `gather_dim`
    (row slabs to column slabs and back)."""
    if group is None:
        return x
    p = dist.get_world_size(group)
    chunks = x.movedim(scatter_dim, 0)
    chunks = chunks.reshape(p, chunks.shape[0] // p, *chunks.shape[1:])
    out = _AllToAll.apply(chunks, group, LEDGER.label)  # [p, ...]: piece from rank i at index i
    pieces = [piece.movedim(0, scatter_dim) for piece in out.unbind(0)]
    return torch.cat(pieces, dim=gather_dim)
