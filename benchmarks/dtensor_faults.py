"""The probe of a fold-cp DTensor module (tests/adapters/dtensor_pair.py, 2x2 on CPU) under a CPU budget,
with one rank out of memory inside build_batch's collective or between two of the model's own
collectives: the probe's wall time, its answer, and the longest wait a fault caused: from the failing
rank's out-of-memory error (its log) to its giving up (its error file), bounded by dist.agree_timeout_s;
the ranks are then relaunched and the probe resumes below the failed N.

    python benchmarks/dtensor_faults.py [--agree-timeout 5]

Each case is one `python -m cpbench` run through the real entry point, in a temporary folder."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
CASES = {
    "no fault": None,
    "rank 0 OOM in build_batch": "0:128:batch",
    "rank 1 OOM inside run_step": "1:128:step",
}


def run_case(fault: str | None, agree_timeout: float, folder: Path) -> dict:
    out = folder / "out"
    cmd = [sys.executable, "-m", "cpbench", "workload=adapter", "workload.module=adapters.dtensor_pair",
           "topology.kind=2d", "topology.cp=4", "baseline=false", "budget.minutes=null", "sweep.n_tokens=[]",
           "probe.enabled=true", "probe.start=64", "probe.max_tokens=256", "probe.granularity=32",
           "memory.cpu_budget_gib=1.0", f"dist.agree_timeout_s={agree_timeout:g}", "dist.timeout_s=900",
           "log.progress=false", f"output_dir={out}"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT / "tests")}
    if fault:
        env["CPBENCH_TEST_OOM"] = fault
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=folder, env=env, capture_output=True, text=True, timeout=1800)
    wall = time.perf_counter() - start
    if proc.returncode:
        raise SystemExit(f"{fault}: exit {proc.returncode}\n{proc.stderr[-2000:]}")
    trials = pd.read_csv(out / "probe.csv")
    steps = trials[~trials["point"]]
    frame = pd.read_csv(out / "results.csv")
    answer = frame.loc[frame["kind"] == "max-fit", "N_tokens"].iloc[0]
    return {
        "wall_s": wall,
        "probe_steps": len(steps),
        "max_fit": int(answer),
        "longest_step_s": float(steps["seconds"].max()),
        "fault_wait_s": _fault_wait(out, int(fault.split(":")[0])) if fault else None,
    }


def _fault_wait(out: Path, rank: int) -> float:
    """Seconds from the rank's out-of-memory error to its error file (it gave up waiting for peers)."""
    failed_at = next(
        datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")
        for line in (out / "logs" / f"rank{rank}.log").read_text().splitlines()
        if ": RuntimeError" in line
    )
    errors = (out / "logs" / "launch").glob(f"*/attempt_*/{rank}/error.json")
    return min(datetime.fromtimestamp(e.stat().st_mtime) - failed_at for e in errors).total_seconds()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agree-timeout", type=float, default=5.0)
    args = parser.parse_args()
    print(f"dist.agree_timeout_s={args.agree_timeout:g}; 2x2 DTensor module, CPU cap 1.0 GiB per rank")
    header = f"{'case':<28} {'wall s':>7} {'steps':>5} {'max fit':>7} {'longest step s':>14}"
    print(f"{header} {'fault wait s':>12}")
    for name, fault in CASES.items():
        with tempfile.TemporaryDirectory() as tmp:
            r = run_case(fault, args.agree_timeout, Path(tmp))
        wait = "" if r["fault_wait_s"] is None else f"{r['fault_wait_s']:.1f}"
        print(f"{name:<28} {r['wall_s']:>7.1f} {r['probe_steps']:>5} {r['max_fit']:>7} "
              f"{r['longest_step_s']:>14.1f} {wait:>12}")  # fmt: skip


if __name__ == "__main__":
    main()
