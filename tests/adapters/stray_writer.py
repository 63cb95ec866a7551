"""An adapter module for the leave-nothing check: a tiny step on a replicated tensor that, when
CPBENCH_TEST_STRAY names a file, writes it in the working directory (a stray write the check must
catch). It declares its real job (REAL_JOB), as docs/adapters.md describes."""

import os
from pathlib import Path

import torch

REAL_JOB = {"denoising steps": {"real": 200, "benchmark": 2, "why": "the module samples 2 steps"}}


def build_model(mesh, device):
    return torch.nn.Linear(8, 8).to(device)


def build_batch(N, n_atoms, S, mesh, device):
    return torch.randn(N, 8, generator=torch.Generator().manual_seed(N)).to(device)


def run_step(model, batch, train):
    if stray := os.environ.get("CPBENCH_TEST_STRAY"):
        Path(stray).write_text("left behind\n")
    out = model(batch)
    return out.pow(2).mean() if train else out
