"""A fold-cp style module whose steps each keep a copy of their output for as long as their batch lives
(a history kept on the device, as a model that logs its activations would): a single step holds one
copy, a measurement of several steps holds several. The probe's one step at an N can then fit where
the full measurement at that N does not. With CPBENCH_TEST_STEP_LOG set, each rank appends the N of
every step it takes to that path plus `.<rank>`."""

import os

import torch
import torch.distributed as dist

CHANNELS = 64


def build_model(mesh, device):
    return torch.nn.Identity()


def build_batch(N, n_atoms, S, mesh, device):
    g = torch.Generator().manual_seed(N + 1000 * mesh.get_local_rank())
    return {"pair": torch.randn(N // mesh.size(), N, CHANNELS, generator=g).to(device), "kept": []}


def run_step(model, batch, train):
    out = model(batch["pair"]) * 2
    batch["kept"].append(out.clone())
    log = os.environ.get("CPBENCH_TEST_STEP_LOG")
    if log:
        with open(f"{log}.{dist.get_rank()}", "a") as steps:
            steps.write(f"{batch['pair'].shape[1]}\n")
    return out
