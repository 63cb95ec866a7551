"""The merged report's command line (`python -m cpbench.report`): publishing, and what it cannot merge."""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd
import pytest
from support.processes import results, run_cmd
from support.report_folders import write_sweep

from cpbench.results.folder import RunFolder


@pytest.fixture
def sweep(tmp_path) -> Path:
    """support/report_folders.py's sweep: a cp=1,2,4 sweep, a bfloat16 run, a failed job, a killed one."""
    return write_sweep(tmp_path / "sweep")


def test_report_cli_and_publish(sweep, tmp_path):
    docs = tmp_path / "docs"
    proc = run_cmd([sys.executable, "-m", "cpbench.report", str(sweep), "--publish", str(docs)], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [str(sweep / "cp_benchmark.md"), str(docs / "cp_benchmark.md")]
    assert "merged 11 row(s) from 6 run(s)" in proc.stderr and "4_cp8: rank 3 failed" in proc.stderr
    assert sorted(p.name for p in docs.iterdir()) == sorted(
        ["cp_benchmark.md", "cp_benchmark.csv", RunFolder.MAX_N_PLOT, RunFolder.WALLTIME_PLOT]
    )
    text = (docs / "cp_benchmark.md").read_text()
    assert "every row is in [cp_benchmark.csv](cp_benchmark.csv)" in text
    assert (
        f"![walltime vs N_tokens per cp]({RunFolder.WALLTIME_PLOT})" in text
        and f"]({RunFolder.MAX_N_PLOT})" in text
    )
    assert "Hardware: CPU (x86_64, 2 cores), gloo." in text and "stand until GPU results replace them" in text
    assert "## Run metadata" in text and "| torch | 2.13.0+cpu |" in text
    published = pd.read_csv(docs / "cp_benchmark.csv")
    assert len(published) == 11 and published.columns[-1] == "run"


def test_report_cli_rejects_what_it_cannot_merge(sweep, tmp_path):
    missing = run_cmd([sys.executable, "-m", "cpbench.report", str(tmp_path / "nope")], cwd=tmp_path)
    assert missing.returncode == 2 and "nope: no such folder" in missing.stderr
    several = run_cmd(
        [sys.executable, "-m", "cpbench.report", str(sweep / "0_cp1"), str(sweep / "1_cp2")], cwd=tmp_path
    )
    assert several.returncode == 2 and "name where the merge goes (--out)" in several.stderr
    into_a_run = run_cmd(
        [sys.executable, "-m", "cpbench.report", str(sweep), "--out", str(sweep / "0_cp1")], cwd=tmp_path
    )
    assert into_a_run.returncode == 2 and "is one of the runs merged" in into_a_run.stderr
    out = tmp_path / "two"
    two = run_cmd(
        [
            sys.executable,
            "-m",
            "cpbench.report",
            str(sweep / "0_cp1"),
            str(sweep / "2_cp4"),
            "--out",
            str(out),
        ],
        cwd=tmp_path,
    )
    assert two.returncode == 0, two.stderr
    assert list(results(out)["run"].unique()) == ["0_cp1", "2_cp4"]
