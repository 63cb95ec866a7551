"""The analytic model FLOPs of the test workloads, written from their code (forward; 2 per
multiply-add): what the counter must find, through `python -m cpbench` and in process."""

from __future__ import annotations

from typing import Any

import pandas as pd
import torch
from hydra import compose, initialize_config_module
from hydra.utils import instantiate

from cpbench.core import Shape, Topology
from cpbench.measure.flops import count_step
from cpbench.probe.trace import fake_rank
from cpbench.settings.schema import register


def axial_mix_flops(n: int, grid: str, channels: int = 32, hidden: int = 64, blocks: int = 2) -> int:
    """All ranks of a rows x cols grid: up and down on every pair; each rank's row projection on its
    N/rows rows and column projection on its N/cols columns (replicated work counts on every rank)."""
    rows, cols = (int(k) for k in grid.split("x"))
    return blocks * (4 * n * n * channels * hidden + 2 * channels**2 * n * (rows + cols))


def dtensor_pair_flops(n: int, ranks: int, channels: int = 8) -> int:
    """tests/adapters/dtensor_pair.py over `ranks` ranks: `proj` on each rank's block of the N x N pair
    tensor (N^2 rows in all), then `gate` on h + row mean + column mean, which DTensor replicates
    on a grid (N^2 rows on every rank); each a C x C linear, 2 C^2 FLOPs a row."""
    return 2 * channels**2 * n * n * (1 + ranks)


def counted(rows: pd.DataFrame) -> list[int]:
    """The rows' model_tflop as FLOPs (a CSV float of an integer count)."""
    return [round(v * 1e12) for v in rows["model_tflop"]]


def builtin(name: str, *overrides: str) -> tuple[Any, Any]:
    """A built-in workload as `workload=<name>` composes it, and the run's default shape settings."""
    register()
    with initialize_config_module("cpbench.configs", version_base=None):
        cfg = compose("config", [f"workload={name}", *overrides])
    return instantiate(cfg.workload), cfg.shape


def count_in_process(workload: Any, shape: Shape, cp: int, train: bool = False) -> int:
    """The step's FLOPs over every rank of a 1d cp, each rank traced in turn on torch's fake group."""
    topology = Topology.from_config("1d", cp, None)
    total = 0
    for rank in range(cp):
        with fake_rank(topology, rank, torch.float32, 0) as ctx:
            total += count_step(workload, workload.build_model(ctx), shape, ctx, train, seed=0).flops
    return total
