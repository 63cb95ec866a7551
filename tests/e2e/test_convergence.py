"""workflow=convergence through the real entry point: CP leaves the curve unchanged (1d cp=2 and 2d 2x2
against the cp=1 reference curve in docs/reference/), a run killed after a checkpoint resumes to the
identical curve, and mllog.txt parses with mlperf-logging's own reader."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from mlperf_logging.compliance_checker import mlp_parser
from support.processes import cpbench, ok

from cpbench.checks.reference_curve import REFERENCE_DIR
from cpbench.report import merge

STEPS = 20
CONV = ["workflow=convergence", "shape.n_tokens=16", f"convergence.steps={STEPS}", "log.progress=false"]
CHECKPOINTED = [*CONV, "topology.cp=2", "checkpoint.every=5"]
# The largest relative difference from cp=1 over these 20 steps was 1.5e-7 (loss) when written.
RTOL = 1e-5


def _reference() -> pd.DataFrame:
    (path,) = REFERENCE_DIR.glob("axial_mix_n16_*.csv")
    return pd.read_csv(path)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    out = tmp_path_factory.mktemp("uninterrupted")
    ok(cpbench(*CHECKPOINTED, f"output_dir={out}", cwd=out, timeout=420))
    return out


@pytest.fixture(scope="module")
def grid(tmp_path_factory):
    out = tmp_path_factory.mktemp("grid")
    ok(cpbench(*CONV, "topology.kind=2d", "topology.cp=4", f"output_dir={out}", cwd=out, timeout=420))
    return out


@pytest.mark.parametrize("run", ["uninterrupted", "grid"])
def test_the_curve_at_1d_cp2_and_2d_2x2_equals_cp1s(run, request):
    out = request.getfixturevalue(run)
    curve, reference = pd.read_csv(out / "convergence.csv"), _reference()
    assert list(curve["step"]) == list(range(STEPS))
    for column in ("loss", "grad_norm"):
        np.testing.assert_allclose(curve[column], reference[column][:STEPS], rtol=RTOL)
    assert curve["loss"].iloc[-1] < 0.8 * curve["loss"].iloc[0]  # it trains
    summary = json.loads((out / "run.json").read_text())["convergence"]
    # The run found the reference of its configuration by itself, and says so.
    regenerate = "a stale reference: python -m cpbench.reference_curves"
    assert summary["reference"].startswith(str(REFERENCE_DIR)), regenerate
    assert summary["match"] and summary["steps"] == STEPS and summary["step"] is None
    assert (out / "convergence.png").stat().st_size > 0


def test_checkpoint_every_0_writes_no_checkpoint(grid):
    assert not (grid / "checkpoints").exists()
    assert pd.read_csv(grid / "convergence.csv")["checkpoint_s"].isna().all()


def test_a_run_killed_after_a_checkpoint_resumes_to_the_identical_curve(uninterrupted, tmp_path):
    out = tmp_path / "killed"
    kill = ["fault.kind=kill", "fault.rank=1", "fault.at_step=12"]
    proc = ok(cpbench(*CHECKPOINTED, *kill, f"output_dir={out}", cwd=tmp_path, timeout=420))
    assert "rank 1 crashed" in proc.stderr and "relaunching, the run resumes" in proc.stderr, proc.stderr
    assert "resumed from the checkpoint after step 10" in proc.stderr
    killed, clean = pd.read_csv(out / "convergence.csv"), pd.read_csv(uninterrupted / "convergence.csv")
    pd.testing.assert_frame_equal(killed[["step", "loss", "grad_norm"]], clean[["step", "loss", "grad_norm"]])
    # Checkpoints are their own phase: timed and sized apart from the steps, after steps 5, 10, 15, 20.
    saved = killed.dropna(subset=["checkpoint_s"])
    assert list(saved["step"]) == [4, 9, 14, 19]
    assert (saved["checkpoint_s"] > 0).all() and (saved["checkpoint_bytes"] > 0).all()
    done = sorted(p.parent.name for p in (out / "checkpoints").glob("*/done.json"))
    assert done == ["step_000005", "step_000010", "step_000015", "step_000020"]


def test_mllog_parses_with_mlperf_loggings_reader(uninterrupted):
    lines, errors = mlp_parser.parse_file(str(uninterrupted / "mllog.txt"), ruleset="6.1.0")
    assert lines and not errors
    keys = [line.key for line in lines]
    for key in ("init_start", "init_stop", "run_start", "run_stop", "submission_platform",
                "submission_framework", "submission_benchmark", "context_parallelism"):  # fmt: skip
        assert keys.count(key) == 1, key
    assert keys.index("run_start") < keys.index("train_loss") < keys.index("run_stop")
    losses = [line for line in lines if line.key == "train_loss"]
    curve = pd.read_csv(uninterrupted / "convergence.csv")
    assert [line.value["value"] for line in losses] == list(curve["loss"])
    assert [line.value["metadata"]["step_num"] for line in losses] == list(range(STEPS))
    assert lines[-1].value["metadata"]["status"] == "success"


def test_a_merge_puts_the_curves_side_by_side(uninterrupted, grid, tmp_path):
    merge.merge([uninterrupted, grid], tmp_path / "merged")
    curves = pd.read_csv(tmp_path / "merged" / "convergence.csv")
    assert list(curves["run"].unique()) == [uninterrupted.name, grid.name]
    assert curves.groupby("run")["cp"].first().to_dict() == {uninterrupted.name: 2, grid.name: 4}
    report = (tmp_path / "merged" / "cp_benchmark.md").read_text()
    assert f"{grid.name}: equal over {STEPS} step(s)" in report and "no results" not in report
    assert (tmp_path / "merged" / "convergence.png").exists()
