"""Reference convergence curves: cp=1 curves of the built-in workloads kept in the repository under
docs/reference/, one CSV per configuration, named by the key of the settings that decide a curve
(workload, dtype, shape, seed, optimizer; not the topology, which must not change it).

    python -m cpbench.report.reference [--steps 100] [--out docs/reference]

runs each configuration of `CONFIGS` through `python -m cpbench` at cp=1 and writes its curve there;
a later convergence run of the same configuration, at any topology, is compared against it."""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pandas as pd

import cpbench
from cpbench.record import run_record
from cpbench.results.folder import RunFolder
from cpbench.settings.identity import curve_key
from cpbench.settings.schema import BenchConfig

REFERENCE_DIR = Path(cpbench.__file__).resolve().parent.parent / "docs" / "reference"
# Three configurations of the cheapest built-in workload: a small, a middle and a large N.
CONFIGS = {
    "axial_mix_n16": ["workload=axial_mix", "shape.n_tokens=16"],
    "axial_mix_n32": ["workload=axial_mix", "shape.n_tokens=32"],
    "axial_mix_n64": ["workload=axial_mix", "shape.n_tokens=64"],
}


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


def _write(name: str, overrides: list[str], steps: int, out: Path) -> Path:
    with tempfile.TemporaryDirectory() as temp:
        run = Path(temp) / name
        cmd = [sys.executable, "-m", "cpbench", *overrides, "workflow=convergence", "topology.cp=1",
               f"convergence.steps={steps}", "log.progress=false",
               f"output_dir={run}"]  # fmt: skip
        subprocess.run(cmd, check=True)
        key = run_record.read(RunFolder(run)).convergence.curve_key
        out.mkdir(parents=True, exist_ok=True)
        for old in out.glob(f"{name}_*.csv"):
            old.unlink()
        target = out / f"{name}_{key}.csv"
        shutil.copyfile(RunFolder(run).convergence, target)
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m cpbench.report.reference", description="Write the reference curves (cp=1)."
    )
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--out", type=Path, default=REFERENCE_DIR)
    args = parser.parse_args(argv)
    for name, overrides in CONFIGS.items():
        print(f"{name}: {_write(name, overrides, args.steps, args.out)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
