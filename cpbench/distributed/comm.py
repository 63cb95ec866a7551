"""Every collective a CP workload issues goes through here: autograd-correct wrappers that also
account, per op label, the bytes this rank sends and the time spent waiting on the collective.

Bytes sent per rank follow the ring algorithms' volumes for a group of P ranks and a tensor of
B bytes: all_reduce 2(P-1)/P * B, all_gather (P-1) * B_in, reduce_scatter (P-1)/P * B_in,
all_to_all (P-1)/P * B. A group of one rank (None) is a no-op and costs nothing.

Point-to-point and rooted ops count what leaves this rank: send_recv the tensor it sends,
all_to_all_v the pieces addressed to other ranks, broadcast (P-1) * B at the root and 0 elsewhere
(a flat tree: the root feeds every peer), reduce B at every non-root and 0 at the root.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from cpbench.torch_compat import all_gather_single, reduce_scatter_single

UNLABELLED = "other"  # the label of work outside any op_label


@dataclass
class CommLedger:
    """Per-rank totals since the last reset, keyed by op label."""

    bytes_sent: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    seconds: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    calls: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    label: str = UNLABELLED
    issued: int = 0  # collectives issued by this process, never reset: peers compare it after a failure
    # GPU collectives not yet read: (label, start event, end event)
    pending: list[tuple[str, torch.cuda.Event, torch.cuda.Event]] = field(default_factory=list)
    # Told of each collective, with its bytes sent and the global ranks it spans (sorted), while set:
    # the work count of the time model (measure/flops.py) prices each by the links it crosses.
    observer: Callable[[int, tuple[int, ...]], None] | None = None

    def reset(self) -> None:
        self.bytes_sent.clear()
        self.seconds.clear()
        self.calls.clear()
        self.pending.clear()

    def settle(self) -> None:
        """Read the pending GPU collectives' times, waiting for each one's end event."""
        for label, start, end in self.pending:
            end.synchronize()
            self.seconds[label] += start.elapsed_time(end) / 1e3
        self.pending.clear()

    @property
    def total_bytes(self) -> int:
        return sum(self.bytes_sent.values())

    @property
    def total_seconds(self) -> float:
        self.settle()
        return sum(self.seconds.values())

    def table(self) -> list[dict[str, float | int | str]]:
        """One row per op label (a backward's `.bwd` label folded into its op): calls, bytes sent and
        seconds, forward and backward apart; the per-op communication table of a report."""
        self.settle()
        rows: dict[str, dict[str, float | int | str]] = {}
        for label in sorted(set(self.bytes_sent) | set(self.seconds)):
            op, bwd = (label[:-4], True) if label.endswith(".bwd") else (label, False)
            row = rows.setdefault(op, {"op": op, "calls": 0, "fwd_bytes": 0, "bwd_bytes": 0, "seconds": 0.0})
            row["calls"] += self.calls.get(label, 0)
            row["bwd_bytes" if bwd else "fwd_bytes"] += self.bytes_sent.get(label, 0)
            row["seconds"] += self.seconds.get(label, 0.0)
        return list(rows.values())


LEDGER = CommLedger()


@dataclass
class OpClock:
    """Wall time per op label, exclusive of the labels nested inside it: where a forward's time
    goes, compute and communication together. Off unless a benchmark turns it on, because each
    label boundary then synchronizes the GPU."""

    enabled: bool = False
    seconds: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    nested: list[float] = field(default_factory=list)  # time of the labels inside each open one


CLOCK = OpClock()


def _sync() -> None:
    if torch.cuda.is_initialized():  # never a CUDA query of its own: a launching process must not start CUDA
        torch.cuda.synchronize()


@contextmanager
def op_label(name: str) -> Iterator[None]:
    """Attribute the collectives issued inside (forward and the backward they create) to `name`,
    and with the clock on, the wall time spent inside too."""
    previous, LEDGER.label = LEDGER.label, name
    timed = CLOCK.enabled
    if timed:
        _sync()
        CLOCK.nested.append(0.0)
        start = time.perf_counter()
    try:
        yield
    finally:
        LEDGER.label = previous
        if timed:
            _sync()
            elapsed = time.perf_counter() - start
            CLOCK.seconds[name] += elapsed - CLOCK.nested.pop()
            if CLOCK.nested:
                CLOCK.nested[-1] += elapsed


def _account(label: str, nbytes: float, run, device: torch.device, peers) -> None:
    """`peers`: the group the collective runs on, or the global ranks it joins (point to point).
    On a GPU, CUDA events around the collective on the current stream, read once the step is over:
    no synchronisation inside the step, so compute and communication overlap as in a real run. On CPU
    (gloo) the collective returns when it is done: the wall clock."""
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        LEDGER.pending.append((label, start, end))
    else:
        start = time.perf_counter()
        run()
        LEDGER.seconds[label] += time.perf_counter() - start
    LEDGER.bytes_sent[label] += int(nbytes)
    LEDGER.calls[label] += 1
    LEDGER.issued += 1
    if LEDGER.observer is not None:
        ranks = peers if isinstance(peers, tuple) else dist.get_process_group_ranks(peers)
        LEDGER.observer(int(nbytes), tuple(sorted(set(ranks))))


def _size(group: dist.ProcessGroup | None) -> int:
    return 1 if group is None else dist.get_world_size(group)


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _all_reduce(x: torch.Tensor, group, label: str) -> torch.Tensor:
    p = _size(group)
    out = x.contiguous().clone()
    _account(
        label, 2 * (p - 1) / p * _nbytes(out), lambda: dist.all_reduce(out, group=group), out.device, group
    )
    return out


def _all_gather(x: torch.Tensor, group, label: str) -> torch.Tensor:
    """Concatenate along dim 0 in group-rank order."""
    p = _size(group)
    x = x.contiguous()
    out = x.new_empty((p * x.shape[0], *x.shape[1:]))
    _account(label, (p - 1) * _nbytes(x), lambda: all_gather_single(out, x, group=group), x.device, group)
    return out


def _reduce_scatter(x: torch.Tensor, group, label: str) -> torch.Tensor:
    """Sum over the group, then keep this rank's slice of dim 0."""
    p = _size(group)
    x = x.contiguous()
    out = x.new_empty((x.shape[0] // p, *x.shape[1:]))
    _account(
        label, (p - 1) / p * _nbytes(x), lambda: reduce_scatter_single(out, x, group=group), x.device, group
    )
    return out


def _all_to_all(x: torch.Tensor, group, label: str) -> torch.Tensor:
    """Chunk i of dim 0 goes to group rank i; received chunks are stacked along dim 0."""
    p = _size(group)
    x = x.contiguous()
    out = torch.empty_like(x)
    _account(
        label, (p - 1) / p * _nbytes(x), lambda: dist.all_to_all_single(out, x, group=group), x.device, group
    )
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


# --- rooted, point-to-point and uneven collectives -------------------------------------------------------
# Their ranks are global ranks (the default group's numbering), which is what the mesh tables hold.


def _broadcast(buf: torch.Tensor, src: int, group, label: str) -> None:
    p = _size(group)
    nbytes = (p - 1) * _nbytes(buf) if dist.get_rank() == src else 0
    _account(label, nbytes, lambda: dist.broadcast(buf, src=src, group=group), buf.device, group)


def _reduce(buf: torch.Tensor, dst: int, group, label: str) -> None:
    nbytes = 0 if dist.get_rank() == dst else _nbytes(buf)
    _account(label, nbytes, lambda: dist.reduce(buf, dst=dst, group=group), buf.device, group)


class _Broadcast(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, src, group, label):
        ctx.src, ctx.group, ctx.label = src, group, label
        root = dist.get_rank() == src
        buf = x.contiguous().clone() if root else torch.empty_like(x, memory_format=torch.contiguous_format)
        _broadcast(buf, src, group, label)
        return buf

    @staticmethod
    def backward(ctx, grad):
        # Every receiver's gradient flows back to the one tensor that was sent: a sum at the root.
        buf = grad.contiguous().clone()
        _reduce(buf, ctx.src, ctx.group, ctx.label + ".bwd")
        return (buf if dist.get_rank() == ctx.src else None), None, None, None


def broadcast(x: torch.Tensor, src: int, group: dist.ProcessGroup | None) -> torch.Tensor:
    """The root's `x` on every rank of the group; the backward sums the gradients at the root.

    Non-roots pass a tensor of the same shape and dtype (its values are ignored, it gets no
    gradient): every rank then holds an autograd node, so backward reduces run on all of them.
    """
    if group is None:
        return x
    return _Broadcast.apply(x, src, group, LEDGER.label)


def _send_recv(x: torch.Tensor, dst: int, src: int, label: str) -> torch.Tensor:
    x = x.contiguous()
    out = torch.empty_like(x)

    def run() -> None:
        # One grouped operation: NCCL runs a lone isend and irecv as two operations, and two peers
        # that both send first to each other can deadlock (NVIDIA/nccl#479); grouped, they cannot.
        ops = [dist.P2POp(dist.isend, x, dst), dist.P2POp(dist.irecv, out, src)]
        for request in dist.batch_isend_irecv(ops):
            request.wait()

    _account(label, _nbytes(x), run, x.device, (dist.get_rank(), dst))  # what it sends goes to dst
    return out


class _SendRecv(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dst, src, label):
        ctx.dst, ctx.src, ctx.label = dst, src, label
        return _send_recv(x, dst, src, label)

    @staticmethod
    def backward(ctx, grad):
        # The ring step in reverse: the gradient goes back to where the tensor came from.
        return _send_recv(grad, ctx.src, ctx.dst, ctx.label + ".bwd"), None, None, None


def send_recv(x: torch.Tensor, dst: int, src: int) -> torch.Tensor:
    """One ring step: send `x` to global rank `dst`, return the same-shaped tensor `src` sends."""
    if dst == src == dist.get_rank():
        return x
    return _SendRecv.apply(x, dst, src, LEDGER.label)


def _all_to_all_v(flat: torch.Tensor, send: list[int], recv: list[int], group, label: str) -> torch.Tensor:
    out = flat.new_empty(sum(recv))
    me = dist.get_rank(group)
    nbytes = (sum(send) - send[me]) * flat.element_size()
    _account(
        label, nbytes, lambda: dist.all_to_all_single(out, flat, recv, send, group=group), flat.device, group
    )
    return out


class _AllToAllV(torch.autograd.Function):
    @staticmethod
    def forward(ctx, flat, send, recv, group, label):
        ctx.send, ctx.recv, ctx.group, ctx.label = send, recv, group, label
        return _all_to_all_v(flat.contiguous(), send, recv, group, label)

    @staticmethod
    def backward(ctx, grad):
        # The inverse exchange: what arrived from rank i goes back to rank i.
        back = _all_to_all_v(grad.contiguous(), ctx.recv, ctx.send, ctx.group, ctx.label + ".bwd")
        return back, None, None, None, None


def all_to_all_v(
    pieces: list[torch.Tensor], recv_shapes: list[tuple[int, ...]], group: dist.ProcessGroup | None
) -> list[torch.Tensor]:
    """Send `pieces[i]` to group rank i (any shapes, empty allowed) and return what each rank sent
    here, shaped by `recv_shapes[i]`."""
    if group is None:
        return list(pieces)
    send = [p.numel() for p in pieces]
    recv = [math.prod(shape) for shape in recv_shapes]
    flat = torch.cat([p.reshape(-1) for p in pieces])
    out = _AllToAllV.apply(flat, send, recv, group, LEDGER.label)
    return [chunk.view(shape) for chunk, shape in zip(out.split(recv), recv_shapes, strict=True)]


def all_reduce_max(x: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
    """Elementwise max over the group, detached: used only as a softmax stabiliser, which shifts
    every logit equally and so carries no gradient."""
    out = x.detach().contiguous().clone()
    if group is None:
        return out
    p = _size(group)
    _account(LEDGER.label, 2 * (p - 1) / p * _nbytes(out),
             lambda: dist.all_reduce(out, op=dist.ReduceOp.MAX, group=group), out.device, group)  # fmt: skip
    return out
