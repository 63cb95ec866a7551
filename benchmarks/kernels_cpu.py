"""The attention kernels on CPU (docs/kernels.md): fold_small with `workload.kernels=reference` and
`sdpa`, in inference and training, at N_tokens 128 and 256, at cp=1 (the baseline) and 1d cp=2, each
point's step time (median of the repeats) and peak memory above the rank's baseline. One run at a
time, through the real entry point, taking the kernels in turn so that both see the same machine.

    python benchmarks/kernels_cpu.py [OUT]        (OUT: where the runs go, default kernels_cpu)

Prints the markdown table docs/kernels.md holds. About 15 minutes on 2 cores."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd

KERNELS = ("reference", "sdpa")
WORKFLOWS = ("inference", "training")
# Room for N=256 in training and no trimmed plan; the sizes measured, no probe.
FIXED = ["sweep.n_tokens=[128,256]", "probe.enabled=false", "memory.cpu_budget_gib=16", "budget.minutes=null",
         "timing.repeats=3"]  # fmt: skip


def run(out: Path, workflow: str, kernels: str) -> pd.DataFrame:
    folder = out / f"{workflow}-{kernels}"
    cmd = [sys.executable, "-m", "cpbench", f"output_dir={folder}", f"workflow={workflow}",
           f"workload.kernels={kernels}", *FIXED]  # fmt: skip
    subprocess.run(cmd, check=True)
    rows = pd.read_csv(folder / "results.csv")
    return rows[(rows["kind"] == "point") & rows["failure"].isna()].assign(workflow=workflow, kernels=kernels)


def main() -> None:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "kernels_cpu").resolve()
    rows = pd.concat([run(out, w, k) for w in WORKFLOWS for k in KERNELS], ignore_index=True)
    rows["peak_gib"] = rows["peak_mem_gib"] - rows["baseline_gib"].fillna(0.0)
    table = rows.pivot_table(index=["workflow", "cp", "N_tokens"], columns="kernels",
                             values=["walltime_ms", "peak_gib"])  # fmt: skip
    print("| workflow | cp | N | reference step ms | sdpa step ms | reference peak GiB | sdpa peak GiB |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for (workflow, cp, n), r in table.iterrows():
        ms, gib = r["walltime_ms"], r["peak_gib"]
        print(f"| {workflow} | {cp} | {n} | {ms['reference']:,.0f} | {ms['sdpa']:,.0f} | "
              f"{gib['reference']:.3f} | {gib['sdpa']:.3f} |")  # fmt: skip


if __name__ == "__main__":
    main()
