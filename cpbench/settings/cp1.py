"""The same job on one rank: the cp=1 run a CP run is compared with (the baseline beside it, and
mode=accuracy's reference, which are one run)."""

from __future__ import annotations

import copy

from cpbench.settings.schema import BenchConfig, FaultConfig, Mode, TopologyConfig


def cp1_settings(settings: BenchConfig) -> BenchConfig:
    """`settings` on one 1d rank, without a fault, a repeat check or a baseline of its own. In
    mode=accuracy without the probe too: the points are what is checked, and the probe's N are the
    layout's own."""
    one = copy.deepcopy(settings)
    one.topology = TopologyConfig(kind="1d", cp=1, grid=None)
    one.fault = FaultConfig()
    one.repeat_check = 0
    one.baseline = False
    if settings.mode is Mode.accuracy:
        one.probe.enabled = False
    return one
