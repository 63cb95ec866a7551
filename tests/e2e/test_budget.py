"""The time budget (cpbench.preview.budget) in real runs: a run through `python -m cpbench` that cannot
fit and so runs nothing, and a restart that goes on with the run's budget. The budget itself, a pure
function of the plan, one measured step and the budget: tests/unit/test_budget_plan.py."""

from __future__ import annotations

import json

from support.processes import FAST, TIMING, cpbench, ok, results, torchrun

from cpbench.launch.torchrun import SHARED_STORE


def test_a_run_over_budget_says_so_in_one_line_and_measures_nothing(tmp_path):
    args = ["topology.cp=1", "sweep.n_tokens=[16,32]", "budget.minutes=0.00001", "output_dir=out"]
    proc = cpbench(*FAST, *args, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    refusals = [line for line in proc.stderr.splitlines() if line.startswith("cpbench: budget.minutes=")]
    assert len(refusals) == 1 and "nothing run" in refusals[0]
    assert "plan: 2 point(s) x (1 warm-up + 2 repeats)" in proc.stdout + proc.stderr  # said first
    out = tmp_path / "out"
    assert not (out / "results.csv").exists()
    assert json.loads((out / "state.json").read_text())["in_flight"] is None  # no point to resume
    assert json.loads((out / "run.json").read_text())["time_budget"]["refusal"] == refusals[0].removeprefix(
        "cpbench: "
    )


# The fold-cp-style test adapter kills rank 1 once when its batch at N=32 is built (CPBENCH_TEST_KILL_ONCE):
# in the second point, after the plan (whose timed step is the largest point's, N=48).
KILLED_AT_32 = ["workload=adapter", "workload.module=adapters.fold_cp_style", "workload.contract=native",
                *FAST, "topology.cp=2", "sweep.n_tokens=[16,32,48]"]  # fmt: skip
MEASURED = [(16, "ok"), (32, "ok"), (48, "ok")]


def test_a_restart_goes_on_with_the_runs_budget_and_runs_what_is_left_trimmed(tmp_path):
    """Rank 1 dies 7 s into the second point of a run with a 6 s budget: the relaunched ranks plan what
    is left against the budget left (none), and measure it trimmed to the least rather than refusing it:
    the first plan stays the run's, the restart's is one more line, and what it took counts both."""
    kill = {"CPBENCH_TEST_KILL_ONCE": f"1:32:{tmp_path / 'killed'}", "CPBENCH_TEST_KILL_AFTER_S": "7"}
    proc = ok(cpbench(*KILLED_AT_32, "budget.minutes=0.1", "output_dir=out", cwd=tmp_path, env=kill))
    assert "relaunching, the run resumes (restart 1 of 3)" in proc.stderr
    out = tmp_path / "out"
    # Trimmed to the least: of N=32 (in flight when rank 1 died) and 48, the smaller is cut.
    assert list(zip(results(out)["N_tokens"], results(out)["status"], strict=True)) == [
        (16, "ok"),
        (48, "ok"),
    ]
    planned = json.loads((out / "run.json").read_text())["time_budget"]
    assert planned["line"].startswith("plan: 3 point(s) x (1 warm-up + 2 repeats)")
    assert planned["line"].endswith("budget 0.1 min") and planned["refusal"] is None
    [again] = planned["restarts"]
    assert again.startswith("restart 1, 0 min of the budget left: plan: 2 point(s) x (1 warm-up + 2 repeats)")
    assert "; trimmed to 1 point(s)" in again and again.endswith(
        "budget 0 min; over it even so: it runs as trimmed"
    )
    assert "what is left is over the budget left even trimmed; it runs as trimmed" in proc.stderr
    assert planned["took_s"] > 7  # from the first plan's timed step, the killed ranks' time included
    report = (out / "cp_benchmark.md").read_text()
    assert "(its timed step and 1 restart(s) included)." in report and f"- {again}" in report


def test_torchruns_restart_goes_on_with_the_runs_budget(tmp_path):
    """torchrun --max-restarts=1 starts the world again after rank 1 dies: the workers know it from
    torchrun's own count, so the run keeps its first plan and adds the restart's. By default torch
    shares its rendezvous store with the ranks, and a restart could read the killed attempt's addresses
    (pytorch/pytorch#135712: here 3 of 7 such restarts failed to connect): cpbench says so first."""
    # No kill, one point: what it proves is the warning, said before any point runs.
    quiet = ok(torchrun(2, *KILLED_AT_32, "sweep.n_tokens=[16]", "output_dir=shared", cwd=tmp_path,
                        max_restarts=1))  # fmt: skip
    assert f"cpbench: {SHARED_STORE}" in quiet.stderr and (tmp_path / "shared" / "results.csv").exists()
    kill = {
        "CPBENCH_TEST_KILL_ONCE": f"1:32:{tmp_path / 'killed'}",
        "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
    }
    proc = ok(
        torchrun(
            2, *KILLED_AT_32, "budget.minutes=600", "output_dir=out", cwd=tmp_path, env=kill, max_restarts=1
        )
    )
    assert SHARED_STORE not in proc.stderr
    out = tmp_path / "out"
    assert (tmp_path / "killed").exists()
    assert list(zip(results(out)["N_tokens"], results(out)["status"], strict=True)) == MEASURED
    planned = json.loads((out / "run.json").read_text())["time_budget"]
    assert planned["line"].startswith("plan: 3 point(s) x (1 warm-up + 2 repeats)")
    [again] = planned["restarts"]
    assert again.startswith("restart 1, ") and "min of the budget left: plan: 2 point(s)" in again


# A step that grows as N^3 on real tensors (the FLOP count's trace on fake tensors is left quick), beside
# the plan's N^2: the probe's last ramp steps cost far more than the plan said.
CUBIC_STEPS = """
import time

from torch._subclasses.fake_tensor import FakeTensor

from adapters.fold_cp_style import build_batch, build_model
from adapters.fold_cp_style import run_step as _run_step


def run_step(model, batch, train):
    if not isinstance(batch, FakeTensor):
        time.sleep(0.2 * (batch.shape[1] / 64) ** 3)
    return _run_step(model, batch, train)
"""
CUBIC = ["workload=adapter", "workload.module=cubic_steps", "workload.contract=native", *TIMING,
         "topology.cp=2", "output_dir=out"]  # fmt: skip


def test_a_probe_whose_next_step_would_overrun_the_budget_stops_and_gives_its_fit_as_a_bound(tmp_path):
    """Steps of 0.2 s x (N/64)^3 under a cap the probe cannot reach by N=512: the plan prices them by
    N^2 from the timed step (512's at 13 s: it fits the 0.5 minutes), but N=256 takes 13 s and 512
    would take 102. The probe fits its steps' growth (a + b N^2 + c N^3), stops before 512 and says so;
    the run ends within the budget plus 10 %, its max-fit row and readout giving 256 as a bound."""
    (tmp_path / "cubic_steps.py").write_text(CUBIC_STEPS)
    env = {"PYTHONPATH": str(tmp_path)}
    probe = ["sweep.n_tokens=[32,64]", "probe.enabled=true", "probe.start=128", "probe.max_tokens=512",
             "probe.measure_at_max=false", "budget.minutes=0.5"]  # fmt: skip
    proc = ok(cpbench(*CUBIC, *probe, cwd=tmp_path, env=env))
    out = tmp_path / "out"
    said = [line for line in proc.stderr.splitlines() if "probe: stopped before N=512:" in line]
    assert len(said) == 1 and "past the 0.5-minute budget" in said[0], proc.stderr
    planned = json.loads((out / "run.json").read_text())["time_budget"]
    assert planned["refusal"] is None and planned["took_s"] <= 1.1 * 30, planned
    [row] = results(out).query("kind == 'max-fit'").itertuples()
    assert (row.N_tokens, row.status) == (256, "ok")
    assert row.error.startswith("max fit >= 256; the edge not reached: N=512's step would take ~")
    report = (out / "cp_benchmark.md").read_text()
    assert "Notes:\n\n- N=256 (ok): max fit >= 256; the edge not reached" in report  # the max-fit row's
    assert "Largest N_tokens that fits: >= 256 at cp=2. At cp=2 the probe stopped short of the edge" in report


def test_with_no_estimate_the_points_stop_once_the_budget_is_spent(tmp_path):
    """The plan's timed step (the largest point, N=2,048) does not fit the cap: no estimate, so the plan
    runs as set, and once the budget (6 s) is spent the points left are not measured, saying so."""
    (tmp_path / "cubic_steps.py").write_text(CUBIC_STEPS.replace("0.2 * (batch.shape[1] / 64) ** 3", "1.0"))
    sweep = ["sweep.n_tokens=[16,32,48,64,80,2048]", "memory.cpu_budget_gib=0.05", "budget.minutes=0.1"]
    proc = ok(cpbench(*CUBIC, *sweep, "probe.enabled=false", cwd=tmp_path, env={"PYTHONPATH": str(tmp_path)}))
    assert "the timed step at N=2048 did not fit: no estimate" in proc.stderr
    said = [line for line in proc.stderr.splitlines() if "budget: spent before N=" in line]
    assert len(said) == 1, proc.stderr
    measured = list(results(tmp_path / "out")["N_tokens"])
    assert 0 < len(measured) < 5 and measured == [16, 32, 48, 64, 80][: len(measured)]
    left = 6 - len(measured)
    assert said[0].endswith(f"spent before N={16 * (len(measured) + 1)}: {left} point(s) not measured")
