"""The workload interface: three hooks over the core vocabulary (`cpbench.core`), under one of two
step contracts (docs/adapters.md)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
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
    """A CP model as cpbench drives it: three hooks, and optional attributes and hooks that
    `WorkloadTraits` declares with their defaults (cpbench reads them there, never off the workload)."""

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


@dataclass(frozen=True)
class WorkloadTraits:
    """A workload's optional attributes and hooks, each with its default: what a workload leaves out
    is this default, decided here once."""

    name: str  # in rows, plots and logs (default: the class's name)
    contract: Contract = Contract.native
    # True when every collective goes through cpbench.distributed.comm, so comm_ms is complete.
    counts_comm: bool = False
    # True when build_batch reads the user's feature file (`cpbench.inputs.fold_inputs(shape, ctx)`);
    # without it data.path is refused, not ignored.
    takes_inputs: bool = False
    # The job the benchmark stands for, for the what-changed table: `RealSetting`s and `Limitation`s.
    real_job: Sequence[RealSetting | Limitation] = ()
    columns: Callable[[bool], dict] | None = None  # (train) -> settings each results.csv row records
    check_topology: Callable[[Any], None] | None = None  # refuses a topology before any rank starts
    check_device: Callable[[str], None] | None = None  # (device type) refuses a device its ranks cannot use
    # (train) -> the workload with its repeated passes cut to those that set its peak, for a memory trace
    peak_form: Callable[[bool], Any] | None = None
    # (passes) -> the workload with `flop_loops(train)` cut to `passes`, for a FLOP count
    flop_form: Callable[[dict[str, int]], Any] | None = None


def traits(workload: Workload) -> WorkloadTraits:
    """The one place a workload's optional attributes are looked up."""

    def hook(name: str) -> Callable[..., Any] | None:
        found = getattr(workload, name, None)
        return found if callable(found) else None

    return WorkloadTraits(
        name=getattr(workload, "name", type(workload).__name__),
        contract=Contract(getattr(workload, "contract", Contract.native)),
        counts_comm=bool(getattr(workload, "counts_comm", False)),
        takes_inputs=bool(getattr(workload, "takes_inputs", False)),
        real_job=tuple(getattr(workload, "real_job", ())),
        columns=hook("columns"),
        check_topology=hook("check_topology"),
        check_device=hook("check_device"),
        peak_form=hook("peak_form"),
        flop_form=hook("flop_form"),
    )
