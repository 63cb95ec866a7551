"""The warm-up of the collectives before the cap (cpbench/distributed/warmup.py) on four real gloo ranks
of a 2 x 2 grid: every kind of the CP layer's collectives on every group a step uses, ring steps to
every neighbour both ways, at sizes up to the largest the budget leaves room for, seen by the comm
ledger's own hook. On CPU nothing is allocated lazily (gloo connects a group's pairs when it is
made); on a GPU the same calls make NCCL connect (docs/measurement.md)."""

from __future__ import annotations

import queue
from collections import Counter, defaultdict

import pytest
import torch
import torch.distributed as dist
from support.processes import rank_processes

from cpbench.core import Topology
from cpbench.distributed.comm import LEDGER
from cpbench.distributed.warmup import KINDS, LABEL, SMALLEST, message_cap, warm_collectives
from cpbench.runtime.rank import joined_context

BUDGET = 2**18  # bytes: the largest call's buffers
WORLD = 4


def _warm_on_rank(rank: int, store: str, out) -> None:  # noqa: ANN001
    dist.init_process_group("gloo", init_method=store, rank=rank, world_size=WORLD)
    try:
        ctx = joined_context(Topology.from_config("2d", WORLD, None), torch.device("cpu"), torch.float32, 0)
        seen = []
        LEDGER.observer = lambda nbytes, ranks: seen.append((LEDGER.label, nbytes, ranks))
        done = warm_collectives(ctx, BUDGET, dtypes=(torch.float32, torch.float64))
        LEDGER.observer = None
        out.put((rank, ctx.coords, done, seen))
    finally:
        dist.destroy_process_group()


def test_the_warm_up_runs_every_collective_on_every_group_and_peer_up_to_the_largest_message(tmp_path):
    ranks = rank_processes()
    out = ranks.Queue()
    store = f"file://{tmp_path / 'store'}"
    procs = [ranks.Process(target=_warm_on_rank, args=(r, store, out)) for r in range(WORLD)]
    for p in procs:
        p.start()
    try:
        got = {rank: rest for rank, *rest in (out.get(timeout=120) for _ in procs)}
    except queue.Empty:
        pytest.fail("the four ranks did not report within 120 s (a ring step waiting for its peer?)")
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    table = {coords: rank for rank, (coords, _, _) in got.items()}  # (row block, col block) -> rank
    for me, ((r, c), done, seen) in got.items():
        row, col = tuple(sorted(table[r, j] for j in range(2))), tuple(sorted(table[i, c] for i in range(2)))
        # What the ledger saw is what the warm-up says it ran, call for call, and the bytes it counts sent
        # are the recorded message's (a ring step sends it; an all-gather sends it to each other rank).
        assert [(f"{LABEL}.{c.kind}", tuple(sorted(set(c.ranks)))) for c in done.calls] == [
            (label, ranks) for label, _, ranks in seen
        ]
        for call, (_, sent, _) in zip(done.calls, seen, strict=True):
            if call.kind in ("send_recv", "all_gather"):
                assert sent == call.message_bytes * (len(call.ranks) - 1), call
        spans = defaultdict(set)
        for call in done.calls:
            spans[call.kind].add(tuple(sorted(call.ranks)))
        for kind in KINDS:
            if kind != "send_recv":  # every collective on the world, my row group and my column group
                assert spans[kind] == {(0, 1, 2, 3), row, col}, kind
        # Ring steps along my row and my column: my one neighbour in each (a 2 x 2 grid), both ways.
        assert spans["send_recv"] == {tuple(sorted((me, n))) for n in (*row, *col) if n != me}
        # Rooted collectives once from every root of the group, at each size.
        rooted = Counter((c.kind, c.ranks, c.message_bytes, c.dtype) for c in done.calls
                         if c.kind in ("broadcast", "reduce"))  # fmt: skip
        assert rooted and all(count == len(ranks) for (_, ranks, _, _), count in rooted.items())
        # Sizes: from 4 KiB up to the largest whose buffers fit the budget, per group size; reductions
        # in each dtype asked for, data movement in the run's.
        for kind in KINDS:
            calls = [c for c in done.calls if c.kind == kind]
            assert min(c.message_bytes for c in calls) <= SMALLEST
            for size in {len(c.ranks) for c in calls}:
                group = [c for c in calls if len(c.ranks) == size]
                top = message_cap(kind, 2 if kind == "send_recv" else size, BUDGET)
                assert top - 8 * size <= max(c.message_bytes for c in group) <= top, (kind, size)
            dtypes = {c.dtype for c in calls}
            assert dtypes == ({"float32", "float64"} if KINDS[kind][1] else {"float32"}), kind
