"""Nothing left behind, checked (cpbench.checks.footprint): a stray file written by a workload outside
output_dir is caught and reported in cp_benchmark.md and on stderr; a normal run reports nothing."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from support.processes import FAST, cpbench, ok

from cpbench.checks.footprint import Snapshot

STRAY = ["workload=adapter", "workload.module=adapters.stray_writer", "workload.contract=native",
         "topology.cp=1", "sweep.n_tokens=[16]", *FAST]  # fmt: skip


def test_snapshot_sees_new_changed_and_git_status_outside_the_output_dir(tmp_path):
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    (tmp_path / "kept.txt").write_text("a")
    out = tmp_path / "out"
    out.mkdir()
    before = Snapshot.take(tmp_path, (out,))
    (out / "results.csv").write_text("inside the run's folder")
    assert before.compare().left == ()
    assert "git status is unchanged" in before.compare().line
    (tmp_path / "stray.txt").write_text("b")
    (tmp_path / "kept.txt").write_text("changed")
    left = before.compare().left
    assert "stray.txt (new)" in left and "kept.txt (changed)" in left
    assert "git status: +?? stray.txt" in left


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """One clean run and one whose workload writes a stray file into the working directory."""
    clean, dirty = tmp_path_factory.mktemp("clean"), tmp_path_factory.mktemp("dirty")
    subprocess.run(["git", "init", "-q"], cwd=dirty, check=True)
    return (
        ok(cpbench(*STRAY, "output_dir=out", cwd=clean, timeout=240)),
        ok(
            cpbench(*STRAY, "output_dir=out", cwd=dirty, timeout=240, env={"CPBENCH_TEST_STRAY": "stray.txt"})
        ),
        clean,
        dirty,
    )


def test_a_normal_run_leaves_nothing_and_says_so(runs):
    proc, _, clean, _ = runs
    assert sorted(p.name for p in clean.iterdir()) == ["out"]
    report = (clean / "out" / "cp_benchmark.md").read_text()
    assert "Nothing written outside output_dir" in report
    assert "written outside" not in proc.stderr


def test_a_stray_file_is_caught_in_the_report_and_on_stderr(runs):
    _, proc, _, dirty = runs
    assert (dirty / "stray.txt").exists()
    assert "written outside output_dir" in proc.stderr and "stray.txt (new)" in proc.stderr
    report = (dirty / "out" / "cp_benchmark.md").read_text()
    section = report.split("## Left behind")[1].split("##")[0]
    assert "stray.txt (new)" in section and "git status: +?? stray.txt" in section


def test_an_adapter_declares_its_real_job_as_limitations(runs):
    """The module's REAL_JOB entries are rows of the what-changed table, with no setting to change."""
    _, _, clean, _ = runs
    report = (clean / "out" / "cp_benchmark.md").read_text()
    row = next(line for line in report.splitlines() if line.startswith("| denoising steps"))
    assert "| 2 | 200 | limitation: needs an edit to the code |" in row
    assert Path(clean / "out" / "results.csv").exists()
