"""Probe steps and probe wall time, guided by the peak-memory model vs plain bisection, on CPU under
per-rank budgets, through the real entry point.

    python benchmarks/probe_guided.py [--budgets 0.25 0.5] [--cp 2] [--granularity 16]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd


def probe(budget: float, guided: bool, cp: int, granularity: int, out: Path) -> tuple[int, float, int, int]:
    start = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "cpbench", f"topology.cp={cp}", "sweep.n_tokens=[]", "probe.enabled=true",
         "probe.start=128", f"probe.granularity={granularity}", "probe.measure_at_max=false",
         f"probe.guided={str(guided).lower()}", f"memory.cpu_budget_gib={budget}", "log.progress=false",
         f"output_dir={out}"],
        check=True, capture_output=True,
    )  # fmt: skip
    seconds = time.perf_counter() - start
    trials = pd.read_csv(out / "probe.csv")
    fits, fails = trials[trials["fits"]], trials[~trials["fits"]]
    return len(trials), seconds, int(fits["N_tokens"].max()), int(fails["N_tokens"].min())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--budgets", type=float, nargs="+", default=[0.25, 0.5])
    parser.add_argument("--cp", type=int, default=2)
    parser.add_argument("--granularity", type=int, default=16)
    args = parser.parse_args()
    print("| budget GiB/rank | search | probe steps | probe wall s (whole run) | max fit | first OOM |")
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for budget in args.budgets:
            for guided in (False, True):
                out = Path(tmp) / f"{budget}-{guided}"
                steps, seconds, best, fail = probe(budget, guided, args.cp, args.granularity, out)
                name = "guided" if guided else "plain"
                print(f"| {budget} | {name} | {steps} | {seconds:.1f} | {best} | {fail} |", flush=True)


if __name__ == "__main__":
    main()
