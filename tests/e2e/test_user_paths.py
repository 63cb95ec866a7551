"""The paths a user takes together, through `python -m cpbench`: each item of the user-paths issue
that once ended in a traceback or a wrong answer, and the path matrix that crosses workflow, layout,
baseline, mode and probe (tests/support/path_matrix.py). Items 1 (a convergence run whose baseline writes
no rows) and 2 (training checksums against the warm-up count and the cp=1 baseline) are checked on the
path matrix's runs: tests/e2e/test_path_matrix_training.py."""

from __future__ import annotations

from omegaconf import OmegaConf
from support.processes import TIMING, cpbench, ok, one_line_exit_2, results


def test_a_refused_baseline_refuses_the_run_in_one_line(tmp_path):
    """Item 1: the time budget refuses the cp=1 baseline's plan: the CP run is refused with its line.
    0.6 ms: below any one measurement (at 0.001 min an idle machine's trimmed cp=1 plan fit)."""
    out = tmp_path / "out"
    args = ["baseline=true", "budget.minutes=0.00001", "sweep.n_tokens=[16,32]", "probe.enabled=false",
            "log.progress=false", f"output_dir={out}"]  # fmt: skip
    proc = cpbench(*args, cwd=tmp_path, timeout=240)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "cpbench: the cp=1 baseline: budget.minutes=5e-06" in proc.stderr  # its half of the budget
    assert not (out / "logs" / "ranks").exists()  # the CP ranks never started


def test_a_tight_cap_leaves_the_report_whole(tmp_path):
    """Item 3: the cap is for the measured steps. A cap the steps fit in but the report's plot would
    not (cp=1: the launching process measures, then renders) still gives the report and its plot."""
    out = tmp_path / "out"
    args = ["topology.cp=1", "memory.cpu_budget_gib=0.03", "sweep.n_tokens=[16]", "probe.enabled=false",
            *TIMING, f"output_dir={out}"]  # fmt: skip
    ok(cpbench(*args, cwd=tmp_path, timeout=180))
    assert results(out)["status"].tolist() == ["ok"]
    assert (out / "cp_benchmark.md").exists() and (out / "cp_benchmark_walltime.png").exists()


def test_convergence_out_of_memory_is_one_line(tmp_path):
    """Item 5: a convergence step that does not fit names the N, the cap and what to change."""
    out = tmp_path / "out"
    args = ["workflow=convergence", "topology.cp=2", "shape.n_tokens=512", "memory.cpu_budget_gib=0.2",
            "convergence.steps=2", "log.progress=false", f"output_dir={out}"]  # fmt: skip
    line = one_line_exit_2(cpbench(*args, cwd=tmp_path, timeout=240))
    assert "workflow=convergence: N_tokens=512 does not fit in 0.2 GiB per rank" in line
    assert "lower shape.n_tokens" in line
    assert OmegaConf.load(out / "failure.json")["exit_code"] == 2


def test_no_sweep_points_is_the_probe_alone_with_its_baseline(tmp_path):
    """Item 6: sweep.n_tokens=[] with the probe (and the default baseline) is the probe alone."""
    out = tmp_path / "out"
    args = ["sweep.n_tokens=[]", "baseline=true", "probe.start=16", "probe.max_tokens=32",
            "probe.granularity=16", *TIMING, f"output_dir={out}"]  # fmt: skip
    ok(cpbench(*args, cwd=tmp_path, timeout=240))
    frame = results(out)
    fits = frame[frame["kind"] == "max-fit"]
    assert sorted(fits["source"].fillna("").tolist()) == ["", "baseline"]
