"""One input size."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Shape:
    n_tokens: int
    n_atoms: int
    msa_depth: int
    # Diffusion samples per trunk pass, for a workload with a diffusion batch (fold); None: the
    # workload's own count, or none to count.
    diffusion_samples: int | None = None
