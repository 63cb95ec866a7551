"""A complex file, AlphaFold3 JSON or Boltz YAML, read into contract features by its suffix."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from cpbench.inputs.alphafold3 import read_alphafold3
from cpbench.inputs.boltz import read_boltz
from cpbench.inputs.complex import Complex
from cpbench.inputs.tokenize import complex_features

READERS = {".json": read_alphafold3, ".yaml": read_boltz, ".yml": read_boltz}
STRUCTURE_SUFFIXES = tuple(READERS)


def read_complex(path: Path) -> Complex:
    return READERS[path.suffix](path)


def structure_features(path: Path, seed: int) -> tuple[str, dict[str, np.ndarray]]:
    """The complex's name and its features; ligand conformers are drawn from `seed`."""
    complex_ = read_complex(path)
    return complex_.name, complex_features(complex_, seed)
