"""A module with the fold-cp driver's signatures whose hooks also name the keywords cpbench adds
(docs/adapters.md): `options`, `ctx` and, in build_batch, `features`. Each rank writes what reached each
hook to `options["report_dir"]` (one JSON file per world size, rank and hook), for the tests to read."""

import json
from pathlib import Path

import torch


def _report(options, ctx, hook, seen):
    name = f"w{ctx.world_size}_r{ctx.rank}_{hook}.json"
    (Path(options["report_dir"]) / name).write_text(json.dumps({"options": options, **seen}))


def build_model(mesh, device, *, options, ctx):
    seen = {"dtype": str(ctx.dtype), "seed": ctx.seed, "rank": ctx.rank, "mesh": list(mesh.mesh_dim_names)}
    _report(options, ctx, "build_model", seen)
    return torch.nn.Linear(options["width"], options["width"]).to(device)


def build_batch(N, n_atoms, S, mesh, device, *, options, ctx, features):
    seen = {"N": N, "n_atoms": n_atoms, "S": S, "features": None}
    if features is not None:
        seen["features"] = {name: list(value.shape) for name, value in features.items()}
    _report(options, ctx, "build_batch", seen)
    rows, cols = ctx.block(N)
    return torch.randn(rows.stop - rows.start, cols.stop - cols.start, options["width"], device=device)


def run_step(model, batch, train, *, options, ctx):
    out = model(batch)
    device = batch.device.type
    seen = {"autocast": torch.is_autocast_enabled(device), "out_dtype": str(out.dtype)}
    _report(options, ctx, "run_step", seen)
    return out.float().pow(2).mean() if train else out
