"""An adapter module (native contract) whose ranks write the socket interface variables their
environment holds once their process groups are up, to `options["report_dir"]/rank<r>.json`: what
dist.socket_ifname gave them."""

import json
import os
from pathlib import Path

import torch

SOCKET_VARIABLES = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")


def build_model(mesh, device, *, options, ctx):
    seen = {name: os.environ.get(name) for name in SOCKET_VARIABLES}
    (Path(options["report_dir"]) / f"rank{ctx.rank}.json").write_text(json.dumps(seen))
    return torch.nn.Linear(4, 4).to(device)


def build_batch(N, n_atoms, S, mesh, device, *, ctx):
    rows, cols = ctx.block(N)
    return torch.randn(rows.stop - rows.start, cols.stop - cols.start, 4, device=device)


def run_step(model, batch, train):
    return model(batch)
