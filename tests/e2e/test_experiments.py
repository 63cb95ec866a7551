"""An experiment plan end to end through `python -m cpbench experiment=...`: the plan of
tests/plans/experiment/axial_gate.yaml on axial_mix at N=16, killed mid-plan and run again to the
end (one plan's worth of runs, shared by the tests here). Bad plans, refused before anything runs:
tests/unit/test_experiments_refused.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from support.processes import BASE, TESTS, cpbench, ok, results
from support.run_inputs import PLANS

ARGS = [PLANS, "experiment=axial_gate", "timing.warmup=1", "timing.repeats=3", "log.progress=false"]
VERDICTS = {"better", "worse", "within noise"}


@pytest.fixture(scope="module")
def plan(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """The plan killed (SIGKILL of its process group) while its second experiment runs, then run
    again with the same command to the end."""
    tmp = tmp_path_factory.mktemp("plan")
    out = tmp / "out"
    cmd = [sys.executable, "-m", "cpbench", *BASE, *ARGS, f"output_dir={out}"]
    env = {**os.environ, "PYTHONPATH": str(TESTS)}
    first = subprocess.Popen(cmd, cwd=tmp, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                             text=True, start_new_session=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 180
        while not (out / "experiments" / "HEAVY-1").exists():
            assert first.poll() is None, first.communicate()[1]
            assert time.monotonic() < deadline, "the plan never reached its second experiment"
            time.sleep(0.05)
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.communicate()
    return out, ok(cpbench(*ARGS, f"output_dir={out}", cwd=tmp, timeout=300))


def test_a_killed_plan_resumes_at_its_first_unfinished_run(plan):
    out, proc = plan
    for name in ("baseline_0", "LIGHT-1", "baseline_1"):
        assert f"experiment: {name}: finished before, read from {out / 'experiments' / name}" in proc.stderr
        assert len(results(out / "experiments" / name)) == 1  # measured once, not again
    assert "experiment: HEAVY-1: running workload.blocks=6" in proc.stderr
    assert "experiment: baseline_0: running" not in proc.stderr


def test_every_experiment_has_its_verdict_with_its_figures(plan):
    out, _ = plan
    frame = pd.read_csv(out / "experiments.csv", keep_default_na=False, na_values=[""]).set_index("id")
    measured = frame.drop(index="BOTH-1")
    assert set(measured["verdict"]) <= VERDICTS
    for row in measured.itertuples():
        assert row.ci_low_pct <= row.walltime_change_pct <= row.ci_high_pct
        assert row.verdict != "better" or row.ci_high_pct < 0
        assert row.verdict != "worse" or row.ci_low_pct > 0
        assert row.first_step_ms > 0 and row.peak_mem_gib > 0 and row.N_tokens == 16
    report = (out / "experiments.md").read_text()
    assert (
        all(f"| {i} |" in report for i in frame.index) and (out / "experiments_walltime.png").stat().st_size
    )


def test_the_gate_runs_on_its_groups_winner(plan):
    out, _ = plan
    frame = pd.read_csv(out / "experiments.csv", keep_default_na=False, na_values=[""]).set_index("id")
    depth = frame.loc[["LIGHT-1", "HEAVY-1"]]
    better = depth[depth["verdict"] == "better"]
    expected = better["walltime_change_pct"].idxmin() if len(better) else "baseline"
    wide = frame.loc["WIDE-1"]
    assert wide["ran_on"] == expected
    winner_overrides = frame.loc[expected, "change"] if expected != "baseline" else ""
    assert wide["applied"] == f"{winner_overrides} workload.hidden=128".strip()
    # Its reference is the winner's own configuration, measured again: the same output checksum.
    runs = out / "experiments"
    refs = wide["references"].split()
    reference_run = runs / (expected if expected != "baseline" else "baseline_0")
    assert all(name.endswith(f"_on_{expected}") or expected == "baseline" for name in refs)
    assert {results(runs / r)["checksum"].iloc[0] for r in refs} == {
        results(reference_run)["checksum"].iloc[0]
    }


def test_only_if_is_skipped_when_what_it_names_did_not_improve(plan):
    out, proc = plan
    frame = pd.read_csv(out / "experiments.csv", keep_default_na=False, na_values=[""]).set_index("id")
    if frame.loc["HEAVY-1", "verdict"] == "better":
        # Three times the blocks, faster: only the machine's noise (another test's ranks starting)
        # does that at N=16. What only_if names improved, so BOTH-1 ran.
        assert frame.loc["BOTH-1", "verdict"] in VERDICTS and (out / "experiments" / "BOTH-1").exists()
        return
    assert frame.loc["BOTH-1", "verdict"] == "skipped"
    assert "experiment: BOTH-1: skipped: none of HEAVY-1 improved" in proc.stderr
    assert not (out / "experiments" / "BOTH-1").exists()
