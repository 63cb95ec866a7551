"""What keeps the default run short without shrinking it: large tensors come in huge pages under the CPU
cap (and the probe starts from the walltime points already measured: tests/unit/test_default_run_ramp.py)."""

from __future__ import annotations

import os
import subprocess
import sys

from cpbench import HUGE_PAGES


def _huge_pages_after_import(env: dict) -> str:
    code = "import os, cpbench; print(os.environ.get('THP_MEM_ALLOC_ENABLE'))"
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    return run.stdout.strip()


def test_huge_pages_are_on_before_torch_loads_unless_the_environment_says_otherwise():
    env = {k: v for k, v in os.environ.items() if k != HUGE_PAGES}
    assert _huge_pages_after_import(env) == "1"
    assert _huge_pages_after_import({**env, HUGE_PAGES: "0"}) == "0"
