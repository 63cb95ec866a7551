"""The points a run measures: the product of the sweep lists, each resolved to a full shape."""

from __future__ import annotations

import itertools

from cpbench.core import Shape
from cpbench.settings.schema import ShapeConfig, SweepConfig


def resolve_shape(
    shape: ShapeConfig, n_tokens: int | None = None, n_atoms: int | None = None, msa_depth: int | None = None
) -> Shape:
    """A point's shape: given values, else `shape.*`; atoms default to atoms_per_token * N."""
    n = n_tokens or shape.n_tokens
    atoms = n_atoms or shape.n_atoms or shape.atoms_per_token * n
    return Shape(n_tokens=n, n_atoms=atoms, msa_depth=msa_depth or shape.msa_depth)


def sweep_points(shape: ShapeConfig, sweep: SweepConfig) -> list[Shape]:
    """The product of the sweep lists, each point once, in order."""
    points = [
        resolve_shape(shape, n, a, s)
        for n, a, s in itertools.product(sweep.n_tokens, sweep.n_atoms, sweep.msa_depth)
    ]
    return list(dict.fromkeys(points))
