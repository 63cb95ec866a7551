"""What a rank knows about itself, built once by the rank runtime and handed to every hook."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from cpbench.core.topology import Topology


@dataclass
class RankContext:
    """`row_peers` share this rank's token rows (they hold other column blocks), `col_peers` share
    its columns; a peer group of one rank is None."""

    rank: int
    world_size: int
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
        return self.topology.tiling.block_slices(self.coords, n_tokens)
