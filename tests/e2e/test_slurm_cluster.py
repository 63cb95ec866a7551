"""Every SLURM path of cpbench through `python -m cpbench`, on a real one-node SLURM cluster
(tests/support/slurm_cluster.py): each test reads SLURM's own account of the job (scontrol, the job's
logs)."""

from __future__ import annotations

import json
import os
import re
import signal
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pandas as pd
import pytest
from support.processes import BASE, FAST, cpbench, ok, results, wait_for
from support.settings import composed
from support.slurm_cluster import skip_without_slurm
from support.slurm_jobs import (
    ON_SLURM,
    SLOW,
    n_in_flight,
    slow_env,
    submitit_task_pid,
    submitted_job_id,
    task_log,
)

from cpbench.launch.slurm import sbatch_script

skip_without_slurm()
pytestmark = pytest.mark.usefixtures("idle_cluster")


def test_one_job_of_two_tasks_measures_what_a_local_run_measures(slurm_cluster, tmp_path):
    points = ["topology.cp=2", "sweep.n_tokens=[16,32]", *FAST]
    out, local = tmp_path / "slurm", tmp_path / "local"
    proc = ok(cpbench(*ON_SLURM, *points, f"output_dir={out}", cwd=tmp_path, env=slurm_cluster.env))
    ok(cpbench(*points, f"output_dir={local}", cwd=tmp_path))
    job_id = submitted_job_id(out)
    job = slurm_cluster.ended(job_id)
    assert (job["JobState"], job["NumNodes"], job["NumTasks"], job["NodeList"]) == (
        "COMPLETED",
        "1",
        "2",
        slurm_cluster.node,
    )
    for task in (0, 1):  # each rank ran as one SLURM task of this job
        assert f"JobEnvironment(job_id={job_id}, hostname={slurm_cluster.node}, local_rank={task}(2)" in (
            task_log(out, job_id, task)
        )
    on_slurm, here = results(out), results(local)
    assert list(on_slurm["status"]) == ["ok", "ok"]
    pd.testing.assert_series_equal(on_slurm["checksum"], here["checksum"])
    assert f"submitted slurm job {job_id} (1 node(s) x 2 rank(s) (CPU ranks))" in proc.stderr
    assert f"cpbench: job {job_id} RUNNING" in proc.stderr
    job_folder = out.resolve() / "slurm" / job_id
    assert f"cpbench: job {job_id} RUNNING; logs: {job_folder}" in proc.stderr.splitlines()
    # slurm.dry_run's script (cpbench's own writer) is the one submitit submitted, line for line.
    settings = composed(*BASE, *ON_SLURM, *points, f"output_dir={out}")
    submitted = (job_folder / f"{job_id}_submission.sh").read_text()
    assert sbatch_script(settings, out.resolve() / "slurm" / "%j", 2) == submitted


def _jobs_of(out: Path, runs: list[str]) -> list[str]:
    return [submitted_job_id(out / run) for run in runs]


def test_a_sweep_of_slurm_jobs_queues_them_at_once_and_never_overlaps_them(slurm_cluster, tmp_path):
    """Basic launcher + slurm.enabled: every job is queued before the first ends, the end of the sweep
    waits for them and merges them. Each job has the node to itself (--exclusive, the default): two
    one-rank jobs, which would fit side by side on the node's CPUs, run one after the other."""
    out = tmp_path / "sweep"
    points = ["topology.cp=1", "seed=0,1", "sweep.n_tokens=[16]", *FAST]
    ok(cpbench("-m", *ON_SLURM, *points, f"output_dir={out}", cwd=tmp_path, env=slurm_cluster.env))
    jobs = [slurm_cluster.ended(job_id) for job_id in _jobs_of(out, ["0_cp1", "1_cp1"])]
    assert [job["JobState"] for job in jobs] == ["COMPLETED", "COMPLETED"]
    assert [job["NumCPUs"] for job in jobs] == [str(slurm_cluster.cpus)] * 2  # the whole node, for one rank
    first, second = sorted(jobs, key=lambda job: job["StartTime"])
    assert second["SubmitTime"] < first["EndTime"]  # queued at once
    assert second["StartTime"] >= first["EndTime"]  # never side by side
    merged = results(out)
    assert list(merged["run"]) == ["0_cp1", "1_cp1"] and set(merged["status"]) == {"ok"}


