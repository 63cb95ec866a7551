"""SLURM and submitit jobs as the tests read them: a job's id, its tasks' logs and processes, the N in
flight in its run folder, and the slow workloads a test interrupts mid-point (written into the test's
folder as slow_steps.py, run from tests/adapters/fold_cp_style.py)."""

from __future__ import annotations

import json
from pathlib import Path

from support.processes import TESTS

ON_SLURM = ["slurm.enabled=true", "slurm.gpus_per_node=0"]
# A step as slow as the file `step_s` says (the test changes it between runs of one command).
SLOW_STEPS = """
import os
import time
from pathlib import Path

from adapters.fold_cp_style import build_batch, build_model
from adapters.fold_cp_style import run_step as _run_step


def run_step(model, batch, train):
    time.sleep(float(Path(os.environ["CPBENCH_TEST_STEP_S"]).read_text()))
    return _run_step(model, batch, train)
"""
SLOW = ["workload=adapter", "workload.module=slow_steps", "workload.contract=native"]


def slow_env(tmp_path: Path, slurm_cluster, step_s: float) -> tuple[dict, Path]:
    """The environment of a run of SLOW in `tmp_path` on `slurm_cluster`, its steps `step_s` seconds
    long, and the file that sets that length (a test may change it while the run goes on)."""
    (tmp_path / "slow_steps.py").write_text(SLOW_STEPS)
    step = tmp_path / "step_s"
    step.write_text(str(step_s))
    env = {**slurm_cluster.env, "PYTHONPATH": f"{TESTS}:{tmp_path}", "CPBENCH_TEST_STEP_S": str(step)}
    return env, step


def submitted_job_id(out: Path) -> str:
    """The id of the job a run submitted (its slurm/submitted.json)."""
    return json.loads((out / "slurm" / "submitted.json").read_text())["job_id"]


def task_log(out: Path, job_id: str, task: int, stream: str = "out") -> str:
    """One task's stdout ("out") or stderr ("err") as SLURM wrote it under the run's slurm/ folder."""
    return (out / "slurm" / job_id / f"{job_id}_{task}_log.{stream}").read_text()


def n_in_flight(out: Path) -> int | None:
    """The N of the point a run has in flight (its state.json), None when none is."""
    state = out / "state.json"
    flight = json.loads(state.read_text()).get("in_flight") if state.exists() else None
    return flight["N_tokens"] if flight else None


def submitit_task_pid(*marks: str) -> int | None:
    """The process of a submitit task whose environment holds every one of `marks` ("NAME=value")."""
    wanted = [m.encode() for m in marks]
    for proc in Path("/proc").iterdir():
        try:
            env = (proc / "environ").read_bytes().split(b"\0")
            cmdline = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        if all(m in env for m in wanted) and b"submitit.core._submit" in cmdline:
            return int(proc.name)
    return None


# A step a quarter of a second long (submitit's local executor: interrupted in the middle of a point).
QUARTER_SECOND_STEPS = """
import time

from adapters.fold_cp_style import build_batch, build_model
from adapters.fold_cp_style import run_step as _run_step


def run_step(model, batch, train):
    time.sleep(0.25)  # slow enough to be interrupted in the middle of a point
    return _run_step(model, batch, train)
"""
