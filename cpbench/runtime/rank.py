"""Rank runtime: process group, device, thread share and mesh, torn down on every path."""

from __future__ import annotations

import ctypes.util
import functools
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta

import torch
import torch.distributed as dist

from cpbench.core import ConfigError, RankContext, Topology
from cpbench.runtime.mesh import build_mesh
from cpbench.torch_compat import hold_gloo_backends, nvml_gpu_count


def visible_gpus() -> int:
    """The GPUs this process sees (CUDA_VISIBLE_DEVICES honoured), counted without initialising CUDA
    here: the launching process forks ranks, and a fork after cuInit (which torch.cuda.is_available()
    runs) leaves every rank "Cannot re-initialize CUDA in forked subprocess". NVML counts them (torch's
    own NVML count, the one device_count() tries first); where it cannot (MIG devices, NVML missing
    beside a CUDA driver, a ROCm build), a child process asks CUDA."""
    if not torch.backends.cuda.is_built():
        return 0
    if not torch.version.hip:
        counted = nvml_gpu_count()
        if counted >= 0:
            return counted
        if ctypes.util.find_library("cuda") is None:  # no CUDA driver: nothing here can see a GPU
            return 0
    return _gpus_of_child(os.environ.get("CUDA_VISIBLE_DEVICES"))


@functools.cache
def _gpus_of_child(visible: str | None) -> int:
    """torch's own count, asked in a process of its own (about 1.5 s of imports), once for each
    CUDA_VISIBLE_DEVICES (`visible`, which the child inherits) of this process."""
    ask = "import torch; print(torch.cuda.device_count())"
    done = subprocess.run(
        [sys.executable, "-c", ask], capture_output=True, text=True, timeout=300, check=True
    )
    return int(done.stdout)


def pick_backend(requested: str | None) -> str:
    """The backend asked for, else NCCL where a GPU is visible and gloo where none is. The launching
    process and its ranks decide alike, and neither initialises CUDA to do it (`visible_gpus`)."""
    return requested or ("nccl" if visible_gpus() else "gloo")


def device_type(backend: str) -> str:
    """Where a rank of this backend runs: NCCL ranks on their GPU, every other backend on CPU."""
    return "cuda" if backend == "nccl" else "cpu"


def gpu_index(local_rank: int, local_world: int, visible: int) -> int:
    """The GPU a rank takes among the `visible` ones it sees: its LOCAL_RANK where the node's ranks see
    the same GPUs, one or more each; the only one where a site binds one GPU per task
    (`--gpus-per-task=1`: CUDA_VISIBLE_DEVICES=<k>, so every rank's GPU is cuda:0). Anything else
    would put two ranks on one GPU or a rank on none: a ConfigError saying so."""
    if visible >= local_world and local_rank < visible:
        return local_rank
    if visible == 1:
        return 0
    raise ConfigError(
        f"CUDA_VISIBLE_DEVICES: local rank {local_rank} of {local_world} on this node sees {visible} GPU(s); "
        f"let every local rank see at least {local_world} (each takes cuda:LOCAL_RANK) or exactly one, "
        "its own (one GPU per task)"
    )


FLIGHT_RECORDER = "TORCH_FR_BUFFER_SIZE"  # entries torch's flight recorder keeps per process group

# Where gloo and NCCL bind their sockets. Unset, gloo binds to the address the host name resolves to
# (on some clusters a network the other nodes cannot reach), NCCL to the first interface it likes.
GLOO_IFNAME, NCCL_IFNAME = "GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"


def check_socket_ifname(names: str | None) -> None:
    """dist.socket_ifname names network interfaces this machine has: else a ConfigError naming the ones
    it lacks and those it has (gloo's own failure comes later, from deep in a process group)."""
    if names is None:
        return
    have = [name for _, name in socket.if_nameindex()]
    missing = [name for name in names.split(",") if name not in have]
    if missing:
        raise ConfigError(
            f"dist.socket_ifname={names}: {socket.gethostname()} has no network interface "
            f"{', '.join(missing)} (it has {', '.join(have)})"
        )


def use_socket_ifname(names: str | None) -> None:
    """dist.socket_ifname into this rank's environment, before any of its process groups starts: gloo
    reads GLOO_SOCKET_IFNAME as each group starts (the control group too), a comma-separated list of
    exact names; NCCL reads NCCL_SOCKET_IFNAME once, at its first communicator, as prefixes unless the
    list starts with `=`, so it gets `=`: the same interfaces exactly. Null leaves the environment as
    it is."""
    if names is None:
        return
    check_socket_ifname(names)
    os.environ[GLOO_IFNAME] = names
    os.environ[NCCL_IFNAME] = f"={names}"


def threads_per_rank(cpu_threads: int | None, local_ranks: int) -> int:
    """A CPU rank's intra-op threads: `cpu_threads`, else this machine's cores over its ranks."""
    return cpu_threads or max(1, (os.cpu_count() or 1) // local_ranks)


@contextmanager
def rank_runtime(
    topology: Topology,
    backend: str | None,
    timeout_s: float,
    dtype: torch.dtype,
    seed: int,
    cpu_threads: int | None = None,
    socket_ifname: str | None = None,
) -> Iterator[RankContext]:
    """Join the process group described by the torch.distributed environment (RANK, WORLD_SIZE,
    MASTER_ADDR, ...); a lone rank without that environment gets an in-memory store. `socket_ifname`:
    the network interfaces every group of this rank binds to (`use_socket_ifname`)."""
    use_socket_ifname(socket_ifname)
    rank = int(os.environ.get("RANK", 0))
    world_size = int(os.environ.get("WORLD_SIZE", 1))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
    backend = pick_backend(backend)
    if device_type(backend) == "cuda":
        device = torch.device("cuda", gpu_index(local_rank, local_world, torch.cuda.device_count()))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
        # Ranks on one machine share its cores; each takes its share or timings thrash.
        torch.set_num_threads(threads_per_rank(cpu_threads, local_world))
        # torch's flight recorder keeps its last collectives (2,000 by default, each with its stack) in
        # the rank's memory, which a CPU cap counts: at cp=2 the resident peak rose by 7.0 MiB over 30
        # steps of fold_small at N=128 with it, and by 1.8 MiB without it (most in the first 3). A GPU
        # run keeps it (host memory, outside the device's peak; the record of a hang); so does an
        # environment that sets it.
        os.environ.setdefault(FLIGHT_RECORDER, "0")
    kwargs = {"backend": backend, "timeout": timedelta(seconds=timeout_s)}
    if "MASTER_ADDR" not in os.environ:
        kwargs.update(store=dist.HashStore(), rank=rank, world_size=world_size)
    if backend == "nccl":
        kwargs["device_id"] = device
    dist.init_process_group(**kwargs)
    try:
        yield joined_context(topology, device, dtype, seed)
    finally:
        hold_gloo_backends()  # the groups outlive this block in the caller's frames (torch_compat)
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
