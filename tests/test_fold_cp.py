"""The fold workload in 1d and 2d context parallelism equals its one-rank self: the denoising loss,
every parameter's gradient (summed over ranks, as the driver does), and the sampled positions of
each rank's atoms. Windows cross every shard border (a few tokens per rank, ~10 atoms per token),
the cp=4 case has a row block of padding only, hence no atoms at all, and on the 2d grids the atoms of
a row block are split over its mesh row (a token's atoms may span two ranks)."""

from __future__ import annotations

import traceback

import pytest
import torch
import torch.distributed as dist
from test_pairformer_cp import loss_and_grads, one_rank, rank_context, report, spawn

from cpbench.core import Shape
from cpbench.distributed.comm import LEDGER, all_reduce_sum
from cpbench.models.fold.atoms import HALO, QUERIES, AtomWindows
from cpbench.workloads.fold import FoldWorkload

TINY = dict(c_s=16, c_z=8, n_blocks=1, tri_mul_hidden=8, tri_heads=2, tri_head_width=4, single_heads=2,
            msa_blocks=1, c_m=8, opm_hidden=4, pwa_heads=2, pwa_width=4, c_atom=16, c_atom_pair=8, c_token=16,
            input_atom_blocks=1, atom_blocks=1, atom_heads=2, token_blocks=1, token_heads=2, fourier=8,
            n_cycles=2, sampling={"steps": 2}, diffusion_samples={"inference": 3, "training": 2})  # fmt: skip


def _fold_rank(rank: int, world: int, tmp: str, kind: str, grid: tuple[int, int], shape: Shape) -> None:
    failures: list[str] = []
    try:
        failures = fold_failures(rank_context(rank, world, tmp, kind, grid), grid, shape)
    except Exception:
        failures.append(f"rank {rank}: {traceback.format_exc()}")
    finally:
        report(tmp, rank, failures)


def fold_run(ctx, shape: Shape, chunk: int | None = None) -> tuple:
    """(loss share, gradients, sampled positions, model, batch) of the TINY fold workload on `ctx`."""
    workload = FoldWorkload(**TINY, chunk_size=chunk)
    model = workload.build_model(ctx)
    batch = workload.build_batch(shape, ctx)
    loss, grads = loss_and_grads(workload, model, batch)
    with torch.no_grad():  # inference as the driver runs it (with chunking on: the in-place form)
        positions = workload.run_step(model, batch, train=False)  # [atoms, 3 samples, 3]
    return loss, grads, positions, model, batch


def fold_failures(ctx, grid: tuple[int, int], shape: Shape, chunk: int | None = None,
                  reference: tuple | None = None) -> list[str]:  # fmt: skip
    """This rank's shard of the fold workload (`chunk`: its chunk_size) against the plain one-rank
    model (`reference`: its loss, gradients and positions when already computed): loss, summed
    gradients, positions, and the halo plan."""
    rank, failures = ctx.rank, []

    def check(what, actual, expected):
        try:
            torch.testing.assert_close(actual, expected)
        except AssertionError as err:
            failures.append(f"rank {rank}: {what}: {err}")

    loss1, grads1, x1 = reference or fold_run(one_rank(ctx), shape)[:3]
    share, grads, x, model, batch = fold_run(ctx, shape, chunk)
    windows = batch.atoms.windows
    check("loss", all_reduce_sum(share, dist.group.WORLD), loss1)
    for i, (g, g1) in enumerate(zip(grads, grads1, strict=True)):
        check(f"grad of parameter {i}", all_reduce_sum(g, dist.group.WORLD), g1)
    mine = windows.stop - windows.start
    check("positions", x[:mine], x1[windows.start : windows.stop])
    check("padding atoms", x[mine:], torch.zeros_like(x[mine:]))
    failures.extend(_halo_checks(rank, model, batch, windows, grid))
    return failures


def _halo_checks(rank: int, model, batch, windows: AtomWindows, grid: tuple[int, int]) -> list[str]:
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


CASES = {
    "1d-2": ("1d", (2, 1), Shape(11, 120, 3)),
    "1d-4": ("1d", (4, 1), Shape(9, 100, 3)),  # padded to 12: the last row block is all padding
    "2d-2x2": ("2d", (2, 2), Shape(11, 120, 3)),
    "2d-1x2": ("2d", (1, 2), Shape(11, 120, 3)),  # one row block: its atoms split over the two ranks
    # Every atom on rank 0: it receives no halo, yet must join the exchange's backward.
    "2d-1x2-one-shard": ("2d", (1, 2), Shape(4, 12, 3)),
}


@pytest.mark.parametrize("case", CASES)
def test_fold_cp_equals_one_rank(case: str) -> None:
    kind, grid, shape = CASES[case]
    reports = spawn(_fold_rank, grid[0] * grid[1], kind, grid, shape)
    failures = [line for r in reports for line in r]
    assert not failures, "\n".join(failures)
