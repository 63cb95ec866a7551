"""Every collective and every peer a step of the CP layer uses, run once before the memory cap is taken,
at message sizes from a few KiB up to the largest a point can send.

Why: NCCL (2.22 up) connects lazily. With `NCCL_RUNTIME_CONNECT` at its default 1 it "dynamically
connect[s] peers during runtime (e.g., calling ncclAllreduce()) instead of init stage" (NCCL's
environment docs), and point-to-point connections were always made at a peer's first send or receive
("the lazy initialization of connections for send/receive calls", `NCCL_COMM_BLOCKING` there). Each
connection allocates NCCL's buffers ("the buffer used by NCCL when communicating data between pairs of
GPUs", `NCCL_BUFFSIZE`, 4 MiB by default, for each connection), and NVLink SHARP allocates its own at
NVLS's first use (`NCCL_NVLS_ENABLE=0`: "No NVLink SHARP resources will be allocated"). None of it goes
through torch's caching allocator, so a cap measured before it is too large by that much, and the first
collective of each kind at the edge of memory fails inside NCCL, where its watchdog ends the process.

Which algorithm, and so which connections and buffers, NCCL takes depends on the message size (its
tuning picks an algorithm and protocol per call; `NCCL_ALGO` lists Ring, Tree, CollnetChain,
CollnetDirect, NVLS, NVLSTree, PAT): the warm-up climbs a ladder of sizes, a factor FACTOR apart, from
SMALLEST up to the largest message whose buffers fit what the caller allows, which is bounded by the
memory a point may use (a point cannot send a message it cannot hold). It calls the CP layer's own
functions (`comm.py`), so that torch takes the same paths as a step: the same process groups (torch
makes a communicator per group), `batch_isend_irecv` for ring steps (ProcessGroupNCCL's pointToPoint
runs a batch on the group's communicator, a lone send on a two-rank one of its own),
`all_to_all_single` (NCCL point-to-point to every peer of the group). The ledger counts these calls
like any other; a point's figures start from its own reset.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist

from cpbench.core import RankContext
from cpbench.distributed.comm import (
    _reduce,
    all_gather,
    all_reduce_max,
    all_reduce_sum,
    all_to_all,
    all_to_all_v,
    broadcast,
    op_label,
    reduce_scatter,
    send_recv,
)
from cpbench.distributed.grid import Grid

SMALLEST = 4096  # bytes: below NCCL's LL threshold for point-to-point (NCCL_P2P_LL_THRESHOLD, 16 KiB)
FACTOR = 4
LABEL = "warm-up"  # the ledger's op label prefix: "warm-up.all_gather", ...

# Each kind: (the buffers one call of the CP layer holds, in messages, for a group of p ranks; whether it
# reduces). A message is what each rank puts in: all_reduce works on a copy of it, all_gather returns p
# of them, reduce_scatter one p-th, all_to_all receives one and concatenates what it received into
# another, a ring step receives one, broadcast copies it at the root (elsewhere receives it), reduce
# reduces in place.
KINDS: dict[str, tuple[Callable[[int], float], bool]] = {
    "all_reduce": (lambda p: 2, True),
    "all_reduce_max": (lambda p: 2, True),
    "reduce_scatter": (lambda p: 1 + 1 / p, True),
    "reduce": (lambda p: 1, True),
    "all_gather": (lambda p: 1 + p, False),
    "all_to_all": (lambda p: 3, False),
    "all_to_all_v": (lambda p: 3, False),
    "broadcast": (lambda p: 2, False),
    "send_recv": (lambda p: 2, False),
}


def message_cap(kind: str, group_size: int, buffers_bytes: int) -> int:
    """The largest message of `kind` over `group_size` ranks whose buffers stay within `buffers_bytes`."""
    per_message, _ = KINDS[kind]
    return int(buffers_bytes // per_message(group_size))


def ladder(top: int, smallest: int = SMALLEST, factor: int = FACTOR) -> list[int]:
    """Message sizes from `smallest` up by `factor`, then `top` itself: every size NCCL's choice can
    turn on lies within a factor of one of them, and the largest is the largest a point can send."""
    sizes, size = [], smallest
    while size < top:
        sizes.append(size)
        size *= factor
    return [*sizes, top] if top > 0 else []


@dataclass(frozen=True)
class WarmCall:
    """One collective the warm-up ran: its kind, the global ranks it spanned (a ring step: this rank
    and the peer it sent to), the message in bytes and its dtype."""

    kind: str
    ranks: tuple[int, ...]
    message_bytes: int
    dtype: str


@dataclass(frozen=True)
class WarmUp:
    calls: tuple[WarmCall, ...] = ()

    @property
    def largest_bytes(self) -> int:
        return max((c.message_bytes for c in self.calls), default=0)


def peer_groups(grid: Grid) -> list[dist.ProcessGroup]:
    """The groups a step's collectives run on, each once: the world (the gradient sum, the transpose's
    exchange), the row group and the column group (the mesh's dimensions). A group object is its own
    NCCL communicator even where another spans the same ranks."""
    groups: list[dist.ProcessGroup] = []
    for group in (grid.world, grid.row_group, grid.col_group):
        if group is not None and dist.get_world_size(group) > 1 and all(group is not g for g in groups):
            groups.append(group)
    return groups


def ring_steps(grid: Grid) -> list[tuple[int, int]]:
    """(dst, src) of every ring step a step may take (`grid.ring_pass` along the row group, and along
    the column group on the transposed grid), each way round: a forward step's backward sends back
    where it received from. Every rank of a ring lists them in the same order, so each send meets its
    receive."""
    steps: list[tuple[int, int]] = []
    for g in (grid, grid.transposed()):
        if g.cols > 1:
            left, right = g.ranks[g.r][(g.c - 1) % g.cols], g.ranks[g.r][(g.c + 1) % g.cols]
            steps += [s for s in ((left, right), (right, left)) if s not in steps]
    return steps


def warm_collectives(ctx: RankContext, buffers_bytes: int, dtypes: tuple[torch.dtype, ...] = ()) -> WarmUp:
    """Run every kind of the CP layer's collectives on every group and ring peer of this rank, at every
    size of the ladder up to the largest whose buffers fit `buffers_bytes` (the same on every rank: the
    calls must match). Reductions run in each of `dtypes` (default: the run's dtype and float32, the
    parameters' and gradients' dtype): NCCL's algorithms for a reduction can differ by dtype (NVLink
    SHARP reduces some types and not others).
    Data movement runs in the run's dtype. A GPU is synchronised after each call, so that no more than
    one call's buffers are held at a time."""
    grid = Grid.from_context(ctx)
    reductions = dtypes or tuple(dict.fromkeys((ctx.dtype, torch.float32)))
    calls: list[WarmCall] = []
    with torch.no_grad():
        for group in peer_groups(grid):
            ranks = tuple(dist.get_process_group_ranks(group))
            for kind, (_, reduces) in KINDS.items():
                if kind == "send_recv":
                    continue
                for dtype in reductions if reduces else (ctx.dtype,):
                    for size in ladder(message_cap(kind, len(ranks), buffers_bytes)):
                        calls += _run(kind, group, ranks, size, dtype, ctx.device)
        for dst, src in ring_steps(grid):
            for size in ladder(message_cap("send_recv", 2, buffers_bytes)):
                calls += _run("send_recv", (dst, src), (dist.get_rank(), dst), size, ctx.dtype, ctx.device)
    return WarmUp(tuple(calls))