def test_hydra_submitit_slurm_launcher_sweep_is_merged(slurm_cluster, tmp_path):
    """-m hydra/launcher=cpbench_slurm: hydra-submitit-launcher submits one SLURM job per cp (one task,
    which launches its own cp ranks); the end of the sweep merges them into one report."""
    out = tmp_path / "sweep"
    proc = ok(
        cpbench(
            "-m", "hydra/launcher=cpbench_slurm", "hydra.launcher.gpus_per_node=null", "topology.cp=1,2",
            "sweep.n_tokens=[16]", *FAST, f"output_dir={out}", cwd=tmp_path, env=slurm_cluster.env,
        )
    )  # fmt: skip
    array = [p.name for p in (out / ".submitit").iterdir() if re.fullmatch(r"\d+_\d+", p.name)]  # a job array
    assert len(array) == 2
    _check_quiet_console(proc, out / ".submitit", sorted(array))
    jobs = [slurm_cluster.ended(task) for task in sorted(array)]
    assert [(job["JobState"], job["NumTasks"], job["OverSubscribe"]) for job in jobs] == [
        ("COMPLETED", "1", "NO")
    ] * 2
    assert jobs[1]["StartTime"] >= jobs[0]["EndTime"]  # --exclusive: one after the other
    merged = results(out)
    assert list(merged["run"]) == ["0_cp1", "1_cp2"] and list(merged["cp"]) == [1, 2]
    assert set(merged["status"]) == {"ok"}
    assert "| 0_cp1 | 1d | 1 |" in (out / "cp_benchmark.md").read_text()


def _check_quiet_console(proc, submitit_folder: Path, jobs: list[str]) -> None:
    """No line said twice on the console (submitit warns on every poll where sacct fails: no slurmdbd),
    a line for each job's state changes with the folder of its logs, and submitit's own warnings once,
    in its log beside the jobs' folders."""
    console = [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip()]
    said = [re.sub(r"Call #\d+ - ", "", line) for line in console]  # submitit numbers its polls
    assert len(said) == len(set(said)), "\n".join(console)
    assert not [line for line in console if "sacct" in line], "\n".join(console)
    for job in jobs:
        assert f"cpbench: job {job} RUNNING; logs: {submitit_folder.resolve() / job}" in said, said
        assert f"cpbench: job {job} COMPLETED; logs: {submitit_folder.resolve() / job}" in said, said
    warnings = (submitit_folder / "submitit.log").read_text().splitlines()
    assert len(warnings) == len(set(re.sub(r"^\S+ \S+ |Call #\d+ - ", "", w) for w in warnings)), warnings
    assert sum("Bypassing sacct error" in w for w in warnings) == 1, warnings


def test_a_rank_that_raises_is_named_as_the_failing_task(slurm_cluster, tmp_path):
    """Rank 1 raises at N=32; srun's --kill-on-bad-exit ends task 0, which leaves no result: the run
    names task 1 and records N=32 as error."""
    out = tmp_path / "out"
    adapter = ["workload=adapter", "workload.module=adapters.fold_cp_style", "workload.contract=native"]
    proc = cpbench(
        *ON_SLURM, *adapter, "topology.cp=2", "sweep.n_tokens=[16,32]", *FAST, f"output_dir={out}",
        cwd=tmp_path, env={**slurm_cluster.env, "CPBENCH_TEST_FAIL": "1:32"},
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    job_id = submitted_job_id(out)
    assert slurm_cluster.ended(job_id)["JobState"] == "FAILED"
    failure = json.loads((out / "failure.json").read_text())
    assert failure["error"] == f"SLURM job {job_id} task 1: ValueError: injected failure at N=32"
    frame = results(out)
    assert list(zip(frame["N_tokens"], frame["status"], strict=True)) == [(16, "ok"), (32, "error")]
    assert f"cpbench: {failure['error']}; task logs are in" in proc.stderr


def test_a_task_killed_is_named_and_its_point_left_in_flight(slurm_cluster, tmp_path):
    """SIGKILL to task 1's process mid-point: srun ends the job and names task 1; the point in flight is
    no error (a kill): it stays in flight for the next run (tests/e2e/test_slurm_requeue.py runs one)."""
    env, _ = slow_env(tmp_path, slurm_cluster, 1.0)
    out = tmp_path / "out"
    command = [*ON_SLURM, *SLOW, "topology.cp=2", "sweep.n_tokens=[16,32]", *FAST, f"output_dir={out}"]
    with ThreadPoolExecutor(1) as pool:
        run = pool.submit(cpbench, *command, cwd=tmp_path, env=env, timeout=300)
        wait_for(lambda: n_in_flight(out) == 32, timeout=180)
        os.kill(submitit_task_pid(f"SLURM_JOB_ID={submitted_job_id(out)}", "SLURM_PROCID=1"), signal.SIGKILL)
        proc = run.result()
    assert proc.returncode == 1, proc.stderr
    job_id = submitted_job_id(out)
    assert slurm_cluster.ended(job_id)["JobState"] == "FAILED"
    error = json.loads((out / "failure.json").read_text())["error"]
    assert error.startswith(f"SLURM job {job_id} task 1: left no result ("), error
    assert f"srun: error: {slurm_cluster.node}: task 1: Killed" in error, error
    assert list(results(out)["N_tokens"]) == [16] and n_in_flight(out) == 32
