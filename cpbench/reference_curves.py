"""Write the reference convergence curves (`cpbench.checks.reference_curve`) into docs/reference/:

    python -m cpbench.reference_curves [--steps 100] [--out docs/reference]

runs each configuration of `CONFIGS` through `python -m cpbench` at cp=1 and writes its curve there;
a later convergence run of the same configuration, at any topology, is compared against it."""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from cpbench.checks.reference_curve import REFERENCE_DIR
from cpbench.record import run_record
from cpbench.results.folder import RunFolder

# Three configurations of the cheapest built-in workload: a small, a middle and a large N.
CONFIGS = {
    "axial_mix_n16": ["workload=axial_mix", "shape.n_tokens=16"],
    "axial_mix_n32": ["workload=axial_mix", "shape.n_tokens=32"],
    "axial_mix_n64": ["workload=axial_mix", "shape.n_tokens=64"],
}


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
        prog="python -m cpbench.reference_curves", description="Write the reference curves (cp=1)."
    )
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--out", type=Path, default=REFERENCE_DIR)
    args = parser.parse_args(argv)
    for name, overrides in CONFIGS.items():
        print(f"{name}: {_write(name, overrides, args.steps, args.out)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
