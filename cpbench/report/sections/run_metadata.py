"""The run's metadata as a table: one run's `## Run` table, the merged report's one column per run,
and the one-line hardware summary at the top of a merge."""

from __future__ import annotations

from collections.abc import Sequence

from cpbench.record.run_record import RunMetadata
from cpbench.report.cells import fmt, table

# Each recorded figure's label, in RunMetadata's order (a published report is read back by them).
LABELS = {
    "date": "date", "host": "host", "device": "device", "device_count": "device count",
    "cpu_cores": "CPU cores", "smt": "SMT (hyper-threads)", "backend": "backend", "torch": "torch",
    "cuda": "CUDA",
    "topology": "topology", "cp": "cp", "grid": "grid", "world_size": "ranks",
    "gpu_driver": "GPU driver", "sm_clocks_mhz": "SM clocks MHz", "clocks_locked": "clocks locked",
    "power_limit_w": "power limit W", "gpu_processes": "processes on the GPU",
    "devices_shared": "devices shared",
    "oversubscribed": "oversubscribed", "ranks_per_device": "ranks per GPU, or per CPU core",
    "seed": "seed",
    "comm_timing": "comm ms measured by", "config_hash": "config hash",
    "budget_gib": "memory budget GiB (per rank)",
    "baseline_gib": "start-up baseline GiB (rank 0)",
    "held_gib": "GPU memory held after start-up GiB (rank 0's device)",
    "nccl_gib": "of it, NCCL's warm-up before the cap GiB (rank 0's device)",
    "alloc_conf": "CUDA allocator settings (PYTORCH_CUDA_ALLOC_CONF)", "commit": "project commit",
}  # fmt: skip


def run_lines(meta: RunMetadata) -> list[str]:
    """One run's `## Run` table: every figure it recorded."""
    lines = ["## Run", "", "| | |", "|---|---|"]
    return lines + [f"| {LABELS[name]} | {fmt(value)} |" for name, value in meta.recorded()]


def runs_table(names: Sequence[str], metas: Sequence[RunMetadata]) -> list[str]:
    """The merged report's `## Run metadata`: a row per figure any run recorded, a column per run."""
    recorded = [dict(m.recorded()) for m in metas]
    shown = [(name, label) for name, label in LABELS.items() if any(name in r for r in recorded)]
    return ["", "## Run metadata", ""] + table(
        ["", *names], [(label, *(r.get(name, "") for r in recorded)) for name, label in shown]
    )


def hardware(metas: Sequence[RunMetadata]) -> str:
    """What the numbers were measured on, e.g. `CPU (Intel(R) Xeon(R) Processor, 2 cores, SMT off), gloo`."""
    seen = []
    for m in metas:
        if not m.recorded():
            continue
        if m.on_cpu:
            threads = f", SMT {m.smt}" if m.smt else ""
            label = f"CPU ({m.device or '?'}, {m.cpu_cores or '?'} cores{threads}), gloo"
        else:
            label = f"{m.device_count or '?'}x {m.device or '?'} per node, {m.backend or '?'}"
            label += f", CUDA {m.cuda}" if m.cuda not in (None, "none") else ""
        if label not in seen:
            seen.append(label)
    return "; ".join(seen) or "unknown (no run.json)"
