"""The max-token probe in real multi-rank CPU runs: under a budget, with faults injected, resumed."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.probe_runs import FAULT, PROBE, check_consistent, max_fit, probe_trials
from support.processes import BASE, TESTS, TIMING, cpbench, ok, results


@pytest.mark.parametrize(
    "topology", [["topology.cp=2"], ["topology.kind=2d", "topology.cp=4"]], ids=["1d-cp2", "2d-2x2"]
)
def test_probe_under_a_budget_finds_the_edge_and_measures_it(tmp_path, topology):
    out = tmp_path / "out"
    ok(
        cpbench(
            *topology, *PROBE, "memory.cpu_budget_gib=0.15", f"output_dir={out}", cwd=tmp_path, timeout=300
        )
    )
    row, trials = check_consistent(out)
    assert row["N_tokens"] >= 128 and not trials["fits"].all()
    # On CPU a rank can run out alone at the edge: it records its N as oom before the job restarts.
    assert set(trials.loc[~trials["fits"], "status"]) == {"oom"}
    assert (trials.loc[trials["fits"], "max_peak_gib"] > 0).all()
    assert 0 < row["peak_mem_min_gib"] <= row["peak_mem_gib"]  # the grid's imbalance at the edge too
    frame = results(out)
    at_max = frame[(frame["kind"] == "point") & (frame["N_tokens"] == row["N_tokens"])]
    assert len(at_max) == 1  # measured, or recorded as not sustaining repeated steps at the edge
    measured = at_max.iloc[0]
    assert (
        measured["walltime_ms"] > 0
        if measured["status"] == "ok"
        else measured["status"] in ("oom", "crashed")
    )
    assert "| max-fit | axial_mix |" in (md := (out / "cp_benchmark.md").read_text())
    assert f"| ok, OOM@{int(row['oom_at'])} |" in md


def test_an_edge_whose_full_measurement_runs_out_is_no_fit_and_the_search_goes_on_below(tmp_path):
    """A model whose steps each keep a copy of their output (tests/adapters/retaining.py): the probe's
    one step at an N fits where the full measurement's three steps do not. That N's answer becomes
    out of memory (one row per N in probe.csv, no fit above a failure), and the search goes on below
    it until a full measurement fits: the max-fit row is an N measured whole."""
    out = tmp_path / "out"
    retaining = [
        "workload=adapter",
        "workload.module=adapters.retaining",
        "workload.contract=native",
        "topology.cp=2",
    ]
    proc = ok(cpbench(*retaining, *PROBE, "memory.cpu_budget_gib=0.13", f"output_dir={out}", cwd=tmp_path,
                      timeout=300))  # fmt: skip
    refuted = [int(n) for n in re.findall(r"the full measurement at N=(\d+) ran out of memory", proc.stderr)]
    assert refuted, proc.stderr
    row, trials = check_consistent(out)
    by_n = trials.set_index("N_tokens")
    assert not by_n.loc[refuted, "fits"].any() and set(by_n.loc[refuted, "status"]) == {"oom"}
    frame = results(out)
    points = frame[frame["kind"] == "point"].set_index("N_tokens")
    assert set(points.loc[refuted, "status"]) == {"oom"}
    assert points.loc[row["N_tokens"], "status"] == "ok" and row["N_tokens"] < min(refuted)


def test_a_point_stops_at_the_step_that_passes_the_budget_on_every_rank(tmp_path):
    """The retaining model at N=512, cp=2: each rank holds its batch (33.5 MB), the output and one copy
    per step, so step 2 peaks near 134 MB and step 3 near 168 MB against a 150 MB cap. Every rank
    stops after step 3, where the cap is passed (the all-reduce that agrees on the step time says so),
    not after the point's 6 steps; the point is out of memory with the rank's own peak."""
    out, log = tmp_path / "out", tmp_path / "steps"
    retaining = ["workload=adapter", "workload.module=adapters.retaining", "workload.contract=native"]
    env = {**os.environ, "CPBENCH_TEST_STEP_LOG": str(log)}
    steps = ["timing.warmup=1", "timing.warmup_max=1", "timing.repeats=5", "timing.repeats_max=5"]
    ok(cpbench(*retaining, "topology.cp=2", "sweep.n_tokens=[512]", "probe.enabled=false", *steps,
               "memory.cpu_budget_gib=0.14", f"output_dir={out}", cwd=tmp_path, env=env))  # fmt: skip
    for rank in (0, 1):
        assert Path(f"{log}.{rank}").read_text().split() == ["512"] * 3
    point = results(out).iloc[0]
    assert point["status"] == "oom" and "BudgetExceeded: peak" in point["error"], point["error"]


def test_oom_on_one_rank_before_the_first_collective(tmp_path):
    out = tmp_path / "out"
    proc = ok(cpbench(*FAULT, "fault.where=batch", f"output_dir={out}", cwd=tmp_path, timeout=120))
    row, trials = check_consistent(out)
    assert (row["N_tokens"], row["oom_at"]) == (192, 256)
    assert trials.set_index("N_tokens").loc[256, "status"] == "oom"
    assert "relaunching" not in proc.stderr  # agreed in-process, no restart


# How long a rank out of memory between two collectives waits for its stuck peers before it says so alone:
# 2 s, not the default 10 s, which these tests would wait out for nothing (tests/e2e/test_measurement.py too).
AGREE = ["dist.agree_timeout_s=2"]


def test_oom_inside_the_step_restarts_and_resumes(tmp_path):
    """OOM between two collectives: the rank waits dist.agree_timeout_s for its stuck peers, records
    its N as not fitting, then ends the job; the ranks are relaunched and the probe resumes, with no
    crash restart to spend. (A rank
    killed at an N is no answer about memory: tests/e2e/test_faults.py.) The probe alone, with no
    walltime point before it."""
    out = tmp_path / "out"
    start = time.monotonic()
    proc = ok(cpbench(*FAULT, "fault.where=step", "sweep.n_tokens=[]", "launch.max_restarts=0", *AGREE,
                      f"output_dir={out}", cwd=tmp_path, timeout=180))  # fmt: skip
    row, trials = check_consistent(out)
    assert (row["N_tokens"], row["oom_at"]) == (192, 256)
    assert trials.set_index("N_tokens").loc[256, "status"] == "oom"
    # A finding spends none of the crash restarts (none are allowed here).
    assert "the ranks restart to go on (out-of-memory restart 1, not counted" in proc.stderr
    assert "rank 1: N=256 does not fit: out of memory alone" in proc.stderr
    assert "crashed" not in proc.stderr  # running out of memory is a finding, not a crash
    assert time.monotonic() - start < 150


def test_oom_alone_in_the_time_budgets_step_at_the_probes_start_is_the_probes_answer(tmp_path):
    """With no walltime point left, the time budget times a step at the probe's start. Rank 1 runs out
    alone in it: that N is recorded as not fitting, and the relaunched ranks time nothing there again
    (before, they restarted into the same step forever) and search below it."""
    out = tmp_path / "out"
    proc = ok(cpbench(*FAULT, "fault.where=step", "sweep.n_tokens=[]", "probe.start=256", "budget.minutes=8",
                      "launch.max_restarts=0", *AGREE, f"output_dir={out}", cwd=tmp_path,
                      timeout=180))  # fmt: skip
    row, trials = check_consistent(out)
    assert (row["N_tokens"], row["oom_at"]) == (192, 256)
    assert trials.set_index("N_tokens").loc[256, "status"] == "oom"
    assert proc.stderr.count("out of memory alone") == 1
    assert "budget: no step to time (the probe's start, or every N it tried, does not fit)" in proc.stderr


def test_killed_job_resumes_without_rerunning_finished_n(tmp_path):
    """A 0.3 GiB cap: the probe's edge is near N=850 here, its steps a fraction of a second each (at
    1 GiB, near 1,650 and seconds each, for nothing more to see)."""
    out = tmp_path / "out"
    args = [sys.executable, "-m", "cpbench", *BASE, "topology.cp=2", *PROBE,
            "memory.cpu_budget_gib=0.3", "probe.measure_at_max=false", f"output_dir={out}"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(TESTS)}
    job = subprocess.Popen(
        args,
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if (out / "probe.csv").exists() and len(probe_trials(out)) >= 3:
                break
            time.sleep(0.2)
        else:
            pytest.fail("the probe never got going")
    finally:
        os.killpg(job.pid, signal.SIGKILL)  # the whole job: launcher and every rank
        job.wait(timeout=30)
    # What a resume starts from: probe_state.json (probe.csv is written after it, and a kill between
    # the two writes leaves the csv one N behind; the resumed run writes it whole again).
    before = [t["n"] for t in json.loads((out / "probe_state.json").read_text())["trials"]]
    proc = ok(cpbench(*args[3:], cwd=tmp_path, timeout=180))
    row, after = check_consistent(out)
    assert list(after["N_tokens"][: len(before)]) == before  # finished Ns kept, not re-run
    # Every N this run tried is one new row, in the order tried: each step the ranks logged, and each
    # that one rank ran out of memory on alone (its ranks restarted; such a step logs no line of its own).
    tried = re.findall(r"^probe N=(\d+)|^cpbench: rank \d+: N=(\d+) does not fit: out of memory alone",
                       proc.stderr, re.MULTILINE)  # fmt: skip
    assert list(after["N_tokens"][len(before) :]) == [int(step or alone) for step, alone in tried]
    assert "crashed" not in set(after["status"])  # the N the kill cut short was tried again


def test_the_answer_at_a_walltime_points_n_is_not_measured_twice(tmp_path):
    """The probe's largest fit is the point at N=64 (the cap): its full measurement is that point's."""
    out = tmp_path / "out"
    args = ["sweep.n_tokens=[64]", "probe.enabled=true", "probe.start=64", "probe.max_tokens=64", *TIMING]
    proc = ok(cpbench(*args, f"output_dir={out}", cwd=tmp_path, timeout=120))
    assert max_fit(out)["N_tokens"] == 64
    assert proc.stderr.count("N=64 atoms=") == 1  # one measurement's log line
    assert len(results(out).query("kind == 'point'")) == 1
