"""The fake-tensor estimate against real steps on CPU: predicted vs measured per-rank peak (over the
start-up baseline, which is what the memory cap holds) at five N per workload, workflow and topology,
with the estimate's signed error, its worst, and its under-prediction rate (how often it said "fits"
at a cap the step then ran over); then the probe led by the prediction against the plain probe, through
the real entry point.

    python benchmarks/predict_check.py [--workloads pairformer_small fold_small]
                                       [--workflows inference training] [--n 96 128 160 192 256]
                                       [--train-n 32 48 64 80 96] [--topologies 1d1 1d2 2d4]
                                       [--probe-workload pairformer_small] [--skip-peaks] [--skip-probe]
                                       [--write-docs] [--table-from LOG]

The N of cp=1 (`--n`, `--train-n`) scale by sqrt(cp) for the other topologies (rounded to 16), so each
rank holds about as much as at cp=1: the range where the probe's edge lies under one per-rank cap. A
smaller N (`--calibrate-at`, `--train-calibrate-at`, scaled the same way) is measured too; each N's
estimate is calibrated by the miss at the N measured below it, as the probe calibrates its next step by
its largest fit so far (docs/probe.md).
`--write-docs` writes the table and its summary into docs/probe.md, between its markers; with
`--table-from LOG` from the rows a run printed (one cut short).
"""

from __future__ import annotations

import argparse
import math
import statistics
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


def predicted(
    workload: str, workflow: str, kind: str, cp: int, ns: list[int]
) -> tuple[dict[int, float], dict[int, float]]:
    """The estimate at each N as `cpbench.predict` makes it (the workload's peak form), and the trace
    of every pass of the step (every block, cycle and sampling step), which it must equal."""
    with initialize_config_module("cpbench.configs", version_base=None):
        cfg = compose("config", [f"workload={workload}", f"workflow={workflow}"])
    topology = Topology.from_config(kind, cp, None)
    shape = lambda n: resolve_shape(cfg.shape, n_tokens=n)  # noqa: E731
    w = instantiate(cfg.workload)
    train = workflow == "training"
    spec = trace.TraceSpec(train=train, dtype=torch.float32, seed=0, backend="gloo")
    p = predict.predict(w, topology, shape, spec, ProbeConfig(), points=ns)
    ranks, every = trace.traced_ranks(topology), trace.TracedForm(w)
    full = {n: trace.estimate(w, topology, shape(n), spec, ranks, every).peak_gib for n in ns}
    return {e.n: e.peak_gib for e in p.estimates}, full


