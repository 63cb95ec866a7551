"""An adapter's options checked in-process: a target with its group named keeps the group's keys, and
what cannot reach the model is refused in one line before any rank starts."""

from __future__ import annotations

import pytest
from support.processes import refused
from support.run_inputs import EXAMPLE, TOLD

from cpbench.settings.workload_config import workload_settings


def test_a_target_with_its_group_named_keeps_the_groups_keys():
    composed = {"_target_": "pkg.Sub", "c_s": 64, "sampling": {"steps": 2, "noise": 1.0}}
    alone, label = workload_settings(composed, ["workload._target_=pkg.Sub", "workload.sampling.steps=2"])
    assert (alone, label) == ({"_target_": "pkg.Sub", "sampling": {"steps": 2}}, "Sub")
    both, label = workload_settings(composed, ["workload=fold", "workload._target_=pkg.Sub"])
    assert (both, label) == (composed, None)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([f"data.path={EXAMPLE}"], "workload axial_mix cannot take a feature file"),
        (["workload=adapter", "workload.module=adapters.fold_cp_style", f"data.path={EXAMPLE}"],
         "add `*, features` to its build_batch signature"),
        (["workload=adapter", "workload.module=adapters.fold_cp_style", "workload.options={width: 8}"],
         "workload.options: no hook of adapters.fold_cp_style takes an `options` keyword"),
        ([*TOLD, "workload.options_file=nope.yaml"], "workload.options_file=nope.yaml: cannot be read"),
    ],
    ids=["axial-mix-data", "module-data", "module-options", "options-file"],
)  # fmt: skip
def test_what_cannot_reach_the_model_is_refused_in_one_line(tmp_path, args, message):
    out = tmp_path / "out"
    proc = refused(*args, "topology.kind=2d", "topology.cp=1", "probe.enabled=false", f"output_dir={out}",
                   cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0, proc.stderr
    assert message in proc.stderr and not out.exists()
