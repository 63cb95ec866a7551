"""A rank's shard of fold inputs, and the one routine that lays it out for synthesized and file
inputs alike, so that padding and placement cannot differ between the two."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Protocol

import numpy as np
import torch

from cpbench.core import Shape, Topology
from cpbench.inputs.contract import SPECS, atom_block_size, group, padded_tokens


class FeatureSource(Protocol):
    """Where a shard's values come from. Token ranges are global and cover real tokens only
    (0 <= start <= stop <= n_tokens); padding is the builder's business."""

    n_tokens: int  # real tokens
    n_atoms: int  # real atoms
    msa_depth: int

    def atom_prefix(self, tokens: np.ndarray) -> np.ndarray:
        """Real atoms that precede each token (tokens in [0, n_tokens]); int64."""
        ...

    def token_features(self, start: int, stop: int) -> dict[str, np.ndarray]: ...

    def atom_features(self, start: int, stop: int) -> dict[str, np.ndarray]:
        """The atoms of tokens [start, stop), in order."""
        ...

    def msa_features(self, start: int, stop: int) -> dict[str, np.ndarray]: ...

    def fill_token_bonds(self, rows: range, cols: range, out: np.ndarray) -> None:
        """Set out[i - rows.start, j - cols.start] for the bonded real pairs (out starts all False)."""
        ...


@dataclass
class FoldShard:
    """One rank's inputs. Token features come twice: for the rank's row tokens (`row_tokens`,
    [h, ...]) and its column tokens (`col_tokens`, [w, ...]; all N in 1d). `pair` is the [h, w]
    block, `atoms` the atoms of the row tokens padded to `atom_block` (atom_to_token holds global
    token indices), `msa` the [S, h] columns of the row tokens. Sizes: `n_tokens` and `n_atoms`
    are real counts, `*_padded` the padded global extents."""

    topology: Topology
    coords: tuple[int, int]
    rows: slice
    cols: slice
    n_tokens: int
    n_tokens_padded: int
    n_atoms: int
    n_atoms_padded: int
    atom_block: int
    atom_bounds: tuple[int, ...]  # real atoms before each row block, and in all (rows + 1 values)
    msa_depth: int
    row_tokens: dict[str, torch.Tensor] = field(default_factory=dict)
    col_tokens: dict[str, torch.Tensor] = field(default_factory=dict)
    pair: dict[str, torch.Tensor] = field(default_factory=dict)
    atoms: dict[str, torch.Tensor] = field(default_factory=dict)
    msa: dict[str, torch.Tensor] = field(default_factory=dict)

    @property
    def atom_start(self) -> int:
        """Real atoms on the row blocks before this one (the global index of atoms[0] if real)."""
        return self.atom_bounds[self.coords[0]]

    @property
    def shape(self) -> Shape:
        """The real (unpadded) sizes, as results record them."""
        return Shape(n_tokens=self.n_tokens, n_atoms=self.n_atoms, msa_depth=self.msa_depth)

    def tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Every tensor, named `group.feature`; col tokens that alias the row tokens come once."""
        seen: set[int] = set()
        for part in ("row_tokens", "col_tokens", "pair", "atoms", "msa"):
            for name, tensor in getattr(self, part).items():
                if id(tensor) not in seen:
                    seen.add(id(tensor))
                    yield f"{part}.{name}", tensor

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for _, t in self.tensors())

    def to(self, device: torch.device | str) -> FoldShard:
        """A copy on `device` (the CPU tensors stay as they are)."""
        moved = {id(t): t.to(device) for _, t in self.tensors()}
        parts = {
            part: {name: moved[id(t)] for name, t in getattr(self, part).items()}
            for part in ("row_tokens", "col_tokens", "pair", "atoms", "msa")
        }
        return replace(self, **parts)


def _padded(values: np.ndarray, name: str, length: int, axis: int = 0, fill: int = 0) -> np.ndarray:
    """`values` grown with `fill` to `length` along `axis`, in the contract dtype."""
    dtype = SPECS[name].dtype
    if values.dtype != dtype:
        raise TypeError(f"source produced {name} as {values.dtype}, the contract says {dtype}")
    if values.shape[axis] == length:
        return values
    shape = list(values.shape)
    shape[axis] = length
    out = np.full(shape, fill, dtype=dtype)
    out[(slice(None),) * axis + (slice(0, values.shape[axis]),)] = values
    return out


def _checked(features: dict[str, np.ndarray], part: str) -> dict[str, np.ndarray]:
    expected = {spec.name for spec in group(part) if spec.name != "pair_mask"}
    if set(features) != expected:
        raise RuntimeError(
            f"{part} features {sorted(features)} differ from the contract's {sorted(expected)}"
        )
    return features


def _tokens(source: FeatureSource, span: slice) -> dict[str, np.ndarray]:
    stop = min(span.stop, source.n_tokens)
    start = min(span.start, stop)
    real = _checked(source.token_features(start, stop), "token")
    return {name: _padded(values, name, span.stop - span.start) for name, values in real.items()}


def _to_torch(arrays: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
    return {name: torch.from_numpy(np.ascontiguousarray(values)) for name, values in arrays.items()}


def build_shard(source: FeatureSource, topology: Topology, coords: tuple[int, int]) -> FoldShard:
    """Pad, place and generate one rank's shard; only this rank's ranges are asked of `source`."""
    if source.n_tokens < 1:
        raise ValueError("fold inputs need at least one token")
    n_padded = padded_tokens(source.n_tokens, topology.tiling)
    rows, cols = topology.tiling.block_slices(coords, n_padded)
    n = source.n_tokens

    # Atom placement: O(rows) prefix values, not the atom array.
    bounds = np.minimum(np.arange(topology.grid[0] + 1, dtype=np.int64) * (rows.stop - rows.start), n)
    prefix = source.atom_prefix(bounds)
    block = atom_block_size(np.diff(prefix), topology.grid[1])

    row_tokens = _tokens(source, rows)
    col_tokens = row_tokens if cols == rows else _tokens(source, cols)

    real_rows = range(min(rows.start, n), min(rows.stop, n))
    atoms = _checked(source.atom_features(real_rows.start, real_rows.stop), "atom")
    atoms = {
        name: _padded(values, name, block, fill=rows.stop - 1 if name == "atom_to_token" else 0)
        for name, values in atoms.items()
    }
    msa = _checked(source.msa_features(real_rows.start, real_rows.stop), "msa")
    msa = {name: _padded(values, name, rows.stop - rows.start, axis=1) for name, values in msa.items()}

    bonds = np.zeros((rows.stop - rows.start, cols.stop - cols.start), dtype=np.bool_)
    source.fill_token_bonds(real_rows, range(min(cols.start, n), min(cols.stop, n)), bonds)
    pair_mask = row_tokens["token_pad_mask"][:, None] & col_tokens["token_pad_mask"][None, :]

    row_t = _to_torch(row_tokens)
    return FoldShard(
        topology=topology,
        coords=coords,
        rows=rows,
        cols=cols,
        n_tokens=n,
        n_tokens_padded=n_padded,
        n_atoms=source.n_atoms,
        n_atoms_padded=block * topology.grid[0],
        atom_block=block,
        atom_bounds=tuple(int(x) for x in prefix),
        msa_depth=source.msa_depth,
        row_tokens=row_t,
        col_tokens=row_t if col_tokens is row_tokens else _to_torch(col_tokens),
        pair=_to_torch({"token_bonds": bonds, "pair_mask": pair_mask}),
        atoms=_to_torch(atoms),
        msa=_to_torch(msa),
    )
