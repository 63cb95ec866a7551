"""The fold workload through the real entry points: N_atoms and MSA depth are real axes (they change
the work and the result), the sampling steps are recorded, 2d training runs, and a bad size fails by
name before any rank starts work."""

from __future__ import annotations

import pytest
import torch
from conftest import FAST, cpbench, ok, results, torchrun
from test_fold_cp import TINY

from cpbench.core import RankContext, Shape, Topology
from cpbench.workloads.fold import FoldWorkload

SIZES = [f"workload.{key}={value}" for key, value in TINY.items() if not isinstance(value, dict)]
SIZES += [
    f"workload.{key}.{k}={v}"
    for key, value in TINY.items()
    if isinstance(value, dict)
    for k, v in value.items()
]


def test_torchrun_sweeps_atoms_and_msa_depth(tmp_path) -> None:
    out = tmp_path / "out"
    ok(torchrun(2, "workload=fold_small", *SIZES, *FAST, "sweep.n_tokens=[16]", "sweep.n_atoms=[64,160]",
                "sweep.msa_depth=[2,8]", f"output_dir={out}", cwd=tmp_path, timeout=300))  # fmt: skip
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
    """One trunk pass (recycling in training is checked against one rank in tests/test_fold_cp.py): the
    FLOP count of a training step, on fake tensors, is most of this run's time."""
    out = tmp_path / "out"
    ok(cpbench("workload=fold_small", *SIZES, "workload.n_cycles=1", *FAST, "workflow=training",
               "topology.kind=2d", "topology.cp=4",
               "sweep.n_tokens=[14]", "sweep.n_atoms=[120]", "sweep.msa_depth=[3]", f"output_dir={out}",
               cwd=tmp_path, timeout=300))  # fmt: skip
    frame = results(out)
    point = frame[frame["kind"] == "point"]
    assert list(point["status"]) == ["ok"], frame.to_dict("records")
    assert list(point["sampling_steps"]) == [0]  # training: one denoising step, no sampling
    assert point["backward_ms"].iloc[0] > 0 and point["comm_ms"].iloc[0] > 0


@pytest.mark.parametrize(
    ("knob", "value", "words"),
    [
        ("atom_heads", 3, "atom_heads=3: must divide c_atom=16"),
        ("sampling", {"steps": 0}, "sampling_steps=0: must be a positive integer"),
        ("sampling", {"step": 2}, "the sampler takes one setting, `steps`"),
        ("msa_blocks", 0, "n_blocks=0: must be a positive integer"),
        ("token_heads", 5, "token_heads=5: must divide c_token=16"),
    ],
)
def test_bad_size_fails_by_name(knob: str, value: object, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        FoldWorkload(**{**TINY, knob: value})


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
