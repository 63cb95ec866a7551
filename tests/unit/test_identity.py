"""One settings identity (cpbench/settings/identity.py): every setting is assigned, and the keys
a run records by move with exactly the settings assigned to them."""

from __future__ import annotations

import dataclasses
import functools

import pytest
from support.settings import composed

from cpbench.settings import identity
from cpbench.settings.schema import BenchConfig


def test_every_setting_is_assigned_to_its_identities():
    """A new BenchConfig field fails here until it is assigned (to some identities or to none)."""
    fields = [f.name for f in dataclasses.fields(BenchConfig)]
    assert sorted(identity.PART_OF) == sorted(fields)
    curve = [name for name in fields if identity.CURVE in identity.PART_OF[name]]
    assert sorted(identity._CURVE_ORDER) == sorted(curve)  # the published keys' order names them all
    known = {identity.ROWS, identity.BASELINE, identity.CURVE}
    assert all(set(parts) <= known for parts in identity.PART_OF.values())


# One override per top-level setting group, each a change that is no default.
CHANGES = {
    "workload": "workload=axial_mix", "workflow": "workflow=training", "mode": "mode=accuracy",
    "repeat_check": "repeat_check=2", "dtype": "dtype=bfloat16", "matmul_precision": "matmul_precision=high",
    "topology": "topology.cp=4", "shape": "shape.msa_depth=8", "sweep": "sweep.n_tokens=[32]",
    "data": "data.path=x.npz", "probe": "probe.start=32", "timing": "timing.repeats=7",
    "budget": "budget.minutes=3", "accuracy": "accuracy.rtol=0.1", "measure": "measure.profile_comm=true",
    "memory": "memory.budget_gib=2", "dist": "dist.timeout_s=77", "launch": "launch.max_restarts=1",
    "fault": "fault.kind=kill", "slurm": "slurm.partition=x", "optim": "optim.lr=0.5",
    "convergence": "convergence.steps=3", "checkpoint": "checkpoint.every=5", "log": "log.all_ranks=true",
    "seed": "seed=3", "baseline": "baseline=false", "job": "job=job.yaml", "output_dir": "output_dir=else",
}  # fmt: skip


@functools.cache
def _base():
    """The defaults' settings, composed once for the module (the keys below only read them)."""
    return composed()


@pytest.mark.parametrize("name", sorted(CHANGES))
def test_a_key_moves_with_its_settings_and_with_nothing_else(name):
    base, changed = _base(), composed(CHANGES[name])
    parts = identity.PART_OF[name]
    assert (identity.config_hash(changed) != identity.config_hash(base)) == (identity.ROWS in parts)
    assert (identity.curve_key(changed) != identity.curve_key(base)) == (identity.CURVE in parts)
    if name not in ("topology", "fault", "repeat_check"):  # the baseline's own: cp=1, no fault, no repeats
        moved = identity.baseline_key(changed) != identity.baseline_key(base)
        assert moved == (identity.BASELINE in parts)


def test_the_published_curves_keep_their_keys():
    """docs/reference/ is named by curve_key: the axial_mix N=32 reference is still found."""
    from cpbench.checks.reference_curve import find

    assert find(identity.curve_key(composed("workload=axial_mix", "shape.n_tokens=32"))) is not None
