"""A module written for the fold-cp benchmark driver, built on DTensor: the pair tensor is
distributed over the (cp0, cp1) mesh inside build_batch, the model's weights are replicated DTensors,
and run_step does the whole step itself (train: backward and its own optimizer step), returning a
tuple. CPBENCH_TEST_OOM="rank:N:where" makes that rank (`*`: every rank) run out of memory at
N_tokens >= N, where is `batch` (before build_batch's distribute_tensor), `step` (between two of the
model's collectives) or `repeat` (in the second batch built in a row at one N: a full measurement,
never a probe step)."""

import os

import torch
from torch.distributed.tensor import Shard, distribute_module, distribute_tensor

C = 8


_BUILT = {"n": None, "count": 0}  # batches built in a row at one N


def _maybe_oom(where: str, n: int, mesh) -> None:
    spec = os.environ.get("CPBENCH_TEST_OOM")
    if not spec:
        return
    rank, at, place = spec.split(":")
    mine = rank == "*" or torch.distributed.get_rank() == int(rank)
    if where == "batch":
        _BUILT["count"] = _BUILT["count"] + 1 if _BUILT["n"] == n else 1
        _BUILT["n"] = n
        if place == "repeat" and _BUILT["count"] < 2:
            return
        where = place if place == "repeat" else where
    if place == where and mine and n >= int(at):
        torch.empty(2**62, dtype=torch.uint8)  # a real failing allocation


class PairMix(torch.nn.Module):
    def __init__(self, mesh):
        super().__init__()
        self.mesh = mesh
        self.proj = torch.nn.Linear(C, C)
        self.gate = torch.nn.Linear(C, C)

    def forward(self, z):
        h = torch.relu(self.proj(z))
        # Mixing over both pair axes crosses every shard border: DTensor runs the collectives.
        row_mean = h.mean(dim=0, keepdim=True)
        _maybe_oom("step", z.shape[0], self.mesh)
        col_mean = h.mean(dim=1, keepdim=True)
        return self.gate(h + row_mean + col_mean)


def build_model(mesh, device):
    # The fold-cp driver's mesh: square, its dims named cp0 and cp1 (a KeyError otherwise).
    assert mesh.mesh_dim_names == ("cp0", "cp1") and mesh["cp0"].size() == mesh["cp1"].size()
    model = PairMix(mesh).to(device)  # the driver has seeded torch: the same weights on every rank
    distribute_module(model, mesh)  # parameters become replicated DTensors
    model.optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
    return model


def build_batch(N, n_atoms, S, mesh, device):
    _maybe_oom("batch", N, mesh)
    z = torch.randn(N, N, C, device=device)  # the driver has seeded torch: the same on every rank
    return distribute_tensor(z, mesh, [Shard(0), Shard(1)])


def run_step(model, batch, train):
    out = model(batch)
    if not train:
        return out, out.mean()
    loss = out.pow(2).mean()
    loss.backward()
    model.optimizer.step()
    model.optimizer.zero_grad(set_to_none=True)
    return out.detach(), loss.detach()
