"""Requeues on the real one-node SLURM cluster (tests/support/slurm_cluster.py), through `python -m cpbench`:
SLURM's time limit (USR2, checkpoint, requeue, resume, and a job out of requeues), preemptions
(`scontrol requeue`) in the middle of a point and of the probe. Apart from tests/e2e/test_slurm_cluster.py
so that pytest-xdist runs the two files side by side (each worker starts its own cluster)."""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pandas as pd
import pytest
from support.probe_runs import FAULT, check_consistent, probe_trials
from support.processes import FAST, cpbench, ok, results, wait_for
from support.slurm_cluster import skip_without_slurm
from support.slurm_jobs import ON_SLURM, SLOW, n_in_flight, slow_env, submitted_job_id, task_log

skip_without_slurm()
pytestmark = pytest.mark.usefixtures("idle_cluster")


# Slow where the FLOP count runs the step (on fake tensors), quick in the timed steps: a signal lands in
# the count, whose `except Exception` once took submitit's end of the job for a step it cannot trace.
SLOW_COUNT = """
import os
import time
from pathlib import Path

from torch._subclasses.fake_tensor import FakeTensor

from adapters.fold_cp_style import build_batch, build_model
from adapters.fold_cp_style import run_step as _run_step


def run_step(model, batch, train):
    seconds = float(Path(os.environ["CPBENCH_TEST_STEP_S"]).read_text())
    time.sleep(seconds if isinstance(batch, FakeTensor) else seconds / 30)
    return _run_step(model, batch, train)
"""


def test_a_job_out_of_requeues_leaves_its_point_to_the_next_run(slurm_cluster, tmp_path):
    """SLURM's time limit: USR2 `signal_delay_s` before it (up to 60 s earlier still, sbatch(1)), so
    submitit checkpoints and requeues once (max_requeues=1), then the second timeout ends the job. The
    point in flight was interrupted, not broken: the run says so in one line, and the same command run
    again measures it; every point is measured once, none lost (issue 26, item 4). The signals come
    while the FLOP count runs the step, which is where most of a point's time goes here. The requeue is
    read from SLURM (`Restarts`), not from submitit's "Requeued job ... (0 remaining timeouts)": submitit
    logs that after `scontrol requeue` returns, when SLURM may already have ended the task, and it was
    missing once. The run again differs in `slurm.time_min` only, which no point's key holds."""
    env, step = slow_env(tmp_path, slurm_cluster, 9.0)  # 10 s a point: 160 s of work, two runs of < 60 s
    (tmp_path / "slow_steps.py").write_text(SLOW_COUNT)
    sweep = list(range(16, 16 * 17, 16))
    out = tmp_path / "out"
    command = [
        *ON_SLURM, *SLOW, "slurm.time_min=1", "slurm.signal_delay_s=5", "slurm.max_requeues=1",
        "topology.cp=2", f"sweep.n_tokens=[{','.join(map(str, sweep))}]", *FAST, f"output_dir={out}",
    ]  # fmt: skip
    first = cpbench(*command, cwd=tmp_path, env=env, timeout=300)
    assert first.returncode == 1, first.stderr
    job_id = submitted_job_id(out)
    said = [line for line in first.stderr.splitlines() if line.startswith(f"cpbench: SLURM job {job_id}")]
    assert len(said) == 1, first.stderr
    found = re.search(r"timed-out too many times\. \(at N=(\d+); run the same command to resume\)", said[0])
    assert found, said
    in_flight = int(found.group(1))
    job = slurm_cluster.ended(job_id)
    assert (job["JobState"], job["Restarts"]) == ("FAILED", "1"), job  # requeued once, by SLURM's count
    log = task_log(out, job_id, 0, "err")
    assert log.count("Caught signal SIGUSR2 on") == 2, log
    before = results(out)
    assert set(before["status"]) == {"ok"} and in_flight not in set(before["N_tokens"])
    assert said[0].startswith("cpbench: " + json.loads((out / "failure.json").read_text())["error"])

    # The same command, given the time it needs: SLURM sends USR2 at a minute's check, so under a
    # 1-minute limit it can come at any second of the job (once before submitit had set its handler,
    # in CI: the task died of it), and a user whose job ran out of requeues gives it more time.
    step.write_text("0.05")
    ok(cpbench(*command, "slurm.time_min=5", cwd=tmp_path, env=env, timeout=300))
    after = results(out)
    assert sorted(after["N_tokens"]) == sweep and set(after["status"]) == {"ok"}  # each once, none lost
    pd.testing.assert_frame_equal(after.iloc[: len(before)], before)  # measured before: kept as it was
    assert after["N_tokens"].iloc[len(before)] == in_flight  # the next run measures the point in flight first


def _probe_in_flight(out) -> int | None:
    state = out / "probe_state.json"
    return json.loads(state.read_text()).get("in_flight") if state.exists() else None


def _probe_stepped(out: Path) -> bool:
    """The probe has an answer of its own in probe.csv, not only the walltime points it starts from (the
    N in flight before it can be the time budget's step at the probe's start)."""
    return (out / "probe.csv").exists() and not probe_trials(out)["point"].all()


