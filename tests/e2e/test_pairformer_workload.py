"""The pairformer workload end to end: synthesized inputs -> embedder -> stack -> loss share, on CP
ranks against one rank (same seed), and once through the real `python -m cpbench` entry point."""

from __future__ import annotations

import traceback

import pytest
import torch
import torch.distributed as dist
from support.cp_ranks import loss_and_grads, one_rank, rank_context, report, spawn
from support.pairformer_checks import SHAPE, SMALL
from support.processes import cpbench, ok, results

from cpbench.distributed.comm import all_reduce_sum
from cpbench.workloads.pairformer import PairformerWorkload


def _workload_rank(rank: int, world: int, tmp: str, kind: str, grid: tuple[int, int]) -> None:
    failures: list[str] = []

    def check(what, actual, expected):
        try:
            torch.testing.assert_close(actual, expected)
        except AssertionError as err:
            failures.append(f"rank {rank}: {what}: {err}")

    try:
        ctx = rank_context(rank, world, tmp, kind, grid)
        runs = []
        for c in (one_rank(ctx), ctx):
            workload = PairformerWorkload(**SMALL)
            model = workload.build_model(c)
            batch = workload.build_batch(SHAPE, c)
            z = workload.run_step(model, batch, train=False)
            runs.append((*loss_and_grads(workload, model, batch), z))
        (loss1, grads1, z1), (share, grads, z) = runs
        world_group = dist.group.WORLD
        check("loss", all_reduce_sum(share, world_group), loss1)
        for i, (g, g1) in enumerate(zip(grads, grads1, strict=True)):
            check(f"grad of parameter {i}", all_reduce_sum(g, world_group), g1)
        rows, cols = ctx.block(12)
        valid_r = range(rows.start, min(rows.stop, SHAPE.n_tokens))
        valid_c = range(cols.start, min(cols.stop, SHAPE.n_tokens))
        check(
            "z",
            z[: len(valid_r), : len(valid_c)],
            z1[valid_r.start : valid_r.stop, valid_c.start : valid_c.stop],
        )
        assert z.shape[:2] == (12 // grid[0], 12 // grid[1]), z.shape
    except Exception:
        failures.append(f"rank {rank}: {traceback.format_exc()}")
    finally:
        report(tmp, rank, failures)


@pytest.mark.parametrize(("kind", "grid"), [("1d", (2, 1)), ("2d", (2, 2))], ids=["1d-2", "2d-2x2"])
def test_workload_cp_equals_one_rank(kind: str, grid: tuple[int, int]) -> None:
    reports = spawn(_workload_rank, grid[0] * grid[1], kind, grid)
    failures = [line for r in reports for line in r]
    assert not failures, "\n".join(failures)


def test_cli_training_2d(tmp_path) -> None:
    """The Hydra config group entry through the real driver: 2x2 grid, training, padded N."""
    out = tmp_path / "out"
    overrides = ["workload=pairformer_small", "workload.n_blocks=1", "workflow=training", "topology.kind=2d",
                 "topology.cp=4", "sweep.n_tokens=[14]", "timing.warmup=1", "timing.repeats=1",
                 "timing.warmup_max=1", "timing.repeats_max=1",
                 "log.progress=false", "probe.enabled=false", f"output_dir={out}"]  # fmt: skip
    ok(cpbench(*overrides, cwd=tmp_path, timeout=300))
    frame = results(out)
    point = frame[(frame["kind"] == "point") & (frame["N_tokens"] == 14)]
    assert list(point["status"]) == ["ok"], frame.to_dict("records")
    assert point["comm_ms"].iloc[0] > 0
