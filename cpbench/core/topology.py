"""How CP ranks tile the N x N pair tensor, defined once: the degrees and their checks
(`Topology.from_config`) and the block arithmetic (`Tiling`) that the mesh, the inputs, the ops
and the probe all use."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

from cpbench.core.errors import ConfigError


class TopologyKind(str, Enum):
    one_d = "1d"  # CP ranks shard token rows
    two_d = "2d"  # a rows x cols grid shards both pair axes

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Tiling:
    """`rows` row blocks x `cols` column blocks of equal size over N tokens. Block (r, c) holds
    token rows R_r and columns C_c. A 1d row-slab layout is (P, 1); one rank is (1, 1)."""

    rows: int
    cols: int

    @property
    def size(self) -> int:
        return self.rows * self.cols

    @property
    def multiple(self) -> int:
        """The N every tiled N is a multiple of (workloads pad to it)."""
        return math.lcm(self.rows, self.cols)

    def accepts(self, n_tokens: int) -> bool:
        return n_tokens % self.rows == 0 and n_tokens % self.cols == 0

    def row_block(self, i: int, n: int) -> range:
        h = n // self.rows
        return range(i * h, (i + 1) * h)

    def col_block(self, j: int, n: int) -> range:
        w = n // self.cols
        return range(j * w, (j + 1) * w)

    def block(self, coords: tuple[int, int], n: int) -> tuple[range, range]:
        """The global (rows, cols) token ranges of the block at `coords`."""
        r, c = coords
        if not (0 <= r < self.rows and 0 <= c < self.cols):
            raise ValueError(f"coords {coords} outside the {self.rows}x{self.cols} grid")
        return self.row_block(r, n), self.col_block(c, n)

    def block_slices(self, coords: tuple[int, int], n: int) -> tuple[slice, slice]:
        """`block` as slices, for indexing."""
        rows, cols = self.block(coords, n)
        return slice(rows.start, rows.stop), slice(cols.start, cols.stop)

    def transposed(self) -> Tiling:
        return Tiling(self.cols, self.rows)


def squarest_grid(cp: int) -> tuple[int, int]:
    rows = max(r for r in range(1, math.isqrt(cp) + 1) if cp % r == 0)
    return rows, cp // rows


@dataclass(frozen=True)
class Topology:
    """The parallel degrees of a run: `cp` ranks as a `grid` of (rows, cols) blocks."""

    kind: TopologyKind
    cp: int
    grid: tuple[int, int]  # (cp, 1) for 1d; (rows, cols) for 2d

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", TopologyKind(self.kind))
        object.__setattr__(self, "grid", tuple(self.grid))

    @staticmethod
    def from_config(kind: str, cp: int, grid: Sequence[int] | None = None) -> Topology:
        """The topology of `topology.kind/cp/grid`, or a ConfigError naming the setting."""
        if not isinstance(cp, int) or cp < 1:
            raise ConfigError(f"topology.cp={cp}: must be an integer >= 1")
        try:
            kind = TopologyKind(kind)
        except ValueError:
            raise ConfigError(f"topology.kind={kind}: allowed values are 1d, 2d") from None
        if kind is TopologyKind.one_d:
            if grid is not None:
                raise ConfigError(
                    f"topology.grid={list(grid)}: only for topology.kind=2d (1d shards token rows)"
                )
            return Topology(kind, cp, (cp, 1))
        if grid is None:
            return Topology(kind, cp, squarest_grid(cp))
        grid = list(grid)
        if len(grid) != 2 or min(grid) < 1 or grid[0] * grid[1] != cp:
            raise ConfigError(
                f"topology.grid={grid}: must be [rows, cols] of positive integers whose product is "
                f"topology.cp={cp}"
            )
        return Topology(kind, cp, (grid[0], grid[1]))

    @property
    def tiling(self) -> Tiling:
        return Tiling(*self.grid)

    @property
    def label(self) -> str:
        return "1d" if self.kind is TopologyKind.one_d else f"2d {self.grid[0]}x{self.grid[1]}"

    @property
    def grid_label(self) -> str:
        return f"{self.grid[0]}x{self.grid[1]}"

    def accepts(self, n_tokens: int) -> bool:
        """Whether N tokens tile the grid evenly (workloads pad to this multiple)."""
        return self.tiling.accepts(n_tokens)
