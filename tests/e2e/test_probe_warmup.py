"""probe.warmup through `python -m cpbench`: the warm-up steps run at each N before its probe step, and
neither their time nor their memory is the probe step's (cpbench/rank/probe.py `warm_at`).

This module is also the workload (an adapter module, native contract): its first step in a process
stands for a compiled model's first step, slow and holding a transient of its own; later steps are
quick and small. Each step appends its N to the file CPBENCH_TEST_STEPS names."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pandas as pd
import torch
from support.processes import TIMING, cpbench, ok

FIRST_STEP_S = 2.0  # the first step's one-off cost, in time
FIRST_STEP_MIB = 160  # and in memory, a transient it frees
_compiled = False


def build_model(mesh, device):  # noqa: ANN001, ANN201 the adapter hooks' signatures
    torch.manual_seed(0)
    return torch.nn.Linear(8, 8).to(device)


def build_batch(N, n_atoms, S, mesh, device):  # noqa: ANN001, ANN201, N803
    return torch.randn(N, 8, generator=torch.Generator().manual_seed(N)).to(device)


def run_step(model, batch, train):  # noqa: ANN001, ANN201
    global _compiled
    if not _compiled:
        _compiled = True
        workspace = torch.ones(FIRST_STEP_MIB * 2**20 // 4)  # written: resident
        time.sleep(FIRST_STEP_S)
        del workspace
    with open(os.environ["CPBENCH_TEST_STEPS"], "a") as steps:
        steps.write(f"{batch.shape[0]}\n")
    out = model(batch)
    return out.pow(2).mean() if train else out


def _probe(tmp_path: Path, warmup: int) -> tuple[pd.Series, list[str]]:
    """One probe step at N=16 on one rank with `warmup` warm-up steps: its probe.csv row, and the N
    of every step the workload ran."""
    steps = tmp_path / f"steps_{warmup}"
    out = tmp_path / f"out_{warmup}"
    ok(cpbench(
        *TIMING, "workload=adapter", "workload.module=test_probe_warmup", "workload.contract=native",
        "topology.cp=1", "sweep.n_tokens=[]", "probe.enabled=true", "probe.start=16", "probe.max_tokens=16",
        "probe.measure_at_max=false", f"probe.warmup={warmup}", f"output_dir={out}",
        cwd=tmp_path, env={"CPBENCH_TEST_STEPS": str(steps)},
    ))  # fmt: skip
    probe = pd.read_csv(out / "probe.csv")
    assert len(probe) == 1 and bool(probe.loc[0, "fits"]), probe
    return probe.loc[0], steps.read_text().split()


def test_warm_up_steps_run_before_the_probe_step_untimed_and_out_of_its_peak(tmp_path: Path):
    cold, cold_steps = _probe(tmp_path, 0)
    warm, warm_steps = _probe(tmp_path, 2)
    assert cold_steps == ["16"] and warm_steps == ["16"] * 3  # two warm-up steps, then the probe step
    assert cold["seconds"] >= FIRST_STEP_S > warm["seconds"]
    # The first step's transient is in the cold step's peak and not in the warmed one's.
    assert cold["max_peak_gib"] - warm["max_peak_gib"] > 0.6 * FIRST_STEP_MIB / 1024
