"""The what-changed table (cpbench.preview.changes): every way a benchmark differs from the real job it
stands for, from the workload's declared production settings or the user's `job=path.yaml`."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf
from support.settings import settings

from cpbench.core import ConfigError
from cpbench.preview.changes import load_job, what_changed
from cpbench.record.run_record import Change, RunRecord
from cpbench.report.markdown import render
from cpbench.report.sections.what_changed import what_changed_lines
from cpbench.workloads.adapter import FoldCPAdapter
from cpbench.workloads.fold import FoldWorkload


def _rows(*overrides: str, job: dict | None = None) -> dict[str, dict]:
    s = settings(*overrides)
    config = OmegaConf.to_container(OmegaConf.structured(s), resolve=True, enum_to_str=True)
    return {r.what: r.as_dict() for r in what_changed(config, FoldWorkload.real_job, job)}


def test_fold_small_lists_sampling_steps_and_cycles_against_af3():
    rows = _rows("workload=fold_small")
    steps, cycles = rows["diffusion sampling steps"], rows["trunk passes (recycling)"]
    assert (steps["benchmark"], steps["real"], steps["setting"], steps["scale"]) == (
        "4",
        "200",
        "workload.sampling.steps",
        50,
    )
    assert (cycles["benchmark"], cycles["real"], cycles["setting"], cycles["scale"]) == (
        "1",
        "11",
        "workload.n_cycles",
        11,
    )
    assert "c_z=32" in rows["model sizes"]["benchmark"] and "c_z=128" in rows["model sizes"]["real"]
    samples = rows["diffusion samples per trunk pass"]  # a setting now, no limitation (issue 54)
    assert not samples["limitation"] and samples["setting"] == "workload.diffusion_samples.inference"
    assert (samples["benchmark"], samples["real"]) == ("2", "5")
    assert rows["inputs"]["setting"] == "data.path"
    assert rows["steps measured"]["benchmark"].startswith("3 warm-up + 5 timed")


def test_fold_at_af3_sizes_lists_only_what_still_differs():
    rows = _rows("workload=fold")
    assert "model sizes" not in rows and "diffusion sampling steps" not in rows
    assert "diffusion samples per trunk pass" not in rows  # AF3's 5
    assert "diffusion batch per trunk pass" not in _rows("workload=fold", "workflow=training")  # AF3's 48
    assert rows["trunk passes (recycling)"]["benchmark"] == "4"


def test_training_drops_the_inference_only_settings():
    rows = _rows("workload=fold_small", "workflow=training")
    assert "diffusion sampling steps" not in rows and "diffusion samples per trunk pass" not in rows
    batch = rows["diffusion batch per trunk pass"]
    assert (batch["benchmark"], batch["real"], batch["setting"]) == (
        "1",
        "48",
        "workload.diffusion_samples.training",
    )
    assert "model sizes" in rows


def test_a_job_file_sets_the_real_job_and_wins_over_the_workload(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text(
        "topology: {cp: 8}\ndtype: bfloat16\nshape: {n_tokens: 2048}\nworkload:\n  sampling: {steps: 100}\n"
    )
    rows = _rows("workload=fold_small", job=load_job(str(path)))
    assert (rows["topology.cp"]["benchmark"], rows["topology.cp"]["real"]) == ("2", "8")
    assert rows["dtype"]["real"] == "bfloat16" and rows["N_tokens"]["real"] == "2048"
    assert (
        rows["diffusion sampling steps"]["real"] == "100" and rows["diffusion sampling steps"]["scale"] == 25
    )
    path.write_text("topology: {cps: 8}\n")
    with pytest.raises(ConfigError, match="job: topology.cps is not a cpbench setting"):
        _rows(job=load_job(str(path)))
    path.write_text("- a list\n")
    with pytest.raises(ConfigError, match="must be a YAML mapping"):
        load_job(str(path))


def test_an_adapter_without_real_job_is_one_limitation():
    adapter = FoldCPAdapter("adapters.fold_cp_style")
    [row] = adapter.real_job
    assert row.real == "not declared"


def test_the_report_estimates_the_real_jobs_step_from_the_measured_one():
    import pandas as pd

    changes = tuple(Change(**r) for r in _rows("workload=fold_small").values())
    row = dict(kind="point", status="ok", N_tokens=64, N_atoms=576, MSA_depth=16, walltime_ms=100.0,
               walltime_iqr_ms=1.0, comm_ms=10.0, config_hash="x", workload="fold", workflow="inference",
               dtype="float32", topology="1d", cp=2, grid="2x1")  # fmt: skip
    frame = pd.DataFrame([row])
    text = render(frame, RunRecord(what_changed=changes))
    assert "\n".join(what_changed_lines(changes)) in text
    # Rows without phases timed apart (tests/unit/test_phases.py has them): no estimate, said plainly.
    assert "- cp=2, N_tokens=64: trunk passes were not timed apart (trunk_ms blank)" in text
    assert "the real job's step is not estimated; the measured step is 100 ms" in text


def test_pairformer_small_lists_its_sizes_against_af3s():
    from cpbench.workloads.pairformer import PairformerWorkload

    s = settings("workload=pairformer_small")
    config = OmegaConf.to_container(OmegaConf.structured(s), resolve=True, enum_to_str=True)
    rows = {r.what: r for r in what_changed(config, PairformerWorkload.real_job)}
    assert rows["model sizes"].setting == "workload=pairformer (AF3's sizes)"
    assert "n_blocks=2" in rows["model sizes"].benchmark and "n_blocks=48" in rows["model sizes"].real
