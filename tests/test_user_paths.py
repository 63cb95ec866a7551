"""The paths a user takes together, through `python -m cpbench`: each item of the user-paths issue
that once ended in a traceback or a wrong answer, and the path matrix that crosses workflow, layout,
baseline, mode and probe (tests/test_path_matrix.py)."""

from __future__ import annotations

import math

import pandas as pd
import pytest
from conftest import TIMING, cpbench, ok, refused, results
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

from cpbench.preview.changes import what_changed
from cpbench.settings.schema import register

TRAIN = ["workflow=training", "sweep.n_tokens=[16,32]", "probe.enabled=false", "log.progress=false"]


def one_line_exit_2(proc) -> str:
    """The run ended with its one line and exit 2, no traceback."""
    assert proc.returncode == 2, f"exit {proc.returncode}\n{proc.stderr}"
    assert "Traceback" not in proc.stderr and "Error executing job" not in proc.stderr, proc.stderr
    return [line for line in proc.stderr.splitlines() if line.startswith("cpbench: error:")][-1]


def test_a_cp_run_whose_baseline_writes_no_rows_compares_its_curve(tmp_path):
    """Item 1: a convergence run at cp=2 with its default baseline (docs/convergence.md's example, at
    an N with no published curve): the baseline's curve has no result rows; the run ends 0 with its
    curve compared with the baseline's."""
    out = tmp_path / "out"
    args = ["workflow=convergence", "topology.cp=2", "shape.n_tokens=24", "checkpoint.every=2",
            "convergence.steps=4", "baseline=true", "log.progress=false", f"output_dir={out}"]  # fmt: skip
    ok(cpbench(*args, cwd=tmp_path, timeout=240))
    [baseline] = (out / "baseline").iterdir()
    assert len(pd.read_csv(baseline / "convergence.csv")) == 4
    summary = OmegaConf.to_container(OmegaConf.load(out / "run.json"))["convergence"]
    assert summary["reference"] == str(baseline / "convergence.csv")
    assert summary["match"] and summary["steps"] == 4
    assert (out / "convergence.png").exists() and not (out / "results.csv").exists()


def test_a_refused_baseline_refuses_the_run_in_one_line(tmp_path):
    """Item 1: the time budget refuses the cp=1 baseline's plan: the CP run is refused with its line.
    0.6 ms: below any one measurement (at 0.001 min an idle machine's trimmed cp=1 plan fit)."""
    out = tmp_path / "out"
    args = ["baseline=true", "budget.minutes=0.00001", "sweep.n_tokens=[16,32]", "probe.enabled=false",
            "log.progress=false", f"output_dir={out}"]  # fmt: skip
    proc = cpbench(*args, cwd=tmp_path, timeout=240)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "cpbench: the cp=1 baseline: budget.minutes=1e-05" in proc.stderr
    assert not (out / "logs" / "ranks").exists()  # the CP ranks never started


@pytest.fixture(scope="module")
def training_runs(tmp_path_factory) -> dict[int, pd.DataFrame]:
    """A training run at cp=2 with its cp=1 baseline, with 1 and with 3 warm-up steps."""
    frames = {}
    for warmup in (1, 3):
        out = tmp_path_factory.mktemp(f"warmup{warmup}") / "out"
        timing = [f"timing.warmup={warmup}", f"timing.warmup_max={warmup}", "timing.repeats=2",
                  "timing.repeats_max=2"]  # fmt: skip
        args = [*TRAIN, *timing, "topology.cp=2", "baseline=true", f"output_dir={out}"]
        ok(cpbench(*args, cwd=out.parent, timeout=240))
        frames[warmup] = results(out)
    return frames


def test_training_checksums_do_not_depend_on_the_warm_up_count(training_runs):
    """Item 2: each training point starts from the seed's weights and its checksum is its first step's."""
    one, three = (training_runs[w] for w in (1, 3))
    for frame, warmup in ((one, 1), (three, 3)):
        assert (frame[frame["source"] != "baseline"]["warmup_steps"] == warmup).all()
    key = ["source", "N_tokens"]
    one, three = (
        f.assign(source=f["source"].astype(object).fillna("")).sort_values(key) for f in (one, three)
    )
    assert one["checksum"].tolist() == pytest.approx(three["checksum"].tolist(), rel=1e-9)


@pytest.mark.parametrize("warmup", [1, 3])
def test_training_checksums_at_cp2_equal_their_cp1_baseline(training_runs, warmup):
    """Item 2: a correct CP layout gives the cp=1 checksum within float tolerance, in one folder."""
    frame = training_runs[warmup]
    mine = frame[frame["source"] != "baseline"].set_index("N_tokens")
    base = frame[frame["source"] == "baseline"].set_index("N_tokens")
    assert sorted(mine.index) == sorted(base.index) == [16, 32]
    for n in (16, 32):
        assert math.isclose(mine.loc[n, "checksum"], base.loc[n, "checksum"], rel_tol=1e-5)
        assert mine.loc[n, "loss"] == mine.loc[n, "checksum"]


def test_a_tight_cap_leaves_the_report_whole(tmp_path):
    """Item 3: the cap is for the measured steps. A cap the steps fit in but the report's plot would
    not (cp=1: the launching process measures, then renders) still gives the report and its plot."""
    out = tmp_path / "out"
    args = ["topology.cp=1", "memory.cpu_budget_gib=0.03", "sweep.n_tokens=[16]", "probe.enabled=false",
            *TIMING, f"output_dir={out}"]  # fmt: skip
    ok(cpbench(*args, cwd=tmp_path, timeout=180))
    assert results(out)["status"].tolist() == ["ok"]
    assert (out / "cp_benchmark.md").exists() and (out / "cp_benchmark_walltime.png").exists()


def test_convergence_out_of_memory_is_one_line(tmp_path):
    """Item 5: a convergence step that does not fit names the N, the cap and what to change."""
    out = tmp_path / "out"
    args = ["workflow=convergence", "topology.cp=2", "shape.n_tokens=512", "memory.cpu_budget_gib=0.2",
            "convergence.steps=2", "log.progress=false", f"output_dir={out}"]  # fmt: skip
    line = one_line_exit_2(cpbench(*args, cwd=tmp_path, timeout=240))
    assert "workflow=convergence: N_tokens=512 does not fit in 0.2 GiB per rank" in line
    assert "lower shape.n_tokens" in line
    assert OmegaConf.load(out / "failure.json")["exit_code"] == 2


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


def test_no_sweep_points_is_the_probe_alone_with_its_baseline(tmp_path):
    """Item 6: sweep.n_tokens=[] with the probe (and the default baseline) is the probe alone."""
    out = tmp_path / "out"
    args = ["sweep.n_tokens=[]", "baseline=true", "probe.start=16", "probe.max_tokens=32",
            "probe.granularity=16", *TIMING, f"output_dir={out}"]  # fmt: skip
    ok(cpbench(*args, cwd=tmp_path, timeout=240))
    frame = results(out)
    fits = frame[frame["kind"] == "max-fit"]
    assert sorted(fits["source"].fillna("").tolist()) == ["", "baseline"]


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
