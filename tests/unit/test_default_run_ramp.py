"""The default run's probe ramp starts at its walltime points, never below its start."""

from __future__ import annotations

from cpbench.probe.search import SearchConfig, Trial, next_trial
from cpbench.settings.schema import ProbeConfig

CFG = SearchConfig(ProbeConfig(start=256, factor=2.0, granularity=64))


def test_walltime_points_start_the_ramp_but_never_below_the_start():
    points = [Trial(64, True, "ok", 0.34), Trial(128, True, "ok", 0.37)]
    assert next_trial(CFG, points).n == 256  # below the start: the ramp begins at the start
    assert next_trial(CFG, [*points, Trial(256, True, "ok", 0.47)]).n == 512  # 256 is not stepped again
    # A point that ran out of memory bounds the search like any failed step.
    assert next_trial(CFG, [*points, Trial(256, False, "oom", 1.2)]).n == 192