def measured(workload: str, workflow: str, kind: str, cp: int, ns: list[int], out: Path) -> dict[int, float]:
    cpbench([f"workload={workload}", f"workflow={workflow}", f"topology.kind={kind}", f"topology.cp={cp}",
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


HEADER = ("| workload | workflow | topology | N_tokens | predicted GiB | every pass traced GiB | measured "
          "GiB over baseline | error | calibrated at N (missed MiB) | calibrated error |")  # fmt: skip
MARKERS = ("<!-- predict_check: start -->", "<!-- predict_check: end -->")


def peaks_table(args: argparse.Namespace, tmp: Path) -> list[str]:
    """The table's lines, each printed as it is measured, then the summary: the worst and median signed
    error, and the under-prediction rate, of the trace alone and calibrated."""
    lines, raw, calibrated_errors = [HEADER, "|---|---|---|---|---|---|---|---|---|---|"], [], []
    print("\n".join(lines), flush=True)
    for workload in args.workloads:
        for workflow in args.workflows:
            train = workflow == "training"
            base, ns0 = (args.train_calibrate_at, args.train_n) if train else (args.calibrate_at, args.n)
            for kind, cp, label in (TOPOLOGIES[t] for t in args.topologies):
                at, *ns = dict.fromkeys(round(n * math.sqrt(cp) / 16) * 16 for n in (base, *ns0))
                guess, full = predicted(workload, workflow, kind, cp, [at, *ns])
                out = tmp / f"{workload}-{workflow}-{kind}{cp}"
                real = measured(workload, workflow, kind, cp, [at, *ns], out)
                for below, n in zip([at, *ns], ns, strict=False):
                    # calibrated as the probe's next step is: by the largest N measured below it
                    missed = real[below] - guess[below]
                    error = (guess[n] - real[n]) / real[n]
                    calibrated = (guess[n] + missed - real[n]) / real[n]
                    raw.append(error)
                    calibrated_errors.append(calibrated)
                    cells = (f"{guess[n]:.4f} | {full[n]:.4f} | {real[n]:.4f} | {error:+.1%} | {below} "
                             f"({missed * 1024:+.1f}) | {calibrated:+.1%}")  # fmt: skip
                    lines.append(f"| {workload} | {workflow} | {label} | {n} | {cells} |")
                    print(lines[-1], flush=True)
    lines += summary(raw, calibrated_errors)
    print("\n".join(lines[-3:]), flush=True)
    return lines


def summary(raw: list[float], calibrated: list[float]) -> list[str]:
    """The errors' worst and median, and how often each estimate under-predicted."""
    lines = [""]
    for name, errors in (("the trace alone", raw), ("calibrated", calibrated)):
        under = sum(e < 0 for e in errors)
        lines.append(
            f"- {name}: worst {max(errors, key=abs):+.1%}, median {statistics.median(errors):+.1%}; "
            f"under-predicted (said 'fits' at a cap the step ran over) at {under} of {len(errors)} points "
            f"({under / len(errors):.0%}), by at most {-min(min(errors), 0.0):.1%}"
        )
    return lines


def table_from(log: Path) -> list[str]:
    """The table and summary from the rows a run printed (a run cut short: its rows so far)."""
    rows = [line for line in log.read_text().splitlines() if line.startswith("| ") and "%" in line]
    cells = [[c.strip() for c in row.strip("|").split("|")] for row in rows]
    raw, calibrated = ([float(c[i].rstrip("%")) / 100 for c in cells] for i in (7, 9))
    return [HEADER, "|---|---|---|---|---|---|---|---|---|---|", *rows, *summary(raw, calibrated)]


def write_docs(lines: list[str], command: str) -> None:
    docs = Path(__file__).resolve().parents[1] / "docs" / "probe.md"
    text = docs.read_text()
    start, end = (text.index(marker) for marker in MARKERS)
    block = [MARKERS[0], "", f"`{command}`, {time.strftime('%Y-%m-%d')}:", "", *lines, "", MARKERS[1]]
    docs.write_text(text[:start] + "\n".join(block) + text[end + len(MARKERS[1]) :])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workloads", nargs="+", default=["pairformer_small", "fold_small"])
    parser.add_argument("--workflows", nargs="+", choices=["inference", "training"],
                        default=["inference", "training"])  # fmt: skip
    parser.add_argument("--n", type=int, nargs="+", default=[96, 128, 160, 192, 256])
    parser.add_argument("--calibrate-at", type=int, default=64)
    parser.add_argument("--train-n", type=int, nargs="+", default=[32, 48, 64, 80, 96])
    parser.add_argument("--train-calibrate-at", type=int, default=16)
    parser.add_argument("--topologies", nargs="+", choices=list(TOPOLOGIES), default=list(TOPOLOGIES))
    parser.add_argument("--probe-workload", default="pairformer_small")
    parser.add_argument("--budget", type=float, default=0.25)
    parser.add_argument("--granularity", type=int, default=32)
    parser.add_argument("--skip-peaks", action="store_true")
    parser.add_argument("--skip-probe", action="store_true")
    parser.add_argument("--write-docs", action="store_true")
    parser.add_argument("--table-from", type=Path, help="the table from a run's printed rows (cut short)")
    args = parser.parse_args()
    if args.table_from:
        lines = table_from(args.table_from)
        print("\n".join(lines))
        if args.write_docs:
            write_docs(lines, f"python benchmarks/predict_check.py (its rows from {args.table_from.name})")
        return
    register()
    with tempfile.TemporaryDirectory() as tmp:
        if not args.skip_peaks:
            started = time.perf_counter()
            lines = peaks_table(args, Path(tmp))
            print(f"({time.perf_counter() - started:.0f} s)")
            if args.write_docs:
                write_docs(lines, "python benchmarks/predict_check.py " + " ".join(sys.argv[1:]))
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
