"""An adapter module with the fold-cp driver's signatures, for tests. It all-gathers a row-sharded
pair tensor over the mesh. CPBENCH_TEST_FAIL="rank:N" makes that rank raise at N_tokens >= N;
CPBENCH_TEST_KILL_ONCE="rank:N:marker" SIGKILLs that rank at N_tokens == N once (a preemption, or a
kill from outside), leaving the marker file so the retry runs; CPBENCH_TEST_KILL_AFTER_S waits that long
first (a crash that comes late in a long point)."""

import os
import signal
import time
from pathlib import Path

import torch
import torch.distributed as dist


class RowMix(torch.nn.Module):
    def __init__(self, mesh):
        super().__init__()
        self.mesh = mesh
        self.proj = torch.nn.Linear(8, 8)

    def forward(self, z):
        group = self.mesh.get_group()
        full = torch.empty((z.shape[0] * dist.get_world_size(group), *z.shape[1:]), dtype=z.dtype)
        dist.all_gather_single(full, z.contiguous(), group=group)
        return self.proj(z) + full.mean(0, keepdim=True)


def build_model(mesh, device):
    torch.manual_seed(0)
    return RowMix(mesh).to(device)


def build_batch(N, n_atoms, S, mesh, device):
    fail = os.environ.get("CPBENCH_TEST_FAIL")
    if fail:
        rank, at = (int(v) for v in fail.split(":"))
        if dist.get_rank() == rank and at <= N:
            raise ValueError(f"injected failure at N={N}")
    kill = os.environ.get("CPBENCH_TEST_KILL_ONCE")
    if kill:
        rank, at, marker = kill.split(":", 2)
        if dist.get_rank() == int(rank) and int(at) == N and not Path(marker).exists():
            Path(marker).touch()
            time.sleep(float(os.environ.get("CPBENCH_TEST_KILL_AFTER_S", "0")))
            os.kill(os.getpid(), signal.SIGKILL)
    rows = N // mesh.size()
    g = torch.Generator().manual_seed(N + 1000 * mesh.get_local_rank())
    return torch.randn(rows, N, 8, generator=g).to(device)


def run_step(model, batch, train):
    out = model(batch)
    return out.pow(2).mean() if train else out
