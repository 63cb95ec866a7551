"""The fold workload in 1d and 2d context parallelism, with each kernel set (`workload.kernels`: the
reference and the fused sdpa), equals its one-rank self with the reference kernels: the denoising loss,
every parameter's gradient (summed over ranks, as the driver does), and the sampled positions of
each rank's atoms. Windows cross every shard border (a few tokens per rank, ~10 atoms per token),
the cp=4 case has a row block of padding only, hence no atoms at all, and on the 2d grids the atoms of
a row block are split over its mesh row (a token's atoms may span two ranks)."""

from __future__ import annotations

import traceback

import pytest
from support.cp_ranks import one_rank, rank_context, report, spawn
from support.tiny_fold import fold_failures, fold_run

from cpbench.core import Shape
from cpbench.models.pairformer.kernels import KERNELS


def _fold_rank(rank: int, world: int, tmp: str, kind: str, grid: tuple[int, int], shape: Shape) -> None:
    failures: list[str] = []
    try:
        ctx = rank_context(rank, world, tmp, kind, grid)
        reference = fold_run(one_rank(ctx), shape)[:3]
        for kernels in KERNELS[:2]:  # cueq runs on CUDA alone (tests/unit/test_kernels.py: its refusal)
            failures += fold_failures(ctx, grid, shape, reference=reference, kernels=kernels)
    except Exception:
        failures.append(f"rank {rank}: {traceback.format_exc()}")
    finally:
        report(tmp, rank, failures)


CASES = {
    "1": ("1d", (1, 1), Shape(11, 120, 3)),  # one rank: the fused kernels against the reference alone
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
