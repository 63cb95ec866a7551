"""The workload interface: three hooks, and the context every hook receives."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh


@dataclass(frozen=True)
class Topology:
    """How CP ranks tile the N x N pair tensor: `grid` row blocks x column blocks."""

    kind: str  # "1d" | "2d"
    cp: int
    grid: tuple[int, int]  # (cp, 1) for 1d; (rows, cols) for 2d

    @property
    def label(self) -> str:
        return "1d" if self.kind == "1d" else f"2d {self.grid[0]}x{self.grid[1]}"

    def accepts(self, n_tokens: int) -> bool:
        """Whether N tokens tile the grid evenly (workloads pad to this multiple)."""
        rows, cols = self.grid
        return n_tokens % rows == 0 and n_tokens % cols == 0


@dataclass(frozen=True)
class Shape:
    n_tokens: int
    n_atoms: int
    msa_depth: int


@dataclass
class RankContext:
    """What a rank knows about itself. `row_peers` share this rank's token rows (they hold other
    column blocks), `col_peers` share its columns; a peer group of one rank is None."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    mesh: DeviceMesh
    topology: Topology
    dtype: torch.dtype
    seed: int
    coords: tuple[int, int]
    row_peers: dist.ProcessGroup | None
    col_peers: dist.ProcessGroup | None
    data_path: str | None = None  # a user's feature file; None: inputs are synthesized from the seed

    def block(self, n_tokens: int) -> tuple[slice, slice]:
        """The global [rows, cols] token ranges of this rank's pair block."""
        rows, cols = self.topology.grid
        r, c = self.coords
        h, w = n_tokens // rows, n_tokens // cols
        return slice(r * h, (r + 1) * h), slice(c * w, (c + 1) * w)


class Workload(Protocol):
    """A CP model as cpbench drives it. `run_step(train=True)` returns the loss for the driver to
    backpropagate (or None when the step did its own backward); inference returns an output."""

    name: str

    def build_model(self, ctx: RankContext) -> torch.nn.Module: ...

    def build_batch(self, shape: Shape, ctx: RankContext) -> Any: ...

    def run_step(self, model: torch.nn.Module, batch: Any, train: bool) -> torch.Tensor | None: ...

    # Optional: `columns(train) -> dict` names settings that results.csv records in each row of
    # this workload (the fold workload's sampling steps and recycles).
