"""A rank generates only its own shard: measured allocations shrink with the shard."""

from __future__ import annotations

import gc
import tracemalloc

import pytest

from cpbench.core import Shape, Topology
from cpbench.inputs import FoldShard, synthesize

# Large enough that the O(N^2) pair block dominates the O(N) column token features.
SHAPE = Shape(2048, 0, 8)


def traced_peak(topology: Topology, coords: tuple[int, int]) -> tuple[int, FoldShard]:
    """Peak bytes allocated while synthesizing (numpy reports its buffers to tracemalloc, and
    every shard tensor is a numpy buffer handed to torch without a copy)."""
    gc.collect()
    tracemalloc.start()
    try:
        shard = synthesize(SHAPE, topology, coords, seed=0)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return peak, shard


def test_one_1d_shard_at_cp4_allocates_a_quarter_of_cp1():
    whole_peak, whole = traced_peak(Topology("1d", 1, (1, 1)), (0, 0))
    assert whole_peak >= whole.nbytes  # the measurement sees the shard's own buffers
    assert whole_peak >= SHAPE.n_tokens**2 * 2  # token_bonds and pair_mask, one byte each
    for rank in range(4):
        peak, shard = traced_peak(Topology("1d", 4, (4, 1)), (rank, 0))
        assert 0.2 <= peak / whole_peak <= 0.35, (rank, peak, whole_peak)
        assert 0.2 <= shard.nbytes / whole.nbytes <= 0.35
        assert peak < SHAPE.n_tokens**2  # not even one global N x N byte mask


@pytest.mark.parametrize("cp", [2, 8])
def test_allocations_follow_the_shard_size(cp):
    whole_peak, _ = traced_peak(Topology("1d", 1, (1, 1)), (0, 0))
    peak, _ = traced_peak(Topology("1d", cp, (cp, 1)), (cp - 1, 0))
    # The pair block is 1/cp of the whole; column tokens (all N in 1d) add a few percent.
    assert 1 / cp <= peak / whole_peak <= 1 / cp + 0.1