def _planned(out: Path) -> bool:
    """The run's first plan is in run.json (its budget's timed step is over)."""
    return (out / "run.json").exists() and bool(json.loads((out / "run.json").read_text()).get("time_budget"))


def test_a_job_preempted_mid_point_and_mid_probe_measures_both_again(slurm_cluster, tmp_path):
    """`scontrol requeue` (what a preemption does: SIGTERM to every task, then the job runs again with
    the same id), twice: while the walltime point N=16 is measured, then while the probe tries an N
    after it has tried one. The point is measured again (with slurm.max_requeues=0, the bound a SLURM
    job's rank reads for its crash restarts, a crash would have been recorded `crashed`); that bound,
    also submitit's on timeouts, does not stop a preempted job from being requeued, twice. The probe
    continues from probe_state.json, tries that N again and no other twice, and finds what it finds
    uninterrupted (tests/e2e/test_probe.py: 192 fits, 256 does not)."""
    env, _ = slow_env(tmp_path, slurm_cluster, 1.0)
    out = tmp_path / "out"
    command = [*ON_SLURM, *SLOW, *FAULT, "fault.where=batch", "slurm.max_requeues=0", f"output_dir={out}",
               "budget.minutes=600"]  # fmt: skip
    with ThreadPoolExecutor(1) as pool:
        run = pool.submit(cpbench, *command, cwd=tmp_path, env=env, timeout=400)
        wait_for(lambda: n_in_flight(out) == 16 and _planned(out), timeout=180)  # measured, not timed
        job_id = submitted_job_id(out)
        slurm_cluster.command("scontrol", "requeue", job_id)
        wait_for(lambda: _probe_stepped(out) and _probe_in_flight(out) is not None, timeout=240)
        tried, n = probe_trials(out), _probe_in_flight(out)
        assert slurm_cluster.job(job_id)["Restarts"] == "1"
        slurm_cluster.command("scontrol", "requeue", job_id)
        proc = ok(run.result())
    job = slurm_cluster.ended(job_id)
    assert (job["JobState"], job["Restarts"]) == ("COMPLETED", "2"), job
    frame = results(out)
    point = frame[frame["kind"] == "point"]
    assert list(zip(point["N_tokens"], point["status"], strict=True)) == [(16, "ok")]
    row, trials = check_consistent(out)  # every N tried once
    assert (row["N_tokens"], row["oom_at"]) == (192, 256)
    pd.testing.assert_frame_equal(trials.iloc[: len(tried)], tried)
    log = (out / "logs" / "rank0.log").read_text()
    assert "N=16 was in flight when the last run stopped: measured again" in log
    # The N in flight when the signal landed: the one read before it, or a later one if that step ended
    # first (the read and the requeue race a step of about a second).
    resumed = re.findall(r"probe: N=(\d+) was in flight when the last run stopped: trying it again", log)
    assert len(resumed) == 1 and int(resumed[0]) >= n, (resumed, n)
    assert f"cpbench: job {job_id} RUNNING, restart 2" in proc.stderr
    # Each start after a requeue knew it was one (SLURM's count): the run's budget went on, one plan each.
    planned = json.loads((out / "run.json").read_text())["time_budget"]
    assert planned["line"].startswith("plan: 1 point(s)") and planned["took_s"] is not None
    assert [line.split(",")[0] for line in planned["restarts"]] == ["restart 1", "restart 2"]


def test_a_rank_out_of_memory_alone_requeues_its_job_which_goes_on(slurm_cluster, tmp_path):
    """tests/e2e/test_probe.py's lone out-of-memory error (rank 1 at N=256, between two collectives) on
    SLURM: the rank records 256 as oom and requeues the job, whose ranks restart within it and finish
    the probe, with no crash restart allowed (`slurm.max_requeues=0`, the bound a SLURM job's rank reads
    for its crash restarts); before, the job failed there."""
    out = tmp_path / "out"
    # dist.agree_timeout_s: rank 1 says it ran out alone after 2 s, not the default 10 s (its peer is stuck).
    command = [*ON_SLURM, *FAULT, "fault.where=step", "sweep.n_tokens=[]", "slurm.max_requeues=0",
               "dist.agree_timeout_s=2", f"output_dir={out}"]  # fmt: skip
    proc = ok(cpbench(*command, cwd=tmp_path, env=slurm_cluster.env, timeout=300))
    job_id = submitted_job_id(out)
    job = slurm_cluster.ended(job_id)
    assert (job["JobState"], job["Restarts"]) == ("COMPLETED", "1"), job  # one requeue, for the finding
    row, trials = check_consistent(out)  # every N tried once
    assert (row["N_tokens"], row["oom_at"]) == (192, 256)
    assert trials.set_index("N_tokens").loc[256, "status"] == "oom"
    said = "N=256 does not fit: out of memory alone, peers did not agree within"
    assert said in (out / "logs" / "rank1.log").read_text()
    assert "recorded as oom, the ranks restart to go on" in (out / "logs" / "rank1.log").read_text()
    assert f"cpbench: job {job_id} RUNNING, restart 1" in proc.stderr
