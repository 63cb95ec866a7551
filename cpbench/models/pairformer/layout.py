"""Where the pair tensor lives and how the Pairformer ops reach the data they need.

A `PairLayout` wraps a `Grid`: rank (r, c) holds z[R_r, C_c] and s[R_r] (s replicated over the
row group). One rank is the 1 x 1 grid, 1d row slabs the (P, 1) grid, 2d any rows x cols grid;
the op modules are written once against this class and the one-rank math in `ops`.

Schemes (per rank, block = N/rows x N/cols pairs; see docs/pairformer.md for bytes):
- triangle product t = a b^T (outgoing): `a` stays put; for each target column block in ring
  order, the rows of `b` it needs are broadcast over the column group piece by piece, the partial
  product is added to an accumulator that travels the row group's ring (a ring reduce-scatter),
  so a rank never holds more than one block of `b` rows and one accumulator. Incoming is the same
  product on the transposed view of the grid (no data moves for the transpose).
- triangle attention, starting node: queries stay put; the layer-normed pair rows travel the row
  group's ring (keys and values are projected on arrival), the bias is transposed once (it is
  b_jk for query j, so it lives in the transposed block) and its rows for each key slice are
  broadcast over the column group; partial softmaxes merge with a running log-sum-exp. Ending
  node: the same on the transposed view, or on a (P, 1) grid a transpose of z by all-to-all.
- attention with pair bias: the bias rows are local, keys and values come from an all-gather of
  the normalised single features over the column group (O(N c_s) per rank), partials merge over
  the row group with one max and two sum all-reduces.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch.utils.checkpoint import checkpoint

from cpbench.distributed.comm import LEDGER, all_reduce_max, all_reduce_sum, op_label
from cpbench.distributed.grid import Grid, fetch_rows, gather_col_tokens, ring_pass, transpose
from cpbench.models.pairformer import chunking, ops


class PairLayout:
    """Data movement for the Pairformer ops on one grid; `n` is always the global (padded) N."""

    def __init__(self, grid: Grid | None = None):
        self.grid = grid or Grid.single()

    def __repr__(self) -> str:
        g = self.grid
        return f"PairLayout({g.rows}x{g.cols} at ({g.r}, {g.c}))"

    def rows(self, n: int) -> range:
        return self.grid.my_rows(n)

    def cols(self, n: int) -> range:
        return self.grid.my_cols(n)

    def pair_mask(self, mask: torch.Tensor) -> torch.Tensor:
        """[N/rows, N/cols] mask of my pairs from the global token mask [N]."""
        rows, cols = self.rows(mask.shape[0]), self.cols(mask.shape[0])
        return mask[rows.start : rows.stop, None] * mask[None, cols.start : cols.stop]

    @property
    def single(self) -> bool:
        """One rank: every key of an attention is here at once, so the ops take a plain softmax,
        the same math as merging partials, with nothing moved."""
        return self.grid.size == 1

    def transposed(self) -> PairLayout:
        """The layout of z^T when each rank reads its own block transposed (no communication)."""
        return PairLayout(self.grid.transposed())

    @property
    def transposes_by_data(self) -> bool:
        """Triangle attention's ending node moves z rather than keys: cheaper on a (P, 1) grid,
        where the transposed view would ring every key row through all P ranks."""
        return self.grid.cols == 1 and self.grid.rows > 1

    def transpose(self, x: torch.Tensor, n: int) -> torch.Tensor:
        """My block of x^T on this same grid."""
        return transpose(x, self.grid, n)

    def triangle_out(
        self, a: torch.Tensor, b: torch.Tensor, n: int, chunk_size: int | str | None = None
    ) -> torch.Tensor:
        """My block of t_ij = sum_k a_ik b_jk, from my blocks of a and b; with `chunk_size` (inference),
        the rows of b fetched from peers come a chunk at a time.

        With autograd recording, the rows of b fetched from peers are fetched again in the
        backward instead of being kept: kept, they would add up to b[:, C_c] (all of b in 1d).
        """
        g = self.grid
        acc = None
        for step in range(g.cols):
            target = g.col_block((g.c + step + 1) % g.cols, n)  # ends with my own column block
            # The running sum moves on before this step's part is made: the one sent is freed first.
            acc = None if acc is None else ring_pass(acc, g)
            if g.col_group is not None and torch.is_grad_enabled():
                part = _recomputed(self._partial_product, a, b, target, n)
            else:
                part = self._partial_product(a, b, target, n, chunk_size)
            if acc is None:
                acc = part
            elif torch.is_grad_enabled():
                acc = acc + part
            else:
                acc += part  # received into a buffer of its own: no copy of the sum
            del part
        return acc

    def _partial_product(
        self, a: torch.Tensor, b: torch.Tensor, rows: range, n: int, chunk_size: int | str | None = None
    ) -> torch.Tensor:
        """a_ik b_jk summed over my column tokens k, for the output columns j in `rows`. Each fetched
        piece of b (a chunk of rows under `chunk_size`) is multiplied into its columns of the output
        and dropped: in 1d, b whole, or a peer's whole slab, would be an N^2 c floor that no CP size
        lowers."""
        out = None
        for chunk in chunking.row_slices(len(rows), chunk_size, b.shape[1] * b.shape[2]):
            wanted = range(rows.start + chunk.start, rows.start + chunk.stop)
            for part, piece in fetch_rows(b, wanted, self.grid, n):
                product = ops.triangle_out(a, piece)
                if len(part) == len(rows):
                    return product
                if out is None:
                    out = product.new_empty(a.shape[0], len(rows), product.shape[-1])
                out[:, part.start - rows.start : part.stop - rows.start] = product
                del piece, product
        return out

    def key_ranges(self, n: int) -> list[range]:
        """The key column blocks in the order `key_blocks` visits them (mine first)."""
        g = self.grid
        return [g.col_block((g.c + step) % g.cols, n) for step in range(g.cols)]

    def key_blocks(self, x: torch.Tensor, n: int) -> Iterator[tuple[range, torch.Tensor]]:
        """x[R_r, K] for every key column block K in turn (mine first), passed around the row ring."""
        for step, keys in enumerate(self.key_ranges(n)):
            if step:
                x = ring_pass(x, self.grid)
            yield keys, x

    def fetch_rows(self, x: torch.Tensor, rows: range, n: int) -> Iterator[tuple[range, torch.Tensor]]:
        """x[rows, C_c] from my column group, as (global rows, piece) pairs."""
        return fetch_rows(x, rows, self.grid, n)

    def col_tokens(self, a: torch.Tensor, n: int) -> torch.Tensor:
        """Per-token features of my column tokens from those of my row tokens."""
        return gather_col_tokens(a, self.grid, n)

    def merge_row_group(self, part: ops.Partial) -> ops.Partial:
        """Merge the attention partials of my row group (each over its own key block)."""
        group = self.grid.row_group
        if group is None:
            return part
        m = all_reduce_max(part.m, group)
        scale = torch.exp(part.m - m)
        return ops.Partial(all_reduce_sum(part.o * scale, group), all_reduce_sum(part.l * scale, group), m)


def _recomputed(fn, *args):
    """fn(*args), run again in the backward rather than keeping its intermediates; the transfers of
    that second run count under the op's `.bwd` label."""
    label = LEDGER.label
    runs = []

    def run(*inputs):
        with op_label(label + ".bwd" if runs else label):
            runs.append(True)
            return fn(*inputs)

    return checkpoint(run, *args, use_reentrant=False)
