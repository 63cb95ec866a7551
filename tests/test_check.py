"""`python -m cpbench.check` on real run folders: a fresh run passes every rule; too few repeats and a
configuration mixed into a folder each fail, naming their rule; repeated points must agree."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pandas as pd
import pytest
from conftest import FAST, cpbench, ok

from cpbench.check import Results, Run, rule_same_answer

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


def test_too_few_repeats_fail_naming_the_rule(tmp_path):
    out = tmp_path / "few"
    ok(cpbench(*RUN, "timing.repeats=1", f"output_dir={out}", cwd=tmp_path, timeout=300))
    proc = check(out)
    assert proc.returncode == 1
    assert (
        "FAIL  warm-up >= 1 and repeats >= 3: 2 point(s) below: few N=16 (warm-up 1, repeats 1)"
        in proc.stdout
    )
    assert "PASS  like-for-like" in proc.stdout and proc.stdout.endswith("1 rule(s) fail\n")


def test_a_configuration_mixed_into_a_folder_fails_naming_the_rule(fresh, tmp_path):
    out = tmp_path / "mixed"
    shutil.copytree(fresh, out)
    ok(cpbench(*RUN, "dtype=bfloat16", "sweep.n_tokens=[16]", f"output_dir={out}", cwd=tmp_path, timeout=300))
    proc = check(out)
    assert proc.returncode == 1
    assert "FAIL  like-for-like (one workload, workflow, dtype and config per run): mixed mixes dtype " \
           "bfloat16, float32; mixed mixes config_hash" in proc.stdout  # fmt: skip
    (out / "notes.txt").write_text("a file no run writes")
    assert f"FAIL  no stray files: 1 unknown: {out / 'notes.txt'}" in check(out).stdout


def _run(name: str, checksum: float) -> Run:
    row = {"kind": "point", "status": "ok", "config_hash": "abc", "N_tokens": 16, "N_atoms": 144,
           "MSA_depth": 16, "checksum": checksum}  # fmt: skip
    return Run(name, pd.DataFrame([row]), {}, None)


def test_a_repeated_point_must_give_the_same_answer():
    assert rule_same_answer(Results([_run("a", 1.25)])).status == "n/a"
    assert rule_same_answer(Results([_run("a", 1.25), _run("b", 1.25)])).status == "pass"
    differ = rule_same_answer(Results([_run("a", 1.25), _run("b", 1.5)]))
    assert differ.status == "fail" and "checksums differ: N=16 (a, b)" in differ.detail
