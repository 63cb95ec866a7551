"""Rank runtime: process group, device, thread share and mesh, torn down on every path."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta

import torch
import torch.distributed as dist

from cpbench.core import RankContext, Topology
from cpbench.runtime.mesh import build_mesh


def pick_backend(requested: str | None) -> str:
    return requested or ("nccl" if torch.cuda.is_available() else "gloo")


def device_type(backend: str) -> str:
    """Where a rank of this backend runs: NCCL ranks on their GPU, every other backend on CPU."""
    return "cuda" if backend == "nccl" else "cpu"


@contextmanager
def rank_runtime(
    topology: Topology, backend: str | None, timeout_s: float, dtype: torch.dtype, seed: int
) -> Iterator[RankContext]:
    """Join the process group described by the torch.distributed environment (RANK, WORLD_SIZE,
    MASTER_ADDR, ...); a lone rank without that environment gets an in-memory store."""
    rank = int(os.environ.get("RANK", 0))
    world_size = int(os.environ.get("WORLD_SIZE", 1))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
    backend = pick_backend(backend)
    if device_type(backend) == "cuda":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
        # Ranks on one machine share its cores; each takes its share or timings thrash.
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // local_world))
    kwargs = {"backend": backend, "timeout": timedelta(seconds=timeout_s)}
    if "MASTER_ADDR" not in os.environ:
        kwargs.update(store=dist.HashStore(), rank=rank, world_size=world_size)
    if backend == "nccl":
        kwargs["device_id"] = device
    dist.init_process_group(**kwargs)
    try:
        yield joined_context(topology, device, dtype, seed)
    finally:
        dist.destroy_process_group()


def joined_context(topology: Topology, device: torch.device, dtype: torch.dtype, seed: int) -> RankContext:
    """This rank's context once its process group is up (real, or probe.predict's fake one): the mesh
    and its row and column peers."""
    mesh, coords, (row_peers, col_peers) = build_mesh(topology, device.type)
    return RankContext(
        rank=dist.get_rank(),
        world_size=dist.get_world_size(),
        device=device,
        mesh=mesh,
        topology=topology,
        dtype=dtype,
        seed=seed,
        coords=coords,
        row_peers=row_peers,
        col_peers=col_peers,
    )
