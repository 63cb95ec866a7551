"""Right answers under faults, through the real entry point: a kill is not out of memory, one run per
folder, interrupts close the run (a bad input, one line and exit 2 before any rank starts:
tests/unit/test_faults_refused.py; Hydra's own config error, exit 2 as a process:
tests/e2e/test_failures.py)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from support.processes import BASE, FAST, TESTS, TIMING, cpbench, ok, refused, results, wait_for

# A deterministic edge: rank 1 runs out of memory building any batch of N >= 256 (agreed in-process),
# so the probe's answer is max fit 192, first failure 256, whatever else happens.
PROBE = ["topology.cp=2", "sweep.n_tokens=[]", "probe.enabled=true", "probe.start=64", "probe.granularity=64",
         "probe.measure_at_max=false", "memory.cpu_budget_gib=1", "fault.rank=1", "fault.at_n=256",
         "fault.where=batch", *TIMING]  # fmt: skip
# The fold-cp-style test adapter can kill one of its ranks once at a given N (CPBENCH_TEST_KILL_ONCE).
ADAPTER = ["workload=adapter", "workload.module=adapters.fold_cp_style", "workload.contract=native"]


def max_fit(out: Path) -> tuple[int, int]:
    row = results(out).query("kind == 'max-fit'")
    assert len(row) == 1
    return int(row["N_tokens"].iloc[0]), int(row["oom_at"].iloc[0])


def test_a_kill_at_a_fitting_probe_n_is_retried_and_the_answer_is_a_clean_runs(tmp_path):
    clean = tmp_path / "clean"
    ok(cpbench(*ADAPTER, *PROBE, f"output_dir={clean}", cwd=tmp_path, timeout=180))
    assert max_fit(clean) == (192, 256)
    out = tmp_path / "out"
    kill = {"CPBENCH_TEST_KILL_ONCE": f"1:128:{tmp_path / 'killed'}"}
    proc = ok(cpbench(*ADAPTER, *PROBE, f"output_dir={out}", cwd=tmp_path, timeout=180, env=kill))
    assert (tmp_path / "killed").exists() and "relaunching, the run resumes" in proc.stderr
    assert "probe: N=128 was in flight when the last run stopped: trying it again" in proc.stderr
    assert max_fit(out) == max_fit(clean)
    trials = pd.read_csv(out / "probe.csv").set_index("N_tokens")
    assert trials.loc[128, "status"] == "ok" and "crashed" not in set(trials["status"])


def test_an_n_that_keeps_crashing_is_an_error_naming_it_never_an_edge(tmp_path):
    out = tmp_path / "out"
    args = [*PROBE, "fault.kind=kill", "fault.where=step", "launch.max_restarts=1", f"output_dir={out}"]
    proc = cpbench(*args, cwd=tmp_path, timeout=180)
    assert proc.returncode == 1, proc.stderr
    assert "cpbench: probe N=256 was in flight: the next run tries it again" in proc.stderr
    proc = cpbench(*args, cwd=tmp_path, timeout=180)
    assert proc.returncode == 1
    assert "probe: N=256 crashed 2 time(s) with no out-of-memory cause" in proc.stderr
    assert not (out / "results.csv").exists()  # no max-fit row: the N that crashed is no edge
    assert 256 not in set(pd.read_csv(out / "probe.csv")["N_tokens"])


def _start(args: list[str], cwd: Path) -> subprocess.Popen:
    """The run in its own session, with a TMPDIR of its own (cwd/tmp) to find what it leaves there."""
    cmd = [sys.executable, "-m", "cpbench", *BASE, *args]
    (cwd / "tmp").mkdir(exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(TESTS), "TMPDIR": str(cwd / "tmp")}
    return subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)  # fmt: skip


def _in_flight(out: Path) -> dict | None:
    try:
        return json.loads((out / "state.json").read_text())["in_flight"]
    except (OSError, ValueError, KeyError):
        return None


# Enough points that a run is still busy when the test acts on it.
SLOW = ["topology.cp=2", "sweep.n_tokens=[16,32,64,96,128,160,192,224,256]", "timing.warmup=1",
        "timing.repeats=20", "timing.warmup_max=1", "log.progress=false", "probe.enabled=false"]  # fmt: skip
# A quick point, then one of about 2.6 s (21 steps of 125 ms here): a signal sent while it is in flight
# lands inside it, not in the moment between two points.
LONG_POINT = [*SLOW, "sweep.n_tokens=[16,512]"]


def test_a_second_run_into_the_same_folder_is_refused_and_the_first_keeps_every_row(tmp_path):
    out = tmp_path / "out"
    first = _start([*SLOW, f"output_dir={out}"], tmp_path)
    try:
        wait_for(lambda: _in_flight(out) is not None, "a point in flight", first)
        second = refused(*SLOW, f"output_dir={out}", cwd=tmp_path)  # the lock refuses it before any rank
        assert second.returncode == 2
        assert second.stderr.strip().count("\n") == 0, second.stderr
        assert f"output_dir={out}: another run writes there (pid {first.pid} on " in second.stderr
        _, err = first.communicate(timeout=300)
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
    assert first.returncode == 0, err
    frame = results(out)
    assert len(frame) == 9 and frame["N_tokens"].is_unique and set(frame["status"]) == {"ok"}
    # Nothing left in its temporary folder: torch._dynamo's import (the FLOP counter's) would leave an
    # empty torchinductor_<user> there (cpbench/runtime/compile_cache.py).
    assert not list((tmp_path / "tmp").iterdir())
    # The same command into the finished folder: its lock was given back (a lock file a killed run leaves
    # behind is taken over: tests/e2e/test_probe.py, tests/e2e/test_sweeps.py).
    ok(cpbench(*SLOW, f"output_dir={out}", cwd=tmp_path, timeout=60))


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_an_interrupt_mid_point_closes_the_run_and_resume_measures_the_point(tmp_path, signum):
    out = tmp_path / "out"
    job = _start([*LONG_POINT, f"output_dir={out}"], tmp_path)
    try:
        # The long point itself (not the moment the first one's row is written and its flag not yet cleared).
        wait_for(lambda: (_in_flight(out) or {}).get("N_tokens") == 512, "the long point in flight", job)
        if signum == signal.SIGINT:
            os.killpg(job.pid, signal.SIGINT)  # Ctrl-C: the terminal signals the whole group
        else:
            os.kill(job.pid, signal.SIGTERM)  # a scheduler or `kill`: the launching process alone
        _, err = job.communicate(timeout=60)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
    assert job.returncode == 128 + signum, err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.startswith("cpbench:")]
    assert lines and lines[-1].startswith("cpbench: interrupted at N=")
    assert lines[-1].endswith("; run the same command to resume")
    state = json.loads((out / "state.json").read_text())
    n = int(lines[-1].split("N=")[1].split(";")[0])
    assert state["interrupted"] and state["in_flight"]["N_tokens"] == n
    assert (out / "cp_benchmark.md").exists()
    assert json.loads((out / "failure.json").read_text())["exit_code"] == 128 + signum
    before = results(out)
    assert n not in set(before["N_tokens"])
    assert not list((tmp_path / "tmp").glob("pytorch-errorfile-*"))  # torch's error files stay in logs/
    proc = ok(cpbench(*LONG_POINT, f"output_dir={out}", cwd=tmp_path, timeout=300))
    assert f"N={n} was in flight when the last run stopped" in proc.stderr
    after = results(out)
    assert list(after["N_tokens"]) == [16, 512] and set(after["status"]) == {"ok"}
    assert not (out / "failure.json").exists()


@pytest.mark.skipif((os.cpu_count() or 1) > 3, reason="needs more ranks than this machine's cores")
def test_more_ranks_than_cores_is_warned_and_recorded(tmp_path):
    out, cp = tmp_path / "out", (os.cpu_count() or 1) + 1
    proc = ok(cpbench(f"topology.cp={cp}", f"sweep.n_tokens=[{12 * cp}]", *FAST, f"output_dir={out}",
                      cwd=tmp_path, timeout=180))  # fmt: skip
    assert f"oversubscribed: {cp} ranks on {cp - 1} CPU core(s)" in proc.stderr
    meta = json.loads((out / "run.json").read_text())
    assert meta["ranks_per_device"] == round(cp / (cp - 1), 2) and meta["oversubscribed"].startswith("yes")
    assert "the share of time in collectives are not meaningful" in (out / "cp_benchmark.md").read_text()


def test_a_piped_run_says_which_step_is_under_way(tmp_path):
    """Without a terminal, rank 0's heartbeat names the point and the step under way, with the time."""
    out = tmp_path / "out"
    args = ["topology.cp=1", "sweep.n_tokens=[256]", "timing.warmup=1", "timing.repeats=20",
            "timing.warmup_max=1", "probe.enabled=false", "log.heartbeat_s=0.05",
            f"output_dir={out}"]  # fmt: skip
    proc = ok(cpbench(*args, cwd=tmp_path, timeout=120))
    beats = [line for line in proc.stderr.splitlines() if line.startswith("... N=256")]
    assert beats, proc.stderr
    assert any(re.search(r"\(timed step \d+ of 20\), \d+ s so far$", line) for line in beats), beats
