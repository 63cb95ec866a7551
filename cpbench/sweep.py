"""The points a run measures: the product of the sweep lists, each resolved to a full shape."""

from __future__ import annotations

import itertools

from cpbench.core import Shape
from cpbench.settings.schema import BenchConfig, ShapeConfig
from cpbench.settings.validate import workload_samples


def resolve_shape(
    shape: ShapeConfig, n_tokens: int | None = None, n_atoms: int | None = None, msa_depth: int | None = None,
    diffusion_samples: int | None = None,
) -> Shape:  # fmt: skip
    """A point's shape: given values, else `shape.*`; atoms default to atoms_per_token * N."""
    n = n_tokens or shape.n_tokens
    atoms = n_atoms or shape.n_atoms or shape.atoms_per_token * n
    return Shape(n, atoms, msa_depth or shape.msa_depth, diffusion_samples)


def run_shape(settings: BenchConfig, n_tokens: int | None = None) -> Shape:
    """The run's own shape at N (the probe's, a convergence run's): `shape.*`, and the workload's
    diffusion samples where it has a diffusion batch."""
    return resolve_shape(settings.shape, n_tokens, diffusion_samples=workload_samples(settings))


def sweep_points(settings: BenchConfig) -> list[Shape]:
    """The product of the sweep lists, each point once, in order."""
    sweep, samples = settings.sweep, workload_samples(settings)
    axes = (sweep.n_tokens, sweep.n_atoms, sweep.msa_depth, [s or samples for s in sweep.diffusion_samples])
    return list(dict.fromkeys(resolve_shape(settings.shape, *point) for point in itertools.product(*axes)))
