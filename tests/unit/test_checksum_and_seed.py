"""What a step may return is summed into its checksum (tensors, DTensors, and tuples, lists and dicts of
them; nothing summable leaves it blank), and `seed_all` fixes every generator a user's hooks may draw
from. In-process: one gloo rank for the DTensor cases."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard

from cpbench.measure.checksum import local_share
from cpbench.runtime.seed import seed_all


def test_containers_sum_every_tensor_they_hold():
    a, b = torch.ones(3), torch.full((2, 2), 2.0)
    assert local_share(a) == 3.0
    assert local_share((a, b)) == 11.0 and local_share([a, [b]]) == 11.0
    assert local_share({"x": a, "y": (b, None, "text")}) == 11.0


@pytest.mark.parametrize("out", [None, "text", 3.0, (None,), [], {"loss": None}])
def test_nothing_summable_leaves_the_checksum_blank_not_zero(out):
    assert local_share(out) is None


@pytest.fixture
def one_rank_mesh(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        yield init_device_mesh("cpu", (1, 1), mesh_dim_names=("cp0", "cp1"))
    finally:
        dist.destroy_process_group()


def test_a_dtensor_counts_its_local_values_once_whatever_its_placement(one_rank_mesh):
    local = torch.arange(6, dtype=torch.float32).reshape(2, 3)  # sums to 15
    for placements in ([Shard(0), Shard(1)], [Replicate(), Replicate()], [Partial(), Replicate()]):
        out = DTensor.from_local(local, one_rank_mesh, placements)
        assert local_share(out) == 15.0, placements
    assert local_share((DTensor.from_local(local, one_rank_mesh, [Shard(0), Replicate()]), local)) == 30.0


def _draws() -> tuple[float, float, float]:
    return random.random(), float(np.random.rand()), float(torch.rand(()))


def test_seed_all_fixes_random_numpy_and_torch():
    seed_all(7)
    first = _draws()
    seed_all(7)
    assert _draws() == first
    seed_all(8)
    assert all(x != y for x, y in zip(_draws(), first, strict=True))