def _run(kind: str, group, ranks: tuple[int, ...], size: int, dtype: torch.dtype,
         device: torch.device) -> Iterator[WarmCall]:  # fmt: skip
    """One collective (one per root, for the rooted ones) whose message is about `size` bytes."""
    p, me = len(ranks), dist.get_rank()
    n = max(p, size // torch.empty((), dtype=dtype).element_size() // p * p)  # reduce_scatter splits it
    for root in ranks if kind in ("broadcast", "reduce") else (None,):
        with op_label(f"{LABEL}.{kind}"):
            sent = _collective(kind, group, ranks, me, root, torch.zeros(n, dtype=dtype, device=device))
            if device.type == "cuda":
                torch.cuda.synchronize(device)
        yield WarmCall(kind, ranks, sent.numel() * sent.element_size(), str(dtype).removeprefix("torch."))


def _collective(kind: str, group, ranks: tuple[int, ...], me: int, root: int | None,
                x: torch.Tensor) -> torch.Tensor:  # fmt: skip
    """Run `kind` through the CP layer with `x` as this rank's message; what it sent."""
    if kind == "all_reduce":
        all_reduce_sum(x, group)
    elif kind == "all_reduce_max":
        all_reduce_max(x, group)
    elif kind == "reduce_scatter":
        reduce_scatter(x, group)
    elif kind == "reduce":
        _reduce(x, root, group, f"{LABEL}.{kind}")
    elif kind == "all_gather":
        all_gather(x, group)
    elif kind == "all_to_all":
        all_to_all(x, group, 0, 0)
    elif kind == "all_to_all_v":
        # Uneven pieces, as a transpose sends them: two parts to itself, one to each other rank (what
        # each rank receives from each: the same rule). Piece i goes to group rank i.
        p, mine = len(ranks), dist.get_group_rank(group, me)
        part = max(1, x.numel() // (p + 1))
        sizes = [part * (2 if i == mine else 1) for i in range(p)]
        x = x[: sum(sizes)] if sum(sizes) <= x.numel() else x.new_zeros(sum(sizes))
        all_to_all_v(list(x.split(sizes)), [(s,) for s in sizes], group)
    elif kind == "broadcast":
        broadcast(x, root, group)
    elif kind == "send_recv":
        dst, src = group
        send_recv(x, dst, src)
    else:
        raise ValueError(f"no such collective to warm: {kind}")
    return x
