"""The fake-tensor estimate against real steps on CPU: predicted vs measured per-rank peak (over the
start-up baseline, which is what the memory cap holds) at three N per workload and topology, then the
probe led by the prediction against the plain probe, through the real entry point.

    python benchmarks/predict_check.py [--workloads pairformer_small fold_small] [--n 128 192 256]
                                       [--topologies 1d1 1d2 2d4] [--probe-workload pairformer_small]
                                       [--skip-peaks] [--skip-probe]

The N of cp=1 (`--n`) scale by sqrt(cp) for the other topologies (rounded to 32), so each rank holds
about as much as at cp=1: the range where the probe's edge lies under one per-rank cap. A smaller
N (`--calibrate-at`, scaled the same way) is measured too: its miss calibrates the estimate at the
others, as a probe's walltime points calibrate it (docs/probe.md).
"""

from __future__ import annotations

import argparse
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
import torch
from hydra import compose, initialize_config_module
from hydra.utils import instantiate

from cpbench.core import Topology
from cpbench.probe import predict, trace
from cpbench.settings.schema import ProbeConfig, register
from cpbench.sweep import resolve_shape

TOPOLOGIES = {"1d1": ("1d", 1, "1d cp=1"), "1d2": ("1d", 2, "1d cp=2"), "2d4": ("2d", 4, "2d 2x2")}


def cpbench(args: list[str], out: Path) -> None:
    subprocess.run([sys.executable, "-m", "cpbench", *args, "log.progress=false", f"output_dir={out}"],
                   check=True, capture_output=True)  # fmt: skip


def predicted(workload: str, kind: str, cp: int, ns: list[int]) -> tuple[dict[int, float], dict[int, float]]:
    """The estimate at each N as `cpbench.predict` makes it (the workload's peak form), and the trace
    of every pass of the step (every block, cycle and sampling step), which it must equal."""
    with initialize_config_module("cpbench.configs", version_base=None):
        cfg = compose("config", [f"workload={workload}"])
    topology = Topology.from_config(kind, cp, None)
    shape = lambda n: resolve_shape(cfg.shape, n_tokens=n)  # noqa: E731
    w = instantiate(cfg.workload)
    spec = trace.TraceSpec(train=False, dtype=torch.float32, seed=0, backend="gloo")
    p = predict.predict(w, topology, shape, spec, ProbeConfig(), points=ns)
    ranks, every = trace.traced_ranks(topology), trace.TracedForm(w)
    full = {n: trace.estimate(w, topology, shape(n), spec, ranks, every).peak_gib for n in ns}
    return {e.n: e.peak_gib for e in p.estimates}, full


def measured(workload: str, kind: str, cp: int, ns: list[int], out: Path) -> dict[int, float]:
    cpbench([f"workload={workload}", f"topology.kind={kind}", f"topology.cp={cp}",
             f"sweep.n_tokens=[{','.join(map(str, ns))}]", "probe.enabled=false", "timing.warmup=1",
             "timing.repeats=1", "memory.cpu_budget_gib=8", "budget.minutes=null"], out)  # fmt: skip
    rows = pd.read_csv(out / "results.csv")
    return {int(r.N_tokens): r.peak_mem_gib - r.baseline_gib for r in rows.itertuples()}


def probe(
    workload: str, budget: float, lead: bool, granularity: int, out: Path
) -> tuple[int, float, int, int]:
    start = time.perf_counter()
    cpbench([f"workload={workload}", "topology.cp=2", "sweep.n_tokens=[64]", "probe.start=64",
             f"probe.granularity={granularity}", "probe.measure_at_max=false",
             f"probe.predict={str(lead).lower()}",
             f"memory.cpu_budget_gib={budget}", "timing.warmup=1", "timing.repeats=1"], out)  # fmt: skip
    seconds = time.perf_counter() - start
    trials = pd.read_csv(out / "probe.csv")
    fits, fails = trials[trials["fits"]], trials[~trials["fits"]]
    steps = int((~trials["point"]).sum())  # the walltime point at N=64 is a trial, not a probe step
    return steps, seconds, int(fits["N_tokens"].max()), int(fails["N_tokens"].min())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workloads", nargs="+", default=["pairformer_small", "fold_small"])
    parser.add_argument("--n", type=int, nargs=3, default=[128, 192, 256])
    parser.add_argument("--calibrate-at", type=int, default=64)
    parser.add_argument("--topologies", nargs="+", choices=list(TOPOLOGIES), default=list(TOPOLOGIES))
    parser.add_argument("--probe-workload", default="pairformer_small")
    parser.add_argument("--budget", type=float, default=0.25)
    parser.add_argument("--granularity", type=int, default=32)
    parser.add_argument("--skip-peaks", action="store_true")
    parser.add_argument("--skip-probe", action="store_true")
    args = parser.parse_args()
    register()
    with tempfile.TemporaryDirectory() as tmp:
        if not args.skip_peaks:
            print("| workload | topology | N_tokens | predicted GiB | every pass traced GiB | measured GiB "
                  "over baseline | error | calibrated at N (missed MiB) | calibrated error |")  # fmt: skip
            print("|---|---|---|---|---|---|---|---|---|")
            for workload in args.workloads:
                for kind, cp, label in (TOPOLOGIES[t] for t in args.topologies):
                    at, *ns = (round(n * math.sqrt(cp) / 32) * 32 for n in (args.calibrate_at, *args.n))
                    guess, full = predicted(workload, kind, cp, [at, *ns])
                    real = measured(workload, kind, cp, [at, *ns], Path(tmp) / f"{workload}-{kind}{cp}")
                    missed = real[at] - guess[at]
                    for n in ns:
                        error = (guess[n] - real[n]) / real[n]
                        calibrated = (guess[n] + missed - real[n]) / real[n]
                        cells = (f"{guess[n]:.4f} | {full[n]:.4f} | {real[n]:.4f} | {error:+.1%} | {at} "
                                 f"({missed * 1024:+.1f})")  # fmt: skip
                        print(f"| {workload} | {label} | {n} | {cells} | {calibrated:+.1%} |", flush=True)
        if args.skip_probe:
            return
        print()
        print(f"Probe, {args.probe_workload} inference, 1d cp=2, {args.budget} GiB/rank, "
              f"granularity {args.granularity}:")  # fmt: skip
        print("| search | real probe steps | whole run s | max fit | first OOM |")
        print("|---|---|---|---|---|")
        for lead in (False, True):
            out = Path(tmp) / f"probe-{lead}"
            steps, seconds, best, fail = probe(args.probe_workload, args.budget, lead, args.granularity, out)
            name = "predicted, then confirmed" if lead else "plain"
            print(f"| {name} | {steps} | {seconds:.1f} | {best} | {fail} |", flush=True)


if __name__ == "__main__":
    main()
