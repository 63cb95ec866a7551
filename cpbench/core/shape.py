"""One input size."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Shape:
    n_tokens: int
    n_atoms: int
    msa_depth: int
