"""CP-size sweeps through Hydra multirun on CPU: each job in its own folder with its own cp ranks, one
merged results.csv and cp_benchmark.md at the sweep folder's root, failed jobs listed, killed sweeps
resumed."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from support.processes import FAST, TESTS, cpbench, ok, results, run_cmd

QUICK = FAST

# A fold-cp style adapter whose rank 0 kills the whole sweep (its process group, as the OOM killer or
# a lost node would) once a job with more than one rank reaches N_tokens >= CPBENCH_TEST_KILL_AT.
KILL_SWEEP = """
import os
import signal

import torch.distributed as dist
from adapters.fold_cp_style import build_batch as _build_batch
from adapters.fold_cp_style import build_model, run_step


def build_batch(N, n_atoms, S, mesh, device):
    at = os.environ.get("CPBENCH_TEST_KILL_AT")
    if at and dist.get_world_size() > 1 and dist.get_rank() == 0 and N >= int(at):
        os.killpg(os.getpgrp(), signal.SIGKILL)
    return _build_batch(N, n_atoms, S, mesh, device)
"""


def _job_rows(out: Path, job: str) -> list[tuple[int, str]]:
    frame = results(out / job)
    return list(zip(frame["N_tokens"], frame["status"], strict=True))


def _check_merged_sweep(out: Path, points: list[int]) -> str:
    """Both jobs measured all points with their own cp; the merge holds them all; returns the report."""
    for job, cp in (("0_cp1", 1), ("1_cp2", 2)):
        frame = results(out / job)
        assert list(frame["N_tokens"]) == points and set(frame["status"]) == {"ok"}
        assert set(frame["cp"]) == {cp}
        assert json.loads((out / job / "run.json").read_text())["world_size"] == cp  # its own ranks
    merged = results(out)
    assert list(merged["run"]) == ["0_cp1"] * len(points) + ["1_cp2"] * len(points)
    assert list(merged["cp"]) == [1] * len(points) + [2] * len(points)
    report = (out / "cp_benchmark.md").read_text()
    assert "| 0_cp1 | 1d | 1 |" in report and "| 1_cp2 | 1d | 2 |" in report
    assert "| N_tokens | N_atoms | MSA | 1d cp=1 | 1d cp=2 |" in report  # walltime vs N per cp
    assert "at cp=2 the run is" in report and "-bound." in report
    assert "![walltime vs N_tokens per cp](cp_benchmark_walltime.png)" in report
    assert (out / "cp_benchmark_walltime.png").stat().st_size > 5000
    return report


def test_multirun_with_the_basic_launcher_merges_the_jobs(tmp_path):
    out = tmp_path / "sweep"
    proc = ok(
        cpbench("-m", "topology.cp=1,2", "sweep.n_tokens=[16,32]", *QUICK, f"output_dir={out}", cwd=tmp_path)
    )
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == ["0_cp1", "1_cp2"]
    report = _check_merged_sweep(out, [16, 32])
    assert "At N_tokens=32, walltime is" in report
    assert (
        "Measured with `python -m cpbench -m workload=axial_mix baseline=false budget.minutes=null "
        "memory.cpu_budget_gib=0.5 "
        "topology.cp=1,2 'sweep.n_tokens=[16,32]' " in report
    )
    assert f"merged 4 row(s) from 2 job(s) -> {out / 'cp_benchmark.md'}" in proc.stderr


def test_multirun_with_submitit_local_gives_each_job_its_own_ranks(tmp_path):
    """One executor config (one task per job) for the whole sweep: each job launches its own cp ranks."""
    out = tmp_path / "sweep"
    ok(
        cpbench(
            "-m",
            "hydra/launcher=submitit_local",
            "topology.cp=1,2",
            "sweep.n_tokens=[16]",
            *QUICK,
            f"output_dir={out}",
            cwd=tmp_path,
            timeout=300,
        )
    )
    _check_merged_sweep(out, [16])
    logs = sorted(p.name for p in (out / ".submitit").rglob("*_log.out"))
    assert len(logs) == 2 and all(name.endswith("_0_log.out") for name in logs)  # one task per job
    # One job after another: a job writes run.json as it starts and results.csv as it ends.
    jobs = list(out.glob("*_cp*"))
    spans = sorted(((j / "run.json").stat().st_mtime, (j / "results.csv").stat().st_mtime) for j in jobs)
    assert len(spans) == 2 and spans[0][1] <= spans[1][0], spans


def test_a_failed_job_is_listed_and_the_sweep_goes_on(tmp_path):
    out = tmp_path / "sweep"
    proc = cpbench(
        "-m",
        "topology.cp=2,1",  # the failing job first: the next one must still run
        "workload=adapter",
        "workload.module=adapters.fold_cp_style",
        "workload.contract=native",
        "sweep.n_tokens=[16,32]",
        *QUICK,
        f"output_dir={out}",
        cwd=tmp_path,
        env={"CPBENCH_TEST_FAIL": "1:32"},
    )
    assert proc.returncode == 1, proc.stderr
    assert _job_rows(out, "0_cp2") == [(16, "ok"), (32, "error")]
    assert _job_rows(out, "1_cp1") == [(16, "ok"), (32, "ok")]
    failure = json.loads((out / "0_cp2" / "failure.json").read_text())
    assert failure["error"] == "rank 1 failed: ValueError: injected failure at N=32"
    assert not (out / "1_cp1" / "failure.json").exists()
    report = (out / "cp_benchmark.md").read_text()
    assert "- `0_cp2` (cp=2): rank 1 failed: ValueError: injected failure at N=32" in report
    assert "| 1_cp1 | 1d | 1 | 2 | 2 | ok |" in report
    assert "1 point(s) did not finish: N=32 cp=2 error." in report
    assert len(results(out)) == 4
    assert "cpbench: job 0_cp2 failed: rank 1 failed" in proc.stderr


def test_a_rejected_job_is_listed_with_its_error(tmp_path):
    out = tmp_path / "sweep"
    proc = cpbench(
        "-m", "topology.kind=2d", "topology.cp=3,1", "sweep.n_tokens=[16]", *QUICK, f"output_dir={out}",
        cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 1
    failure = json.loads((out / "0_cp3" / "failure.json").read_text())
    assert failure["exit_code"] == 2 and failure["error"].startswith("sweep.n_tokens=[16]: 16 does not tile")
    assert _job_rows(out, "1_cp1") == [(16, "ok")]
    assert "- `0_cp3` (cp=3): sweep.n_tokens=[16]: 16 does not tile" in (out / "cp_benchmark.md").read_text()


def test_a_killed_sweep_resumes_without_measuring_anything_twice(tmp_path):
    (tmp_path / "kill_sweep.py").write_text(KILL_SWEEP)
    out = tmp_path / "sweep"
    args = ["-m", "topology.cp=1,2", "workload=adapter", "workload.module=kill_sweep",
            "workload.contract=native", "sweep.n_tokens=[16,32,48]", *QUICK, f"output_dir={out}"]  # fmt: skip
    path = {"PYTHONPATH": f"{TESTS}:{tmp_path}"}
    killed = cpbench(*args, cwd=tmp_path, env={**path, "CPBENCH_TEST_KILL_AT": "32"})
    assert killed.returncode == -9, killed.stderr  # the whole sweep died in job 1, mid-point
    assert _job_rows(out, "0_cp1") == [(16, "ok"), (32, "ok"), (48, "ok")]
    assert _job_rows(out, "1_cp2") == [(16, "ok")]
    first = {job: (out / job / "results.csv").read_text() for job in ("0_cp1", "1_cp2")}

    # On demand, the report of the killed sweep says where job 1 stopped.
    report = ok(run_cmd([sys.executable, "-m", "cpbench.report", str(out)], cwd=tmp_path))
    assert "1_cp2: stopped while measuring N=32" in report.stderr

    proc = ok(cpbench(*args, cwd=tmp_path, env=path))
    assert (out / "0_cp1" / "results.csv").read_text() == first["0_cp1"]  # nothing measured again
    assert "cp=1: 0 point(s) to measure" in proc.stderr
    assert "N=32 was in flight when the last run stopped: measured again" in proc.stderr  # a kill, not OOM
    assert _job_rows(out, "1_cp2") == [(16, "ok"), (32, "ok"), (48, "ok")]
    assert (out / "1_cp2" / "results.csv").read_text().startswith(first["1_cp2"])
    merged = results(out)
    assert len(merged) == 6 and list(merged["run"]).count("1_cp2") == 3
    text = (out / "cp_benchmark.md").read_text()
    assert "| 1_cp2 | 1d | 2 | 3 | 3 | ok |" in text and "crashed" not in text


def test_submitit_tasks_are_the_ranks_when_a_job_has_cp_tasks(tmp_path):
    """Every task of a submitit job runs the whole Hydra job: with exactly cp tasks they are the ranks
    (environment from submitit); with another count the job is rejected by name, the sweep goes on."""
    out = tmp_path / "sweep"
    proc = cpbench(
        "-m", "hydra/launcher=submitit_local", "hydra.launcher.tasks_per_node=2", "topology.cp=2,1",
        "sweep.n_tokens=[16]", *QUICK, f"output_dir={out}",
        cwd=tmp_path, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 1
    assert _job_rows(out, "0_cp2") == [(16, "ok")]
    assert {"rank0.log", "rank1.log"} <= {p.name for p in (out / "0_cp2" / "logs").iterdir()}
    assert not (out / "0_cp2" / "logs" / "launch").exists()  # no ranks launched by the job itself
    failure = json.loads((out / "1_cp1" / "failure.json").read_text())
    assert failure["error"].startswith("topology.cp=1: this submitit job has 2 tasks")
