"""One run as one SLURM job through submitit: its sbatch script built without a cluster, run for real
through submitit's local executor (one task per rank, the same code path as on SLURM), failed, and
requeued mid-point. The job's size and settings, built in-process: tests/unit/test_slurm_job.py."""

from __future__ import annotations

import json
import os
import signal

import pandas as pd
from omegaconf import OmegaConf
from support.processes import FAST, TESTS, cpbench, ok, results, wait_for
from support.slurm_jobs import QUARTER_SECOND_STEPS, submitit_task_pid

from cpbench.launch import slurm

QUICK = FAST
LOCAL = ["slurm.enabled=true", "slurm.cluster=local", "slurm.gpus_per_node=0"]


def test_the_sbatch_script_is_built_without_a_cluster(tmp_path):
    out = tmp_path / "out"
    proc = ok(
        cpbench(
            "slurm.enabled=true",
            "slurm.dry_run=true",
            "slurm.partition=gpu",
            "slurm.account=proj",
            "slurm.time_min=90",
            "+slurm.additional_parameters.exclusive=true",
            "topology.cp=16",
            f"output_dir={out}",
            cwd=tmp_path,
        )
    )
    script = (out / "slurm" / "cpbench.sbatch").read_text()
    assert proc.stdout.strip() == script.strip()
    folder = out.resolve() / "slurm" / "%j"
    for line in (
        "#SBATCH --nodes=2",
        "#SBATCH --ntasks-per-node=8",
        "#SBATCH --gpus-per-node=8",
        "#SBATCH --partition=gpu",
        "#SBATCH --account=proj",
        "#SBATCH --time=90",
        "#SBATCH --signal=USR2@120",  # the warning before the time limit: checkpoint and requeue
        "#SBATCH --exclusive",
        "#SBATCH --job-name=cpbench-cp16",
        f"#SBATCH --output={folder}/%j_0_log.out",
        f"#SBATCH --error={folder}/%j_0_log.err",
    ):
        assert line in script.splitlines(), (line, script)
    srun = next(line for line in script.splitlines() if line.startswith("srun "))
    assert f"--output {folder}/%j_%t_log.out" in srun and f"--error {folder}/%j_%t_log.err" in srun
    assert "--kill-on-bad-exit=1" in srun and srun.endswith(f"-m submitit.core._submit {folder}")
    assert [p.name for p in out.iterdir()] == ["slurm"]  # nothing submitted, nothing measured


def test_a_run_as_submitit_tasks_one_per_rank(tmp_path):
    out = tmp_path / "out"
    proc = ok(
        cpbench(*LOCAL, "topology.cp=2", "sweep.n_tokens=[16,32]", *QUICK, f"output_dir={out}", cwd=tmp_path)
    )
    frame = results(out)
    assert list(frame["N_tokens"]) == [16, 32] and set(frame["status"]) == {"ok"}
    assert set(frame["cp"]) == {2} and (frame["comm_ms"] > 0).all()
    note = json.loads((out / "slurm" / "submitted.json").read_text())
    assert note["layout"] == {"nodes": 1, "tasks_per_node": 2, "gpus_per_node": 0}
    job = out / "slurm" / note["job_id"]
    assert {p.name for p in job.glob("*_log.err")} == {f"{note['job_id']}_{t}_log.err" for t in (0, 1)}
    assert {"rank0.log", "rank1.log"} <= {p.name for p in (out / "logs").iterdir()}
    assert f"submitted local job {note['job_id']} (1 node(s) x 2 rank(s) (CPU ranks))" in proc.stderr


def test_a_failed_job_records_the_failing_task(tmp_path):
    out = tmp_path / "out"
    proc = cpbench(
        *LOCAL, "topology.cp=2", "workload=adapter", "workload.module=adapters.fold_cp_style",
        "workload.contract=native",        "sweep.n_tokens=[16,32]", *QUICK, f"output_dir={out}",
        cwd=tmp_path, env={"CPBENCH_TEST_FAIL": "1:32"},
    )  # fmt: skip
    assert proc.returncode == 1
    frame = results(out)
    assert list(zip(frame["N_tokens"], frame["status"], strict=True)) == [(16, "ok"), (32, "error")]
    failure = json.loads((out / "failure.json").read_text())
    assert failure["error"].endswith("task 1: ValueError: injected failure at N=32")
    assert "task logs are in" in proc.stderr


def test_multirun_sizes_each_slurm_job_by_its_own_cp(tmp_path):
    out = tmp_path / "sweep"
    ok(
        cpbench(
            "-m", *LOCAL, "topology.cp=1,2", "sweep.n_tokens=[16]", *QUICK, f"output_dir={out}", cwd=tmp_path
        )
    )
    for job, cp in (("0_cp1", 1), ("1_cp2", 2)):
        note = json.loads((out / job / "slurm" / "submitted.json").read_text())
        assert note["layout"]["tasks_per_node"] == cp
        assert len(list((out / job / "slurm" / note["job_id"]).glob("*_log.err"))) == cp
    assert list(results(out)["cp"]) == [1, 2]


def _task_pid(job_id: str, task: int) -> int | None:
    """The process of one task of a submitit local job."""
    return submitit_task_pid(f"SUBMITIT_LOCAL_JOB_ID={job_id}", f"SUBMITIT_LOCAL_GLOBALID={task}")


def test_a_preempted_job_requeues_and_resumes_mid_sweep(tmp_path, monkeypatch):
    """SIGUSR2 (SLURM's warning before a timeout or preemption) on task 0: submitit checkpoints and
    requeues; the point in flight is measured again, the points done are not."""
    from hydra import compose, initialize_config_module

    from cpbench.rank import RunSpec
    from cpbench.settings.schema import register

    (tmp_path / "slow_steps.py").write_text(QUARTER_SECOND_STEPS)
    monkeypatch.setenv("PYTHONPATH", f"{TESTS}:{tmp_path}")  # the tasks import the workload
    out = tmp_path / "out"
    register()
    with initialize_config_module("cpbench.configs", version_base="1.3"):
        cfg = compose(
            "config",
            [*LOCAL, "topology.cp=2", "workload=adapter", "workload.module=slow_steps",
             "workload.contract=native", "sweep.n_tokens=[16,32,48]", *QUICK, f"output_dir={out}"],
        )  # fmt: skip
    spec = RunSpec(settings=OmegaConf.to_object(cfg), output_dir=str(out))
    job = slurm.submit(spec, 2)
    try:
        state = out / "state.json"

        def measuring_32() -> bool:
            flight = json.loads(state.read_text())["in_flight"] if state.exists() else None
            return bool(flight) and flight["N_tokens"] == 32

        wait_for(measuring_32)
        before = results(out)
        os.kill(_task_pid(job.job_id, 0), signal.SIGUSR2)
        assert slurm.failure_of(job) is None
    finally:
        job.cancel()
    frame = results(out)
    assert list(zip(frame["N_tokens"], frame["status"], strict=True)) == [(16, "ok"), (32, "ok"), (48, "ok")]
    pd.testing.assert_frame_equal(frame.iloc[: len(before)], before)  # measured before the requeue: kept
    log = (out / "slurm" / job.job_id / f"{job.job_id}_0_log.err").read_text()
    assert "Caught signal SIGUSR2" in log
    assert [line.split(": ")[1] for line in log.splitlines() if "point(s) to measure" in line] == [
        "3 point(s) to measure -> " + str(out),
        "2 point(s) to measure -> " + str(out),
    ]
