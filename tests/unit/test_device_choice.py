"""Which GPU a rank takes, whether the launcher lets the ranks start, and whether the metadata calls a
run's devices shared, all from the devices a rank sees: the node's GPUs seen by every rank (cuda:LOCAL_RANK)
or, where a site binds one GPU per task (`--gpus-per-task=1`: CUDA_VISIBLE_DEVICES=<k>), one each
(cuda:0), which is neither sharing nor oversubscription."""

from __future__ import annotations

import pytest

from cpbench.core import ConfigError
from cpbench.launch import base
from cpbench.record.metadata import sharing
from cpbench.runtime.rank import gpu_index, pick_backend, visible_gpus


@pytest.mark.parametrize(
    ("local_rank", "local_world", "visible", "index"),
    [
        (0, 1, 1, 0),  # one rank, one GPU
        (3, 8, 8, 3),  # every rank sees the node's GPUs
        (1, 2, 8, 1),  # fewer ranks than GPUs: the first ones
        (1, 2, 1, 0),  # one GPU per task: local rank 1 sees only its own, cuda:0
        (7, 8, 1, 0),
    ],
)
def test_a_rank_takes_its_local_rank_or_the_one_gpu_it_sees(local_rank, local_world, visible, index):
    assert gpu_index(local_rank, local_world, visible) == index


@pytest.mark.parametrize(("local_rank", "local_world", "visible"), [(0, 1, 0), (1, 4, 0), (3, 4, 2)])
def test_a_rank_without_a_gpu_of_its_own_is_refused_saying_why(local_rank, local_world, visible):
    with pytest.raises(ConfigError, match=rf"^CUDA_VISIBLE_DEVICES: local rank {local_rank} of "
                       rf"{local_world} on this node sees {visible} GPU\(s\)"):  # fmt: skip
        gpu_index(local_rank, local_world, visible)


def test_the_launcher_needs_a_gpu_per_rank_unless_each_rank_is_bound_to_its_own(monkeypatch):
    """Ranks that inherit this process's environment (the local launcher's, torchrun's) share its view:
    one visible GPU is too few for two. A task started on its own (SLURM's) may see only its own."""
    base.check_gpus("gloo", 4, 4)  # CPU ranks: no GPU needed
    monkeypatch.setattr(base, "visible_gpus", lambda: 1)  # what NVML would count on a bound task
    with pytest.raises(ConfigError, match=r"^topology.cp=2: needs 2 GPUs on this node, 1 visible"):
        base.check_gpus("nccl", 2, 2)
    base.check_gpus("nccl", 2, 2, bound_apart=True)
    monkeypatch.setattr(base, "visible_gpus", lambda: 8)
    base.check_gpus("nccl", 4, 4)


@pytest.mark.parametrize(
    ("local_world", "gpus_seen", "cores", "expected"),
    [
        (8, 8, 64, (8, "no", 1.0, "no")),  # one rank per GPU, every rank sees all
        (2, 8, 64, (8, "no", 0.25, "no")),
        (4, 1, 64, (4, "no", 1.0, "no")),  # one GPU per task: four GPUs, one rank each
        (1, 1, 64, (1, "no", 1.0, "no")),
        (4, 2, 64, (2, "yes (4 ranks on 2 device(s))", 2.0, "yes (4 ranks on 2 GPU(s))")),
        (2, None, 8, (1, "yes (2 ranks on 1 device(s))", 0.25, "no")),  # CPU ranks share the cores
        (4, None, 2, (1, "yes (4 ranks on 1 device(s))", 2.0, "yes (4 ranks on 2 CPU core(s))")),
    ],
)
def test_ranks_per_device_come_from_the_devices_each_rank_sees(local_world, gpus_seen, cores, expected):
    found = sharing(local_world, gpus_seen, cores)
    keys = ("device_count", "devices_shared", "ranks_per_device", "oversubscribed")
    assert tuple(found[k] for k in keys) == expected


def test_without_a_gpu_the_backend_is_gloo_and_counting_initialises_no_cuda():
    """On this CPU machine: none visible and gloo chosen, without CUDA initialised by the asking."""
    import torch

    assert visible_gpus() == 0 and pick_backend(None) == "gloo" and pick_backend("nccl") == "nccl"
    assert not torch.cuda.is_initialized()
