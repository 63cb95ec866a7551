"""Block data movement on a rows x cols grid of ranks that tiles an N x N pair tensor.

Rank (r, c) holds the block X[R_r, C_c]: token rows R_r (N/rows of them) and columns C_c (N/cols).
A 1d row-slab layout is the grid (P, 1); one rank is (1, 1), where every helper here is a plain
local operation, so one code path serves one rank, 1d and 2d. Every transfer goes through
`cpbench.distributed.comm` (autograd, byte ledger).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch._subclasses.fake_tensor import unset_fake_temporarily

from cpbench.core import RankContext, Tiling
from cpbench.distributed.comm import all_gather, all_to_all_v, broadcast, send_recv


def _overlap(a: range, b: range) -> range:
    return range(max(a.start, b.start), max(max(a.start, b.start), min(a.stop, b.stop)))


@dataclass(frozen=True)
class Grid:
    """This rank's place on the grid. `row_group` holds the ranks sharing my token rows (they vary
    the column block), `col_group` those sharing my columns; a group of one rank is None."""

    rows: int
    cols: int
    r: int
    c: int
    ranks: tuple[tuple[int, ...], ...]  # global rank at [row block][col block]
    row_group: dist.ProcessGroup | None = None
    col_group: dist.ProcessGroup | None = None
    world: dist.ProcessGroup | None = None  # all grid ranks; None on one rank

    @staticmethod
    def single() -> Grid:
        return Grid(rows=1, cols=1, r=0, c=0, ranks=((0,),))

    @staticmethod
    def from_context(ctx: RankContext) -> Grid:
        """The grid of a `RankContext` (its mesh, coordinates and peer groups)."""
        rows, cols = ctx.topology.grid
        if rows * cols == 1:
            return Grid.single()
        if dist.get_world_size() != rows * cols:
            world = dist.get_world_size()
            raise ValueError(f"grid {rows}x{cols} needs a world of {rows * cols} ranks, not {world}")
        with unset_fake_temporarily():  # the ranks are real even while a step is traced (probe.predict)
            table = ctx.mesh.mesh.reshape(rows, cols).tolist()
        return Grid(
            rows=rows,
            cols=cols,
            r=ctx.coords[0],
            c=ctx.coords[1],
            ranks=tuple(tuple(int(x) for x in row) for row in table),
            row_group=ctx.row_peers,
            col_group=ctx.col_peers,
            world=dist.group.WORLD,
        )

    @property
    def tiling(self) -> Tiling:
        return Tiling(self.rows, self.cols)

    @property
    def size(self) -> int:
        return self.tiling.size

    def row_block(self, i: int, n: int) -> range:
        return self.tiling.row_block(i, n)

    def col_block(self, j: int, n: int) -> range:
        return self.tiling.col_block(j, n)

    def my_rows(self, n: int) -> range:
        return self.row_block(self.r, n)

    def my_cols(self, n: int) -> range:
        return self.col_block(self.c, n)

    def transposed(self) -> Grid:
        """The same ranks seen as tiling X^T: my block X[R_r, C_c] read transposed is X^T[C_c, R_r],
        at (c, r) of a cols x rows grid whose row group is my column group."""
        return Grid(
            rows=self.cols,
            cols=self.rows,
            r=self.c,
            c=self.r,
            ranks=tuple(zip(*self.ranks, strict=True)),
            row_group=self.col_group,
            col_group=self.row_group,
            world=self.world,
        )


def row_slice(x: torch.Tensor, start: int, stop: int, dim: int = 0) -> torch.Tensor:
    """x[start:stop] along dim, or x itself when that is all of it: a full slice would still cost
    a zero-filled copy of x in the backward (slice_backward)."""
    if start == 0 and stop == x.shape[dim]:
        return x
    return x.narrow(dim, start, stop - start)


def fetch_rows(x: torch.Tensor, rows: range, grid: Grid, n: int) -> Iterator[tuple[range, torch.Tensor]]:
    """Rows `rows` of my column block, X[rows, C_c], as (global row range, piece) pairs in row order.

    The pieces live on my column group (each rank holds R_r' x C_c); each owner broadcasts its part
    over the group, so every rank of the group must ask for the same `rows` at the same time and take
    every piece. A piece is fetched when it is asked for: a caller that consumes them one at a time
    holds one, not all of them (in 1d, all of them would be the whole of X).
    """
    for owner in range(grid.rows):
        block = grid.row_block(owner, n)
        part = _overlap(block, rows)
        if not len(part):
            continue
        if grid.col_group is None:
            yield part, row_slice(x, part.start - block.start, part.stop - block.start)
            continue
        mine = x[part.start - block.start : part.stop - block.start] if owner == grid.r else x[: len(part)]
        yield part, broadcast(mine, grid.ranks[owner][grid.c], grid.col_group)


def ring_pass(x: torch.Tensor, grid: Grid) -> torch.Tensor:
    """One step along my row group's ring: send to column block c-1, receive from c+1."""
    if grid.cols == 1:
        return x
    dst = grid.ranks[grid.r][(grid.c - 1) % grid.cols]
    src = grid.ranks[grid.r][(grid.c + 1) % grid.cols]
    return send_recv(x, dst, src)


def transpose(x: torch.Tensor, grid: Grid, n: int) -> torch.Tensor:
    """My block of X^T on the same grid: X^T[R_r, C_c] = X[C_c, R_r]^T (first two dims swapped).

    One uneven all-to-all: every rank sends each other rank the part of its block that lands there.
    A square grid pairs (r, c) with (c, r); a (P, 1) grid is the row-slab <-> column-slab exchange.
    """
    if grid.size == 1:
        return x.transpose(0, 1)
    my_rows, my_cols = grid.my_rows(n), grid.my_cols(n)
    tail = tuple(x.shape[2:])
    pieces, shapes = [], []
    for i in range(grid.rows):
        for j in range(grid.cols):
            # Rank (i, j) needs X[C_j, R_i]: the part of my block with rows in C_j, columns in R_i.
            rs, cs = _overlap(my_rows, grid.col_block(j, n)), _overlap(my_cols, grid.row_block(i, n))
            pieces.append(x[rs.start - my_rows.start : rs.stop - my_rows.start,
                            cs.start - my_cols.start : cs.stop - my_cols.start])  # fmt: skip
            # Rank (i, j) sends me X[R_i ∩ C_c, C_j ∩ R_r].
            ri, cj = _overlap(grid.row_block(i, n), my_cols), _overlap(grid.col_block(j, n), my_rows)
            shapes.append((len(ri), len(cj), *tail))
    order = [grid.ranks[i][j] for i in range(grid.rows) for j in range(grid.cols)]
    slots = sorted(range(len(order)), key=order.__getitem__)  # the exchange runs in global rank order
    received = all_to_all_v([pieces[k] for k in slots], [shapes[k] for k in slots], grid.world)
    from_position = dict(zip(slots, received, strict=True))
    out_rows = []
    for j in range(grid.cols):
        # Output rows R_r ∩ C_j came from column block j; their columns C_c ∩ R_i from row block i.
        if not len(_overlap(grid.col_block(j, n), my_rows)):
            continue
        parts = [from_position[i * grid.cols + j].transpose(0, 1) for i in range(grid.rows)
                 if len(_overlap(grid.row_block(i, n), my_cols))]  # fmt: skip
        out_rows.append(torch.cat(parts, dim=1))
    return torch.cat(out_rows, dim=0)


def gather_col_tokens(a: torch.Tensor, grid: Grid, n: int) -> torch.Tensor:
    """Per-token features of my column block C_c, given those of my row block R_r (replicated over
    my row group): an all-gather over the column group, which together holds every row block."""
    cols = grid.my_cols(n)
    if grid.col_group is None:  # one row block: `a` already covers every token
        return a[cols.start : cols.stop]
    gathered = all_gather(a, grid.col_group).unflatten(0, (grid.rows, -1))  # group-rank order
    position = [dist.get_group_rank(grid.col_group, grid.ranks[i][grid.c]) for i in range(grid.rows)]
    full = gathered[position].flatten(0, 1)  # row-block order
    return full[cols.start : cols.stop]
