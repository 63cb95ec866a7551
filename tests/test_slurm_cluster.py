"""Every SLURM path of cpbench through `python -m cpbench`, on a real one-node SLURM cluster
(tests/slurm_cluster.py): each test reads SLURM's own account of the job (scontrol, the job's logs)."""

from __future__ import annotations

import json
import re
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pandas as pd
import pytest
from conftest import FAST, TESTS, cpbench, ok, results

pytestmark = pytest.mark.usefixtures("idle_cluster")

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


@pytest.fixture
def idle_cluster(slurm_cluster):
    """Every test starts and ends with no job on the cluster."""
    slurm_cluster.cancel_all()
    yield slurm_cluster
    slurm_cluster.cancel_all()


def _slow_env(tmp_path: Path, slurm_cluster, step_s: float) -> tuple[dict, Path]:
    (tmp_path / "slow_steps.py").write_text(SLOW_STEPS)
    step = tmp_path / "step_s"
    step.write_text(str(step_s))
    env = {**slurm_cluster.env, "PYTHONPATH": f"{TESTS}:{tmp_path}", "CPBENCH_TEST_STEP_S": str(step)}
    return env, step


def _job_id(out: Path) -> str:
    return json.loads((out / "slurm" / "submitted.json").read_text())["job_id"]


def _task_log(out: Path, job_id: str, task: int, stream: str = "out") -> str:
    return (out / "slurm" / job_id / f"{job_id}_{task}_log.{stream}").read_text()


def test_one_job_of_two_tasks_measures_what_a_local_run_measures(slurm_cluster, tmp_path):
    points = ["topology.cp=2", "sweep.n_tokens=[16,32]", *FAST]
    out, local = tmp_path / "slurm", tmp_path / "local"
    proc = ok(cpbench(*ON_SLURM, *points, f"output_dir={out}", cwd=tmp_path, env=slurm_cluster.env))
    ok(cpbench(*points, f"output_dir={local}", cwd=tmp_path))
    job_id = _job_id(out)
    job = slurm_cluster.ended(job_id)
    assert (job["JobState"], job["NumNodes"], job["NumTasks"], job["NodeList"]) == (
        "COMPLETED",
        "1",
        "2",
        slurm_cluster.node,
    )
    for task in (0, 1):  # each rank ran as one SLURM task of this job
        assert f"JobEnvironment(job_id={job_id}, hostname={slurm_cluster.node}, local_rank={task}(2)" in (
            _task_log(out, job_id, task)
        )
    on_slurm, here = results(out), results(local)
    assert list(on_slurm["status"]) == ["ok", "ok"]
    pd.testing.assert_series_equal(on_slurm["checksum"], here["checksum"])
    assert f"submitted slurm job {job_id} (1 node(s) x 2 rank(s) (CPU ranks))" in proc.stderr
    assert f"cpbench: job {job_id} RUNNING" in proc.stderr


def test_a_job_out_of_requeues_leaves_its_point_to_the_next_run(slurm_cluster, tmp_path):
    """SLURM's time limit: USR2 `signal_delay_s` early (up to 30 s more, slurm.conf's PERIODIC_TIMEOUT),
    submitit checkpoints and requeues once (max_requeues=1), then the second timeout ends the job. The
    point in flight was interrupted, not broken: the run says so in one line, and the same command run
    again measures it; every point is measured once, none lost (issue 26, item 4)."""
    env, step = _slow_env(tmp_path, slurm_cluster, 3.0)  # 9 s a point: 12 points never fit in two runs
    sweep = list(range(16, 16 * 13, 16))
    out = tmp_path / "out"
    command = [
        *ON_SLURM, *SLOW, "slurm.time_min=1", "slurm.signal_delay_s=5", "slurm.max_requeues=1",
        "topology.cp=2", f"sweep.n_tokens=[{','.join(map(str, sweep))}]", *FAST, f"output_dir={out}",
    ]  # fmt: skip
    first = cpbench(*command, cwd=tmp_path, env=env, timeout=300)
    assert first.returncode == 1, first.stderr
    job_id = _job_id(out)
    said = [line for line in first.stderr.splitlines() if line.startswith(f"cpbench: SLURM job {job_id}")]
    assert len(said) == 1, first.stderr
    found = re.search(r"timed-out too many times\. \(at N=(\d+); run the same command to resume\)", said[0])
    assert found, said
    in_flight = int(found.group(1))
    job = slurm_cluster.ended(job_id)
    assert (job["JobState"], job["Restarts"]) == ("FAILED", "1"), job
    log = _task_log(out, job_id, 0, "err")
    assert log.count("Caught signal SIGUSR2 on") == 2, log
    assert f"Requeued job {job_id} (0 remaining timeouts)" in _task_log(out, job_id, 0)
    before = results(out)
    assert set(before["status"]) == {"ok"} and in_flight not in set(before["N_tokens"])
    assert said[0].startswith("cpbench: " + json.loads((out / "failure.json").read_text())["error"])

    step.write_text("0.05")  # the same command; this time the job has the time it needs
    ok(cpbench(*command, cwd=tmp_path, env=env, timeout=300))
    after = results(out)
    assert sorted(after["N_tokens"]) == sweep and set(after["status"]) == {"ok"}  # each once, none lost
    pd.testing.assert_frame_equal(after.iloc[: len(before)], before)  # measured before: kept as it was
    assert after["N_tokens"].iloc[len(before)] == in_flight  # the next run measures the point in flight first


def _in_flight(out: Path) -> int | None:
    state = out / "state.json"
    flight = json.loads(state.read_text()).get("in_flight") if state.exists() else None
    return flight["N_tokens"] if flight else None


def _wait_until(condition, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.2)


def test_a_preempted_job_measures_its_point_again_not_as_a_crash(slurm_cluster, tmp_path):
    """`scontrol requeue` (what a preemption does): SIGTERM to every task, then the job runs again with
    the same id. The point in flight is measured again; with launch.max_restarts=0 a crash would have
    been recorded `crashed` instead."""
    env, _ = _slow_env(tmp_path, slurm_cluster, 1.0)
    out = tmp_path / "out"
    command = [*ON_SLURM, *SLOW, "launch.max_restarts=0", "topology.cp=2", "sweep.n_tokens=[16,32,48]", *FAST]
    with ThreadPoolExecutor(1) as pool:
        run = pool.submit(cpbench, *command, f"output_dir={out}", cwd=tmp_path, env=env, timeout=300)
        _wait_until(lambda: _in_flight(out) == 32)
        before = results(out)
        slurm_cluster.command("scontrol", "requeue", _job_id(out))
        proc = ok(run.result())
    job_id = _job_id(out)
    job = slurm_cluster.ended(job_id)
    assert (job["JobState"], job["Restarts"]) == ("COMPLETED", "1"), job
    frame = results(out)
    assert list(zip(frame["N_tokens"], frame["status"], strict=True)) == [(16, "ok"), (32, "ok"), (48, "ok")]
    pd.testing.assert_frame_equal(frame.iloc[: len(before)], before)
    assert (
        "N=32 was in flight when the last run stopped: measured again"
        in (out / "logs" / "rank0.log").read_text()
    )
    assert f"cpbench: job {job_id} RUNNING, restart 1" in proc.stderr
