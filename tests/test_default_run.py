"""What keeps the default run short without shrinking it: the probe starts from the walltime points
already measured, and large tensors come in huge pages under the CPU cap."""

from __future__ import annotations

import os
import subprocess
import sys

from cpbench import HUGE_PAGES
from cpbench.probe.search import SearchConfig, Trial, next_trial
from cpbench.settings.schema import ProbeConfig

CFG = SearchConfig(ProbeConfig(start=256, factor=2.0, granularity=64))


def test_walltime_points_start_the_ramp_but_never_below_the_start():
    points = [Trial(64, True, "ok", 0.34), Trial(128, True, "ok", 0.37)]
    assert next_trial(CFG, points).n == 256  # below the start: the ramp begins at the start
    assert next_trial(CFG, [*points, Trial(256, True, "ok", 0.47)]).n == 512  # 256 is not stepped again
    # A point that ran out of memory bounds the search like any failed step.
    assert next_trial(CFG, [*points, Trial(256, False, "oom", 1.2)]).n == 192


def _huge_pages_after_import(env: dict) -> str:
    code = "import os, cpbench; print(os.environ.get('THP_MEM_ALLOC_ENABLE'))"
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    return run.stdout.strip()


def test_huge_pages_are_on_before_torch_loads_unless_the_environment_says_otherwise():
    env = {k: v for k, v in os.environ.items() if k != HUGE_PAGES}
    assert _huge_pages_after_import(env) == "1"
    assert _huge_pages_after_import({**env, HUGE_PAGES: "0"}) == "0"
