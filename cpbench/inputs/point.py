"""A run's input file as the point it measures and the columns its rows record: the input's name, its
chain count and MSA rows beside the real N_tokens, N_atoms and S (capped by `data.msa_depth`).
Read once per process and seed: a complex's ligand conformers take RDKit a moment."""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache
from pathlib import Path
from typing import Any

from cpbench.core import Shape
from cpbench.inputs.files import FoldFeatures, load_features


@lru_cache(maxsize=8)
def _cached(path: str, mtime_ns: int, seed: int) -> FoldFeatures:
    return load_features(path, seed=seed)


def read_input(path: str, seed: int) -> FoldFeatures:
    """The features of `path` (any data.path format), read again only when the file changes."""
    file = Path(path)
    return _cached(path, file.stat().st_mtime_ns if file.is_file() else -1, seed)


def input_point(path: str, seed: int, msa_depth: int | None) -> Shape:
    """The one point a run on `path` measures: its real sizes, S capped at `msa_depth` when set."""
    shape = read_input(path, seed).shape
    return shape if msa_depth is None else replace(shape, msa_depth=min(shape.msa_depth, msa_depth))


def input_columns(path: str | None, seed: int) -> dict[str, Any]:
    """What a results row records of its input (none without one): name, chains, the MSA's own rows
    (MSA_depth is what was run, after the cap)."""
    if not path:
        return {}
    features = read_input(path, seed)
    return {"input": features.name or "", "chains": features.n_chains, "input_msa_depth": features.msa_depth}
