"""The reference convergence curve a run is compared with: cp=1 curves of the built-in workloads kept in
the repository under docs/reference/, one CSV per configuration, named by the key of the settings that
decide a curve (workload, dtype, shape, seed, optimizer; not the topology, which must not change it);
`python -m cpbench.reference_curves` writes them."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

import cpbench
from cpbench.results.folder import RunFolder
from cpbench.settings.identity import curve_key
from cpbench.settings.schema import BenchConfig

REFERENCE_DIR = Path(cpbench.__file__).resolve().parent.parent / "docs" / "reference"


def find(key: str, directory: Path = REFERENCE_DIR) -> Path | None:
    """The reference curve of a configuration, by its key."""
    found = sorted(directory.glob(f"*_{key}.csv")) if directory.is_dir() else []
    return found[0] if found else None


def lookup(
    settings: BenchConfig, folder: RunFolder, baseline: RunFolder | None = None
) -> tuple[Path, pd.DataFrame] | None:
    """The curve a run is compared with: convergence.reference (a convergence.csv or a run folder
    holding one), else this configuration's curve under docs/reference/, else the cp=1 baseline's
    curve beside the run; None when there is none."""
    given = settings.convergence.reference
    if given is not None:
        path = Path(given)
        path = RunFolder(path).convergence if path.is_dir() else path
    else:
        path = find(curve_key(settings)) or (baseline.convergence if baseline is not None else None)
    if path is None or path.resolve() == folder.convergence.resolve() or not path.exists():
        return None
    return path, pd.read_csv(path)
