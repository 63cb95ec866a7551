"""How the fold workload (fold_small) grows with N_atoms and with MSA depth S at a fixed N, on CPU.

    python benchmarks/fold_scaling.py                     # N 128; atoms 4.5-36 per token; S 16-1024
    python benchmarks/fold_scaling.py --n 64 --atoms 288 576 --msa 16 64 --repeats 1

Two parts, for each point of the two sweeps (atoms at S = --msa[0]; S at atoms = --atoms[1]):
- per-rank peak memory and step time, measured by the driver itself: `python -m cpbench` with
  `topology.cp=--cp` (1d), the probe off, read back from its results.csv (VmHWM max over ranks,
  median over repeats of the slowest rank);
- where the time goes: one rank in this process, one warm-up step, then --repeats steps (their
  mean) with the op clock on (`cpbench.distributed.comm.CLOCK`: wall time per op label, exclusive
  of nested labels), the labels folded into op families. Time outside every label is `other`.
Prints Markdown tables (docs/fold.md holds a run's output).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import pandas as pd
import torch
from hydra import compose, initialize_config_module
from hydra.utils import instantiate

from cpbench.core import RankContext, Shape, Topology
from cpbench.distributed.comm import CLOCK
from cpbench.settings.schema import register

FAMILIES = {  # op label prefix -> op family: the same op in the MSA module and the Pairformer counts once
    "input.atom_encoder": "input atom attention",
    "input.": "input embedding",
    "msa.outer_product_mean": "outer product mean",
    "msa.pair_weighted_averaging": "pair-weighted averaging",
    "msa.transition": "MSA transition",
    "msa.tri_mul": "triangle multiplication",
    "pairformer.tri_mul": "triangle multiplication",
    "msa.tri_att": "triangle attention",
    "pairformer.tri_att": "triangle attention",
    "msa.pair_transition": "pair transition",
    "pairformer.pair_transition": "pair transition",
    "pairformer.single": "single track",
    "diffusion.atom": "diffusion atom attention",
    "diffusion.token": "diffusion token transformer",
    "diffusion.": "diffusion conditioning",
}


def family(label: str) -> str:
    return next((name for prefix, name in FAMILIES.items() if label.startswith(prefix)), "other")


def driver_sweep(args, atoms: list[int], msa: list[int]) -> pd.DataFrame:
    """Peak memory and step time per point from the real driver (cp ranks, 1d)."""
    with tempfile.TemporaryDirectory() as out:
        command = [sys.executable, "-m", "cpbench", f"workload={args.workload}", f"workflow={args.workflow}",
                   f"topology.cp={args.cp}", "probe.enabled=false", f"sweep.n_tokens=[{args.n}]",
                   f"sweep.n_atoms={atoms}", f"sweep.msa_depth={msa}",
                   "timing.warmup=1", f"timing.repeats={args.repeats}", "log.progress=false",
                   f"output_dir={out}"]  # fmt: skip
        subprocess.run(command, check=True, timeout=3600)
        frame = pd.read_csv(Path(out) / "results.csv")
    return frame[frame["kind"] == "point"]


def op_times(args, n_atoms: int, msa_depth: int) -> dict[str, float]:
    """Milliseconds per op family for one step on one rank."""
    register()
    with initialize_config_module("cpbench.configs", version_base=None):
        cfg = compose("config", [f"workload={args.workload}"])
    workload = instantiate(cfg.workload)
    one = Topology("1d", 1, (1, 1))
    ctx = RankContext(0, 1, torch.device("cpu"), None, one, torch.float32, 0, (0, 0), None, None)
    model = workload.build_model(ctx)
    batch = workload.build_batch(Shape(args.n, n_atoms, msa_depth), ctx)
    train = args.workflow == "training"

    def step() -> None:
        out = workload.run_step(model, batch, train)
        if train:
            out.backward()

    step()
    CLOCK.seconds.clear()
    CLOCK.enabled = True
    start = time.perf_counter()
    try:
        for _ in range(args.repeats):
            step()
    finally:
        CLOCK.enabled = False
    total = (time.perf_counter() - start) / args.repeats
    ms: dict[str, float] = defaultdict(float)
    for label, seconds in CLOCK.seconds.items():
        ms[family(label.removesuffix(".bwd"))] += 1e3 * seconds / args.repeats
    ms["other"] += 1e3 * total - sum(ms.values())
    ms["total"] = 1e3 * total
    return dict(ms)


def table(rows: list[dict], axis: str, cp: int) -> str:
    frame = pd.DataFrame(rows).set_index(axis)
    ops = [c for c in frame.columns if c not in ("total", "peak_mem_gib", "walltime_ms")]
    ops.sort(key=lambda c: -frame[c].max())
    lines = [f"| {axis} | step ms (cp={cp}) | peak GiB/rank | 1-rank step ms | top op | "
             + " | ".join(ops) + " |"]  # fmt: skip
    lines.append("|" + "---|" * (5 + len(ops)))
    for key, row in frame.iterrows():
        top = max(ops, key=lambda c: row[c])
        shares = " | ".join(f"{row[c]:.0f} ({100 * row[c] / row['total']:.0f}%)" for c in ops)
        lines.append(f"| {key} | {row['walltime_ms']:.0f} | {row['peak_mem_gib']:.3f} | {row['total']:.0f} | "
                     f"{top} | {shares} |")  # fmt: skip
    return "\n".join(lines)


def sweep(args, axis: str, values: list[int], fixed_atoms: int, fixed_msa: int) -> str:
    atoms = values if axis == "N_atoms" else [fixed_atoms]
    msa = values if axis == "MSA_depth" else [fixed_msa]
    measured = driver_sweep(args, atoms, msa)
    rows = []
    for value in values:
        n_atoms, msa_depth = (value, fixed_msa) if axis == "N_atoms" else (fixed_atoms, value)
        point = measured[(measured["N_atoms"] == n_atoms) & (measured["MSA_depth"] == msa_depth)].iloc[0]
        rows.append({axis: value, "walltime_ms": point["walltime_ms"], "peak_mem_gib": point["peak_mem_gib"],
                     **op_times(args, n_atoms, msa_depth)})  # fmt: skip
    return table(rows, axis, args.cp)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=128)
    parser.add_argument("--atoms", type=int, nargs="+", default=[576, 1152, 2304, 4608])
    parser.add_argument("--msa", type=int, nargs="+", default=[16, 64, 256, 1024])
    parser.add_argument("--cp", type=int, default=2)
    parser.add_argument("--workload", default="fold_small")
    parser.add_argument("--workflow", default="inference", choices=("inference", "training"))
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)  # the driver's ranks get one core each on a 2-core machine
    fixed_atoms = args.atoms[min(1, len(args.atoms) - 1)]
    print(f"## {args.workload}, {args.workflow}, N_tokens={args.n}\n")
    print(f"### N_atoms (MSA depth {args.msa[0]})\n")
    print(sweep(args, "N_atoms", args.atoms, fixed_atoms, args.msa[0]) + "\n")
    print(f"### MSA depth (N_atoms {fixed_atoms})\n")
    print(sweep(args, "MSA_depth", args.msa, fixed_atoms, args.msa[0]))


if __name__ == "__main__":
    main()
