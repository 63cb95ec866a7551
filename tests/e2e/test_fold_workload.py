"""The fold workload through the real entry points: N_atoms and MSA depth are real axes (they change
the work and the result), the sampling steps are recorded, 2d training runs (a bad size fails by name
before any rank starts work: tests/unit/test_fold_workload_sizes.py). Without the FLOP count, which
these tests do not check (fold's counts: tests/e2e/test_flops_runs.py) and which was most of their time
(a fold step on fake tensors at each shape)."""

from __future__ import annotations

import torch
from support.processes import FAST, cpbench, ok, results, torchrun
from support.tiny_fold import SIZES, TINY

from cpbench.core import RankContext, Shape, Topology
from cpbench.workloads.fold import FoldWorkload

NO_COUNT = ["measure.count_flops=false"]


def test_torchrun_sweeps_atoms_and_msa_depth(tmp_path) -> None:
    out = tmp_path / "out"
    ok(torchrun(2, "workload=fold_small", *SIZES, *FAST, *NO_COUNT, "sweep.n_tokens=[16]",
                "sweep.n_atoms=[64,160]", "sweep.msa_depth=[2,8]", f"output_dir={out}", cwd=tmp_path,
                timeout=300))  # fmt: skip
    frame = results(out)
    points = frame[frame["kind"] == "point"]
    assert len(points) == 4 and set(points["status"]) == {"ok"}, frame.to_dict("records")
    assert set(points["workload"]) == {"fold"}
    assert set(points["sampling_steps"]) == {TINY["sampling"]["steps"]}
    assert set(points["n_cycles"]) == {TINY["n_cycles"]}
    assert sorted(set(points["N_atoms"])) == [64, 160] and sorted(set(points["MSA_depth"])) == [2, 8]
    # Each axis changes the sampled positions.
    assert points["checksum"].nunique() == 4, points[["N_atoms", "MSA_depth", "checksum"]]


def test_cli_training_2d(tmp_path) -> None:
    """One trunk pass (recycling in training is checked against one rank in tests/e2e/test_fold_cp.py); no
    FLOP count (of a training step, on fake tensors, it was most of this run's time)."""
    out = tmp_path / "out"
    ok(cpbench("workload=fold_small", *SIZES, "workload.n_cycles=1", *FAST, *NO_COUNT, "workflow=training",
               "topology.kind=2d", "topology.cp=4",
               "sweep.n_tokens=[14]", "sweep.n_atoms=[120]", "sweep.msa_depth=[3]", f"output_dir={out}",
               cwd=tmp_path, timeout=300))  # fmt: skip
    frame = results(out)
    point = frame[frame["kind"] == "point"]
    assert list(point["status"]) == ["ok"], frame.to_dict("records")
    assert list(point["sampling_steps"]) == [0]  # training: one denoising step, no sampling
    assert point["backward_ms"].iloc[0] > 0 and point["comm_ms"].iloc[0] > 0


def test_bf16_follows_the_run_dtype() -> None:
    """bf16 autocast over the whole model (weights stay float32); atom ids and positions keep their
    own dtypes through the halo, so the windows are the same."""
    one = Topology("1d", 1, (1, 1))
    ctx = RankContext(0, 1, torch.device("cpu"), None, one, torch.bfloat16, 0, (0, 0), None, None)
    workload = FoldWorkload(**TINY)
    model = workload.build_model(ctx)
    assert model.precision == "bf16" and all(p.dtype == torch.float32 for p in model.parameters())
    batch = workload.build_batch(Shape(20, 150, 3), ctx)
    assert torch.isfinite(workload.run_step(model, batch, train=False)).all()
    loss = workload.run_step(model, batch, train=True)
    loss.backward()
    assert torch.isfinite(loss)
