"""The user paths refused in-process: settings convergence never reads, no sweep points and no probe; and
the training table names AF3 training."""

from __future__ import annotations

import pytest
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf
from support.processes import one_line_exit_2, refused

from cpbench.preview.changes import what_changed
from cpbench.settings.schema import register


@pytest.mark.parametrize(
    "override, setting",
    [("sweep.n_tokens=[32]", "sweep.n_tokens=[32]"), ("probe.start=64", "probe.start=64")],
)
def test_settings_convergence_never_reads_are_refused(tmp_path, override, setting):
    """Item 5: sweep.* (and probe.*) with workflow=convergence is refused, not ignored in silence."""
    line = one_line_exit_2(refused("workflow=convergence", override, cwd=tmp_path))
    assert line.startswith(f"cpbench: error: {setting}: workflow=convergence runs its steps at shape.*")


def test_no_sweep_points_and_no_probe_is_one_line(tmp_path):
    """Item 6: sweep.n_tokens=[] without the probe would measure nothing."""
    line = one_line_exit_2(refused("sweep.n_tokens=[]", "probe.enabled=false", cwd=tmp_path))
    assert "sweep.n_tokens=[]: give at least one value" in line and "probe.enabled=true" in line


def fold_training_changes(*overrides: str) -> dict[str, dict]:
    register()
    with initialize_config_module("cpbench.configs", version_base="1.3"):
        cfg = compose("config", ["workload=fold", "workflow=training", *overrides])
    from hydra.utils import instantiate

    settings = OmegaConf.to_object(cfg)
    workload = instantiate(settings.workload)
    config = OmegaConf.to_container(OmegaConf.structured(settings), resolve=True, enum_to_str=True)
    return {c.what: c.as_dict() for c in what_changed(config, workload.real_job)}


def test_the_training_table_names_af3_training():
    """Item 8: AF3 training's recycling, diffusion batch, crops and losses, each with its setting or
    as a limitation; the inference-only rows are not there."""
    rows = fold_training_changes()
    assert rows["trunk passes (recycling)"]["setting"] == "workload.n_cycles"
    assert rows["trunk passes (recycling)"]["real"] == "1 to 4, sampled per step"
    assert rows["crop size (N_tokens)"]["setting"] == "sweep.n_tokens"
    assert rows["crop size (N_tokens)"]["real"] == "[384, 640, 768]"
    # A setting since issue 54, no limitation: workload=fold denoises AF3's 48 copies, so no row.
    assert "diffusion batch per trunk pass" not in rows
    batch = fold_training_changes("workload.diffusion_samples.training=4")["diffusion batch per trunk pass"]
    assert (batch["benchmark"], batch["real"], batch["setting"]) == (
        "4",
        "48",
        "workload.diffusion_samples.training",
    )
    assert rows["loss terms"]["limitation"] and "distogram" in rows["loss terms"]["real"]
    assert "diffusion sampling steps" not in rows and "diffusion samples per trunk" not in rows
