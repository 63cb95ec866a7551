"""A DTensor module under cpbench's own contract (`workload.contract=native`): run_step returns this
rank's share of the loss and the driver runs backward and AdamW. Its projection's parameters are
replicated DTensors, whose gradients DTensor completes (the driver must leave them alone); its scale is
a plain parameter, whose gradient each rank holds only its block's share of (the driver sums it)."""

import torch
from torch.distributed.tensor import Shard, distribute_module, distribute_tensor

C = 8


class ProjectScale(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(C, C)
        self.scale = torch.nn.Parameter(torch.linspace(0.5, 1.5, C))


def build_model(mesh, device):
    model = ProjectScale().to(device)  # the driver has seeded torch: the same weights on every rank
    distribute_module(model.proj, mesh)  # replicated DTensors; model.scale stays a plain tensor
    return model


def build_batch(N, n_atoms, S, mesh, device):
    z = torch.randn(N, N, C, device=device)  # the driver has seeded torch: the same on every rank
    return distribute_tensor(z, mesh, [Shard(0)] * mesh.ndim)  # row slabs, or a grid of blocks


def run_step(model, batch, train):
    block = torch.tanh(model.proj(batch)).to_local() * model.scale  # this rank's block, plain from here
    return block.pow(2).sum() / batch.numel()  # its share of the mean over the whole pair tensor
