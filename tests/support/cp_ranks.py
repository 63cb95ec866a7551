"""Real CPU/gloo ranks on the project's mesh, spawned from a test: `spawn` runs a target on `world`
processes forked from the test worker's server (a FileStore joins them), each rank builds its
`rank_context` and writes its failures with `report`; `one_rank` is the world-of-one reference every CP
layout is compared with. Ranks report failures as strings (never raising between collectives, so one
failed comparison cannot hang its peers); the whole spawn is bounded by a timeout. A target must be a
module-level function of an importable module (a test module is one): the processes unpickle it by
module and name."""

from __future__ import annotations

import json
import os
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from cpbench.core import RankContext, Topology
from cpbench.runtime.mesh import build_mesh
from support.processes import rank_processes


def spawn(target, world: int, *args, timeout: float = 240) -> list[list[str]]:
    """Run `target(rank, world, tmp, *args)` on `world` fresh processes (a FileStore in `tmp` joins
    them); return the failure messages each rank wrote to tmp/rank<r>.json."""
    context = rank_processes()
    with tempfile.TemporaryDirectory() as tmp:
        procs = [context.Process(target=target, args=(rank, world, tmp, *args)) for rank in range(world)]
        for proc in procs:
            proc.start()
        deadline = time.monotonic() + timeout
        for proc in procs:
            proc.join(max(0.0, deadline - time.monotonic()))
        hung = [proc for proc in procs if proc.is_alive()]
        for proc in hung:
            proc.kill()
            proc.join()
        reports = []
        for rank in range(world):
            path = Path(tmp) / f"rank{rank}.json"
            reports.append(json.loads(path.read_text()) if path.exists() else [f"rank {rank}: no report"])
    if hung:
        pytest.fail(f"{len(hung)} rank(s) still running after {timeout}s: {reports}")
    return reports


def rank_context(rank: int, world: int, tmp: str, kind: str, grid: tuple[int, int]) -> RankContext:
    """Join the group through a FileStore and build the project's mesh and peer groups."""
    torch.set_num_threads(1)
    store = dist.FileStore(os.path.join(tmp, "store"), world)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=timedelta(seconds=90))
    topology = Topology(kind, world, grid)
    mesh, coords, (row_peers, col_peers) = build_mesh(topology, "cpu")
    return RankContext(rank, world, torch.device("cpu"), mesh, topology, torch.float32, 0, coords,
                       row_peers, col_peers)  # fmt: skip


def one_rank(ctx: RankContext) -> RankContext:
    """The same rank as a world of one: the reference every CP layout is compared with."""
    one = Topology("1d", 1, (1, 1))
    return RankContext(0, 1, ctx.device, None, one, ctx.dtype, ctx.seed, (0, 0), None, None)


def loss_and_grads(workload, model, batch) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """A workload's training loss share and every parameter's gradient (zeros where unused)."""
    params = list(model.parameters())
    loss = workload.run_step(model, batch, train=True)
    grads = torch.autograd.grad(loss, params, allow_unused=True)
    grads = [torch.zeros_like(p) if g is None else g for p, g in zip(params, grads, strict=True)]
    return loss.detach(), grads


def report(tmp: str, rank: int, failures: list[str]) -> None:
    Path(tmp, f"rank{rank}.json").write_text(json.dumps(failures))
    if dist.is_initialized():
        dist.destroy_process_group()
