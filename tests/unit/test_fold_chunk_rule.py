"""The chunk rule (chunks shrink with the transient and the cap), and that a chunked trace holds no
N^3 tensor: pure functions of tests/e2e/test_fold_chunked.py's chunking."""

from __future__ import annotations

import pytest
import torch

from cpbench.core import Shape, Topology
from cpbench.models.pairformer import PairformerConfig, chunking
from cpbench.probe import trace
from cpbench.probe.trace import TraceSpec
from cpbench.workloads.pairformer import PairformerWorkload


def test_auto_chunks_shrink_with_the_transient_and_the_cap():
    per_row = chunking.AUTO_CEILING // 3  # three rows fit
    assert chunking.row_slices(8, chunking.AUTO, per_row) == [slice(0, 3), slice(3, 6), slice(6, 8)]
    one_row = [slice(i, i + 1) for i in range(8)]
    assert chunking.row_slices(8, chunking.AUTO, 10 * chunking.AUTO_CEILING) == one_row
    # A rank's cap bounds the transient: 1/64 of 1 GiB is 4 Mi float32 elements, an 80 GB card's
    # share stays at the ceiling.
    assert chunking.auto_elements(1.0) == 2**22 and chunking.auto_elements(78.0) == chunking.AUTO_CEILING
    with chunking.sized_for(1.0):
        assert chunking.row_slices(8, chunking.AUTO, 2**21) == [
            slice(0, 2),
            slice(2, 4),
            slice(4, 6),
            slice(6, 8),
        ]
    assert chunking.row_slices(8, chunking.AUTO, 2**21) == [slice(0, 8)]  # the ceiling again
    assert chunking.row_slices(8, None, per_row) == [slice(0, 8)]
    with chunking.peak_only():
        assert chunking.row_slices(8, 3, per_row) == [slice(0, 3), slice(3, 6)]
    with pytest.raises(ValueError, match="chunk_size='big'"):
        PairformerConfig(chunk_size="big")


def _peak(workload, n: int) -> float:
    spec = TraceSpec(False, torch.float32)
    return trace.trace_peak(workload, Topology("1d", 1, (1, 1)), Shape(n, 0, 1), spec, 0)


def test_chunked_inference_holds_no_n_cubed_tensor():
    """Pairformer inference traced on fake tensors: doubling N multiplies the plain form's peak with the
    reference kernels by close to 8 (the triangle attention logits, N^3 H), the chunked form's by close
    to 4 (z); the fused kernels write no logits, so their plain form grows as z does too."""
    sizes = dict(c_s=16, c_z=16, n_blocks=1, tri_mul_hidden=16, tri_heads=4, tri_head_width=4, single_heads=2)
    plain = PairformerWorkload(**sizes, kernels="reference")
    chunked = PairformerWorkload(**sizes, kernels="reference", chunk_size=chunking.AUTO)
    fused = PairformerWorkload(**sizes, kernels="sdpa")
    growth = {name: _peak(w, 512) / _peak(w, 256) for name, w in (("plain", plain), ("chunked", chunked),
                                                                    ("fused", fused))}  # fmt: skip
    assert growth["plain"] > 6.5 and growth["chunked"] < 4.5 and growth["fused"] < 4.5, growth
