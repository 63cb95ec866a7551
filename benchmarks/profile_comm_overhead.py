"""What `measure.profile_comm=true` costs: the same cpbench run with and without the torch profiler
over its timed steps, interleaved, through `python -m cpbench` (docs/measurement.md has the figures).

    python benchmarks/profile_comm_overhead.py [--pairs 3] [--cp 2] [--n-tokens 64 128] [--workload axial_mix]

axial_mix sends every collective through cpbench's ledger, so each profiled run also gives the
profiler's comm_ms beside the ledger's of the plain run. Prints, per N, the median walltime of each,
the median of the per-pair ratios (profiled / plain) and both comm_ms.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import pandas as pd

FIXED = ["baseline=false", "budget.minutes=null", "probe.enabled=false", "log.progress=false",
         "timing.warmup=2", "timing.warmup_max=2", "timing.repeats=10", "timing.repeats_max=10",
         "memory.cpu_budget_gib=1"]  # fmt: skip


def run(profiled: bool, args: argparse.Namespace, out: Path) -> pd.DataFrame:
    sizes = ",".join(str(n) for n in args.n_tokens)
    command = [sys.executable, "-m", "cpbench", f"workload={args.workload}", f"topology.cp={args.cp}",
               f"sweep.n_tokens=[{sizes}]", f"measure.profile_comm={str(profiled).lower()}", *FIXED,
               f"output_dir={out}"]  # fmt: skip
    subprocess.run(command, check=True, capture_output=True, text=True)
    return pd.read_csv(out / "results.csv").set_index("N_tokens")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--cp", type=int, default=2)
    parser.add_argument("--n-tokens", type=int, nargs="+", default=[64, 128])
    parser.add_argument("--workload", default="axial_mix")
    args = parser.parse_args()
    runs: dict[bool, list[pd.DataFrame]] = {False: [], True: []}
    with tempfile.TemporaryDirectory() as root:
        for i in range(args.pairs):
            for profiled in (False, True) if i % 2 == 0 else (True, False):  # interleaved: drift cancels
                runs[profiled].append(run(profiled, args, Path(root) / f"{i}_{profiled}"))
    for n in args.n_tokens:
        plain = [r.loc[n, "walltime_ms"] for r in runs[False]]
        profiled = [r.loc[n, "walltime_ms"] for r in runs[True]]
        ratios = [p / q for p, q in zip(profiled, plain, strict=True)]
        ledger = statistics.median(r.loc[n, "comm_ms"] for r in runs[False])
        seen = statistics.median(r.loc[n, "comm_ms"] for r in runs[True])
        print(
            f"{args.workload} cp={args.cp} N={n}: walltime {statistics.median(plain):.2f} ms plain, "
            f"{statistics.median(profiled):.2f} ms profiled, ratio {statistics.median(ratios):.3f} "
            f"(pairs {', '.join(f'{r:.3f}' for r in ratios)}); "
            f"comm_ms ledger {ledger:.2f}, profiler {seen:.2f}"
        )


if __name__ == "__main__":
    main()
