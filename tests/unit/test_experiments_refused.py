"""A bad experiment plan is refused in one line before anything runs (cpbench's main() in this process)."""

from __future__ import annotations

import pytest
from support.processes import refused
from support.run_inputs import PLANS


@pytest.mark.parametrize(
    ("plan_name", "line"),
    [
        (
            "bad_key",
            "cpbench: error: experiment X-1: workload.nonsense=3: Could not override 'workload.nonsense'.",
        ),
        ("bad_cycle", "cpbench: error: experiment: the gates form a cycle: A -> B -> A"),
    ],
)
def test_a_bad_plan_is_refused_in_one_line_before_anything_runs(tmp_path, plan_name, line):
    out = tmp_path / "out"
    proc = refused(PLANS, f"experiment={plan_name}", f"output_dir={out}", cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith(line) and proc.stderr.strip().count("\n") == 0, proc.stderr
    assert not out.exists()
