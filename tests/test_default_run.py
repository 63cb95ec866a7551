"""What keeps the default run short without shrinking it: the probe starts from the walltime points
already measured, and large tensors come in huge pages under the CPU cap."""

from __future__ import annotations

import os

from cpbench.measure.budget import HUGE_PAGES, use_huge_pages
from cpbench.probe.search import SearchConfig, Trial, next_trial

CFG = SearchConfig(start=256, factor=2.0, granularity=64)


def test_walltime_points_start_the_ramp_but_never_below_the_start():
    points = [Trial(64, True, "ok", 0.34), Trial(128, True, "ok", 0.37)]
    assert next_trial(CFG, points).n == 256  # below the start: the ramp begins at the start
    assert next_trial(CFG, [*points, Trial(256, True, "ok", 0.47)]).n == 512  # 256 is not stepped again
    # A point that ran out of memory bounds the search like any failed step.
    assert next_trial(CFG, [*points, Trial(256, False, "oom", 1.2)]).n == 192


def test_huge_pages_are_on_for_the_ranks_unless_the_environment_says_otherwise(monkeypatch):
    monkeypatch.delenv(HUGE_PAGES, raising=False)
    use_huge_pages()
    assert os.environ[HUGE_PAGES] == "1"  # the ranks started from here inherit it
    monkeypatch.setenv(HUGE_PAGES, "0")
    use_huge_pages()
    assert os.environ[HUGE_PAGES] == "0"
