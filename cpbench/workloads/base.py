"""The workload interface: three hooks over the core vocabulary (`cpbench.core`), under one of two
step contracts (docs/adapters.md)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any, Protocol

import torch

from cpbench.core import RankContext, Shape


class Contract(str, Enum):
    # run_step returns this rank's loss share in training; the driver runs backward, sums replicated
    # gradients over the ranks and steps AdamW. One batch per point.
    native = "native"
    # The fold-cp driver's: run_step does the whole step (train: forward, backward, optimizer step) and
    # may return anything; build_batch runs before every warm-up and timed step, outside the timer.
    foldcp = "foldcp"


class Workload(Protocol):
    """A CP model as cpbench drives it. Optional attributes and hooks: `contract` (default native),
    `columns(train) -> dict` (settings results.csv records in each of its rows), `check_topology(
    topology)` (refuse a topology before any rank starts), `counts_comm` (True when every collective
    goes through cpbench.distributed.comm, so comm_ms is complete), `real_job` (a sequence of
    `RealSetting` and `Limitation`: the job the benchmark stands for, for the what-changed table),
    `takes_inputs` (True when build_batch reads the user's feature file, `cpbench.inputs.fold_inputs(
    shape, ctx)`; without it data.path is refused, not ignored)."""

    name: str

    def build_model(self, ctx: RankContext) -> torch.nn.Module: ...

    def build_batch(self, shape: Shape, ctx: RankContext) -> Any: ...

    def run_step(self, model: torch.nn.Module, batch: Any, train: bool) -> Any: ...


@dataclass(frozen=True)
class RealSetting:
    """How the real job a workload stands for sets some of its config keys (`workload.<key>`), for the
    what-changed table: `keys` maps each key (dotted) to the real job's value. `scales`: the job's time
    grows in proportion to the value (a loop count), so a measured time can be scaled to it.
    `workflow`: the workflow the real value is for (None: both)."""

    keys: dict[str, Any]
    what: str
    why: str
    scales: bool = False
    workflow: str | None = None
    setting: str | None = None  # the setting that controls it, when not `<section>.<key>`
    section: str = "workload"  # the config section the keys are in (`sweep` for the job's N_tokens)


@dataclass(frozen=True)
class Limitation:
    """A way the benchmark differs from the real job that no setting changes (an edit to the code would)."""

    what: str
    benchmark: Any
    real: Any
    why: str
    workflow: str | None = None
