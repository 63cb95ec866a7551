"""Activation checkpointing's recomputed forward counts as hardware FLOPs only (cpbench/measure/flops.py):
model FLOPs equal the un-checkpointed step's, reentrant or not. The end-to-end check, on Boltz's own
checkpointing through `python -m cpbench`, is tests/e2e/test_adapter_example.py."""

from __future__ import annotations

import pytest
import torch
from torch.utils.checkpoint import checkpoint

from cpbench.measure.flops import FlopCount, efficiency


def _count(reentrant: bool | None) -> tuple[int, int]:
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Tanh(), torch.nn.Linear(64, 64))
    with FlopCount() as count:
        x = torch.randn(32, 64, requires_grad=True)
        y = mlp(x) if reentrant is None else checkpoint(mlp, x, use_reentrant=reentrant)
        y.sum().backward()
    result = count.result()
    return result.flops, result.recomputed


@pytest.mark.parametrize("reentrant", [True, False])
def test_a_checkpointed_forward_counts_once_in_model_flops(reentrant):
    plain, none = _count(None)
    hardware, recomputed = _count(reentrant)
    assert none == 0 and hardware - recomputed == plain
    # Reentrant recomputes both linears' forward (2 x 32 x 64 x 64 each); non-reentrant stops once the
    # backward has what it needs, the first linear's output.
    assert recomputed == (2 if reentrant else 1) * 2 * 32 * 64 * 64


def test_hfu_counts_the_recomputation_and_mfu_does_not():
    figures = efficiency(4_000_000_000_000, 2, 1000.0, 10.0, recomputed=1_000_000_000_000)
    assert (figures.model_tflop, figures.hardware_tflop) == (3.0, 4.0)
    assert (figures.mfu, figures.hfu) == (0.15, 0.2)
