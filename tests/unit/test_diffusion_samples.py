"""Diffusion samples per trunk pass: the fold model denoises a batch of samples on one trunk pass, as
AlphaFold3 does (5 in inference, 48 noised copies in training); a workload without a diffusion batch
refuses the axis. A run sweeps the count as an axis, records it in every row and groups by it:
tests/e2e/test_diffusion_samples_sweep.py; tests/e2e/test_fold_cp.py checks the batched forms, 1d and
2d, against one rank."""

from __future__ import annotations

import pandas as pd
import pytest
import torch
from support.processes import refused
from support.tiny_fold import TINY

from cpbench.core import RankContext, Shape, Topology
from cpbench.probe import trace
from cpbench.probe.trace import TraceSpec
from cpbench.report.sections.readout import readout
from cpbench.results.row import COLUMNS
from cpbench.workloads.fold import FoldWorkload

ONE_RANK = Topology("1d", 1, (1, 1))


def _one_rank() -> RankContext:
    return RankContext(0, 1, torch.device("cpu"), None, ONE_RANK, torch.float32, 0, (0, 0), None, None)


def test_a_batch_of_samples_is_that_many_samples_from_one_trunk_pass():
    """Sample 0 of a batch is the structure a batch of one samples (its noise is the same draw); the
    others are samples of their own; a training step's loss averages its copies' losses."""
    ctx = _one_rank()
    workload = FoldWorkload(**TINY)
    model = workload.build_model(ctx)
    with torch.no_grad():
        one = workload.run_step(model, workload.build_batch(Shape(20, 150, 3, 1), ctx), train=False)
        three = workload.run_step(model, workload.build_batch(Shape(20, 150, 3, 3), ctx), train=False)
    assert one.shape[1:] == (1, 3) and three.shape[1:] == (3, 3)
    torch.testing.assert_close(three[:, 0], one[:, 0])
    assert not torch.allclose(three[:, 1], three[:, 0]) and not torch.allclose(three[:, 2], three[:, 1])
    # A shape without a count takes the workload's own for the workflow (TINY: 3 in inference).
    with torch.no_grad():
        default = workload.run_step(model, workload.build_batch(Shape(20, 150, 3), ctx), train=False)
    torch.testing.assert_close(default, three)
    losses = [
        workload.run_step(model, workload.build_batch(Shape(20, 150, 3, s), ctx), train=True).item()
        for s in (1, 2)
    ]
    assert losses[0] != losses[1] and all(loss > 0 for loss in losses)


@pytest.mark.parametrize("train", [False, True], ids=["inference", "training"])
def test_the_fake_tensor_estimate_counts_the_samples(train: bool):
    """The estimate traces the point's own batch: more samples, a larger peak (the denoiser's
    activations), in inference and in training."""
    workload = FoldWorkload(**TINY)

    def peak(samples: int) -> float:
        shape = Shape(32, 288, 4, samples)
        return trace.estimate(workload, ONE_RANK, shape, TraceSpec(train, torch.float32), (0,)).peak_gib

    one, eight = peak(1), peak(8)
    assert eight > one, (one, eight)


@pytest.mark.parametrize(
    ("counts", "words"),
    [
        ({"inference": 0}, "diffusion_samples.inference=0: must be an integer >= 1"),
        ({"training": 2.5}, "diffusion_samples.training=2.5: must be an integer >= 1"),
        ({"sampling": 2}, "the counts are `inference` and `training`"),
    ],
)
def test_a_bad_count_fails_by_name(counts: dict, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        FoldWorkload(**{**TINY, "diffusion_samples": counts})


def test_a_workload_without_a_diffusion_batch_refuses_the_axis(tmp_path):
    proc = refused("workload=axial_mix", "sweep.diffusion_samples=[2]", cwd=tmp_path)
    assert proc.returncode == 2
    assert "sweep.diffusion_samples=[2]: this workload has no diffusion batch" in proc.stderr


def test_the_readout_names_the_diffusion_batch_when_it_holds_the_peak():
    row = dict(kind="max-fit", status="ok", peak_mem_gib=70.0, oom_at=288, N_tokens=256, N_atoms=2304,
               MSA_depth=16, diffusion_samples=5,
               topology="1d", cp=1, grid="1x1", config_hash="x", workload="fold", workflow="inference",
               dtype="bfloat16", peak_holder="diffusion.transformer.attention.* 58%, (rest) 42%")  # fmt: skip
    text = readout(pd.DataFrame([row]).reindex(columns=COLUMNS))
    assert "At cp=1 1d (diffusion.* holds 58% of the peak or more) that is the diffusion module" in text
    assert "which runs its 5 sample(s) per trunk pass as one batch" in text
    trunk = {**row, "peak_holder": "msa.blocks.*.tri_mul_out 61%, (the rest) 39%"}
    assert "diffusion module" not in readout(pd.DataFrame([trunk]).reindex(columns=COLUMNS))
