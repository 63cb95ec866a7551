"""The tests' tiny fold model: its sizes (`TINY`, as a run's overrides `SIZES`), and the check of one
rank's shard of it against the plain one-rank model (`fold_failures`: loss, summed gradients, sampled
positions and the halo plan), run on real gloo ranks (support/cp_ranks.py)."""

from __future__ import annotations

import torch
import torch.distributed as dist

from cpbench.core import Shape
from cpbench.distributed.comm import LEDGER, all_reduce_sum
from cpbench.models.fold.atoms import HALO, QUERIES, AtomWindows
from cpbench.workloads.fold import FoldWorkload
from support.cp_ranks import loss_and_grads, one_rank

TINY = dict(c_s=16, c_z=8, n_blocks=1, tri_mul_hidden=8, tri_heads=2, tri_head_width=4, single_heads=2,
            msa_blocks=1, c_m=8, opm_hidden=4, pwa_heads=2, pwa_width=4, c_atom=16, c_atom_pair=8, c_token=16,
            input_atom_blocks=1, atom_blocks=1, atom_heads=2, token_blocks=1, token_heads=2, fourier=8,
            n_cycles=2, sampling={"steps": 2}, diffusion_samples={"inference": 3, "training": 2})  # fmt: skip


# The same sizes as a run's overrides (`python -m cpbench workload=fold_small *SIZES`).
SIZES = [f"workload.{key}={value}" for key, value in TINY.items() if not isinstance(value, dict)]
SIZES += [
    f"workload.{key}.{k}={v}"
    for key, value in TINY.items()
    if isinstance(value, dict)
    for k, v in value.items()
]


def fold_run(ctx, shape: Shape, chunk: int | None = None, kernels: str = "reference") -> tuple:
    """(loss share, gradients, sampled positions, model, batch) of the TINY fold workload on `ctx`."""
    workload = FoldWorkload(**TINY, chunk_size=chunk, kernels=kernels)
    model = workload.build_model(ctx)
    batch = workload.build_batch(shape, ctx)
    loss, grads = loss_and_grads(workload, model, batch)
    with torch.no_grad():  # inference as the driver runs it (with chunking on: the in-place form)
        positions = workload.run_step(model, batch, train=False)  # [atoms, 3 samples, 3]
    return loss, grads, positions, model, batch


def fold_failures(ctx, grid: tuple[int, int], shape: Shape, chunk: int | None = None,
                  reference: tuple | None = None, kernels: str = "reference") -> list[str]:  # fmt: skip
    """This rank's shard of the fold workload (`chunk`: its chunk_size; `kernels`: its attention
    kernels) against the plain one-rank model with the reference kernels (`reference`: its loss,
    gradients and positions when already computed): loss, summed gradients, positions, and the halo
    plan."""
    rank, failures = ctx.rank, []

    def check(what, actual, expected):
        try:
            torch.testing.assert_close(actual, expected)
        except AssertionError as err:
            failures.append(f"rank {rank}, kernels={kernels}: {what}: {err}")

    loss1, grads1, x1 = reference or fold_run(one_rank(ctx), shape)[:3]
    share, grads, x, model, batch = fold_run(ctx, shape, chunk, kernels)
    windows = batch.atoms.windows
    check("loss", all_reduce_sum(share, dist.group.WORLD), loss1)
    for i, (g, g1) in enumerate(zip(grads, grads1, strict=True)):
        check(f"grad of parameter {i}", all_reduce_sum(g, dist.group.WORLD), g1)
    mine = windows.stop - windows.start
    check("positions", x[:mine], x1[windows.start : windows.stop])
    check("padding atoms", x[mine:], torch.zeros_like(x[mine:]))
    failures.extend(halo_checks(rank, model, batch, windows, grid))
    return failures


def halo_checks(rank: int, model, batch, windows: AtomWindows, grid: tuple[int, int]) -> list[str]:
    """The input embedder moves halos, not atoms: a rank gives a neighbour at most the 80 atoms
    that neighbour's windows reach past its own (48 keys plus up to 32 of query alignment), and in
    1d (where nothing else moves under the label) the bytes sent are exactly the halo plan's: once
    c, positions and ids, then q per block."""
    failures = []
    reach = HALO + QUERIES
    if any(len(r) > reach for r in windows.sends):
        failures.append(f"rank {rank}: sends {windows.sends} exceed the halo reach {reach}")
    LEDGER.reset()
    with torch.no_grad():
        model.trunk(batch)
    sent = LEDGER.bytes_sent.get("input.atom_encoder", 0)
    atoms = sum(len(r) for r in windows.sends)
    per_atom = 4 * TINY["c_atom"] * (1 + TINY["input_atom_blocks"]) + 4 * 3 + 8 * 2
    planned = atoms * per_atom
    if grid[1] == 1 and sent != planned:
        failures.append(f"rank {rank}: input.atom_encoder sent {sent} bytes; the halo plan, {planned}")
    return failures
