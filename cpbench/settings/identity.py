"""The identities a run keys its records by, decided in one table: which settings make up each.

- `config_hash`: the rows of one configuration. Rows of an equal hash are resumed, compared and
  reported as one configuration; a point's row names its own shape, so the shapes are not in it.
- `baseline_key`: the cp=1 baseline's cache folder (`baseline/<key>/`), of the baseline's own settings:
  everything that changes the cp=1 answer, and nothing about where or how it is launched.
- `curve_key`: a convergence curve, by the settings its loss depends on (not the topology, which must
  not change it): the name of its reference under docs/reference/.

Every field of `BenchConfig` is assigned here, to some of them or to none, and tests/unit/test_identity.py
fails when one is missing: a new setting cannot silently break resume, caching or the references.
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Any

from omegaconf import OmegaConf

from cpbench.settings.schema import BenchConfig

ROWS, BASELINE, CURVE = "config_hash", "baseline_key", "curve_key"

# setting -> the identities it is part of (and why, where it is not obvious).
PART_OF: dict[str, tuple[str, ...]] = {
    "command": (),  # what the call does around its rows (calibrate measures as measure does)
    "workload": (ROWS, BASELINE, CURVE),
    "workload_preset": (),  # a label: the workload's settings are its identity
    "workflow": (ROWS, BASELINE),
    "mode": (ROWS, BASELINE),
    "repeat_check": (BASELINE,),  # always 0 in the baseline's settings
    "dtype": (ROWS, BASELINE, CURVE),
    "matmul_precision": (ROWS, BASELINE),
    "topology": (ROWS, BASELINE),  # the baseline's is cp=1 of the run's kind
    "shape": (BASELINE, CURVE),  # rows name their own shape
    "sweep": (BASELINE,),  # which points: a row names its own
    "data": (ROWS, BASELINE),
    "probe": (BASELINE,),  # how the edge is searched, not what a step measures
    "timing": (ROWS, BASELINE),
    "budget": (BASELINE,),  # the time budget trims the plan, not a point's figures
    "accuracy": (ROWS, BASELINE),
    "measure": (ROWS, BASELINE),  # peak_tflops too: a row's mfu divides by it
    "memory": (ROWS, BASELINE),  # alloc_conf too: the allocator's settings move peaks and what fits
    "dist": (ROWS, BASELINE),
    "launch": (),  # how ranks start
    "fault": (ROWS, BASELINE),  # the baseline's has none
    "slurm": (),
    "optim": (ROWS, BASELINE, CURVE),
    "convergence": (ROWS, BASELINE),
    "forecast": (),  # predicts from the rows, measures nothing
    "checkpoint": (BASELINE,),
    "log": (),
    "experiment": (BASELINE,),
    "seed": (ROWS, BASELINE, CURVE),
    "baseline": (),
    "job": (),  # the what-changed table's reference, not the run's
    "output_dir": (),
}
# Settings inside a group above that no key includes: where the ranks run, not what they compute (and
# left out, a run's keys are what they were before the setting existed).
LEFT_OUT: tuple[str, ...] = ("dist.socket_ifname",)  # the network interface the ranks meet on
# The curve's settings in the order its published keys were made with (docs/reference/).
_CURVE_ORDER = ("workload", "dtype", "shape", "seed", "optim")


def _hash(chosen: dict[str, Any]) -> str:
    return hashlib.sha256(OmegaConf.to_yaml(OmegaConf.create(chosen)).encode()).hexdigest()[:12]


def _part(settings: BenchConfig, identity: str, order: tuple[str, ...] | None = None) -> dict[str, Any]:
    container = OmegaConf.to_container(OmegaConf.structured(settings), resolve=True, enum_to_str=True)
    names = order or [f.name for f in dataclasses.fields(BenchConfig)]
    chosen = {name: container[name] for name in names if identity in PART_OF[name]}
    for dotted in LEFT_OUT:
        group, key = dotted.split(".")
        chosen.get(group, {}).pop(key, None)
    return chosen


def config_hash(settings: BenchConfig) -> str:
    """The hash of the settings that decide each point's numbers."""
    return _hash(_part(settings, ROWS))


def baseline_key(baseline_settings: BenchConfig) -> str:
    """The cache key of a cp=1 baseline, from the baseline's own settings (`cp1_settings`)."""
    return _hash(_part(baseline_settings, BASELINE))


def curve_key(settings: BenchConfig) -> str:
    """The key of a convergence curve."""
    return _hash(_part(settings, CURVE, _CURVE_ORDER))
