"""`python -m cpbench.check` on real run folders: a fresh run passes every rule; too few repeats and a
configuration mixed into a folder fail, naming their rules; a stray file fails. One process runs the
check through `python -m`; the others call its main() in-process. The rules on rows made in the test
(repeated points must agree): tests/unit/test_check_rules.py."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support.processes import FAST, cpbench, ok

from cpbench.check import main

RUN = [*FAST, "topology.cp=1", "timing.repeats=3", "sweep.n_tokens=[16,32]"]


def check(*dirs) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "cpbench.check", *map(str, dirs)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def fresh(tmp_path_factory):
    out = tmp_path_factory.mktemp("fresh")
    ok(cpbench(*RUN, f"output_dir={out}", cwd=out, timeout=300))
    return out


def test_a_fresh_run_passes_every_rule(fresh):
    proc = check(fresh)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 8 and lines[-1] == "all rules pass"
    assert lines[0].startswith("PASS  warm-up >= 1 and repeats >= 3: 2 timed point(s)")
    assert lines[1].startswith("PASS  metadata complete")
    assert lines[2].startswith("PASS  like-for-like")
    # Rules whose inputs are absent say so rather than pass.
    assert lines[4].startswith("N/A   same answer twice") and lines[5].startswith("N/A   convergence")
    assert lines[6] == "PASS  no stray files: 1 folder(s)"


@pytest.fixture(scope="module")
def mixed(fresh, tmp_path_factory):
    """The fresh run's folder with a second run of another dtype and too few repeats written into it."""
    out = tmp_path_factory.mktemp("mixed") / "mixed"
    shutil.copytree(fresh, out)
    args = ["dtype=bfloat16", "timing.repeats=1", "sweep.n_tokens=[16]", f"output_dir={out}"]
    ok(cpbench(*RUN, *args, cwd=out.parent, timeout=300))
    return out


def test_too_few_repeats_and_a_mixed_configuration_fail_naming_their_rules(mixed, capsys):
    assert main([str(mixed)]) == 1
    out = capsys.readouterr().out
    assert "FAIL  warm-up >= 1 and repeats >= 3: 1 point(s) below: mixed N=16 (warm-up 1, repeats 1)" in out
    assert "FAIL  like-for-like (one workload, workflow, dtype and config per run): mixed mixes dtype " \
           "bfloat16, float32; mixed mixes config_hash" in out  # fmt: skip
    assert out.endswith("2 rule(s) fail\n")


def test_a_stray_file_fails(fresh, tmp_path, capsys):
    out = tmp_path / "run"
    shutil.copytree(fresh, out)
    (out / "notes.txt").write_text("a file no run writes")
    assert main([str(out)]) == 1
    assert f"FAIL  no stray files: 1 unknown: {out / 'notes.txt'}" in capsys.readouterr().out


def test_the_published_report_passes():
    """docs/cp_benchmark.md, as it ships: its CSV and metadata table meet every rule that applies."""
    report = Path(__file__).resolve().parents[2] / "docs" / "cp_benchmark.md"
    proc = check(report)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.splitlines()[-1] == "all rules pass"
    assert not any(line.startswith("FAIL") for line in proc.stdout.splitlines())
