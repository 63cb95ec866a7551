"""The pairformer workload's config: a bad knob fails when the workload is built, and bf16 follows the
run's dtype."""

from __future__ import annotations

import pytest
import torch
from support.pairformer_checks import SHAPE, SMALL

from cpbench.core import RankContext, Topology
from cpbench.workloads.pairformer import PairformerWorkload


def test_bf16_follows_the_run_dtype() -> None:
    one = Topology("1d", 1, (1, 1))
    ctx = RankContext(0, 1, torch.device("cpu"), None, one, torch.bfloat16, 0, (0, 0), None, None)
    workload = PairformerWorkload(**SMALL)
    model = workload.build_model(ctx)
    assert model.precision == "bf16"
    assert all(p.dtype == torch.float32 for p in model.parameters())  # autocast, not bf16 weights
    loss = workload.run_step(model, workload.build_batch(SHAPE, ctx), train=True)
    loss.backward()
    assert torch.isfinite(loss)
    fp16 = RankContext(**{**ctx.__dict__, "dtype": torch.float16})
    with pytest.raises(ValueError, match="float32 or bfloat16"):
        PairformerWorkload(**SMALL).build_model(fp16)


def test_bad_knob_fails_when_the_workload_is_built() -> None:
    with pytest.raises(ValueError, match="compile='fastest': allowed values are off, default, max-autotune"):
        PairformerWorkload(**SMALL, compile="fastest")
    assert PairformerWorkload(**SMALL, compile=False).cfg.compile == "off"  # YAML's bare `off`
