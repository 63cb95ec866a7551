"""The path matrix's training and convergence cells (tests/path_matrix.py)."""

from __future__ import annotations

import pandas as pd
import pytest
from flops_expected import axial_mix_flops, counted
from omegaconf import OmegaConf
from path_matrix import (
    assert_checksums_match,
    assert_ran,
    assert_readout_against_cp1,
    run_cell,
)

NAMES = ("train_cp1_acc", "train_2d_base", "train_1d_acc", "conv_2d_base", "conv_1d_alone")


@pytest.fixture(scope="module")
def cells(tmp_path_factory):
    root = tmp_path_factory.mktemp("matrix")
    return {name: run_cell(name, root) for name in NAMES}


@pytest.mark.parametrize("name", NAMES)
def test_each_training_cell_runs_to_its_report(cells, name):
    assert_ran(cells[name])


def test_training_in_speed_mode_with_its_baseline_matches_cp1(cells):
    """Adaptive warm-up and repeats on both sides: the checksums are still the cp=1 ones."""
    cell = cells["train_2d_base"]
    assert_checksums_match(cell.measured(), cell.reference())
    assert_readout_against_cp1(cell)


def test_training_accuracy_with_its_baseline_checks_loss_and_grad_norm(cells):
    cell = cells["train_1d_acc"]
    assert_checksums_match(cell.measured(), cell.reference())
    mine = cell.measured().set_index("N_tokens")
    assert mine["grad_norm"].notna().all() and (mine["loss"] == mine["checksum"]).all()


def test_accuracy_at_cp1_is_bit_exact_against_its_reference(cells):
    cell = cells["train_cp1_acc"]
    assert_checksums_match(cell.measured(), cell.reference(), exact=True)


@pytest.mark.parametrize("name", ["conv_2d_base", "conv_1d_alone"])
def test_convergence_curves_match_cp1(cells, name):
    cell = cells[name]
    summary = OmegaConf.to_container(OmegaConf.load(cell.out / "run.json"))["convergence"]
    assert summary["match"] and summary["steps"] == 3, summary
    curve = pd.read_csv(cell.out / "convergence.csv")
    assert curve["step"].tolist() == [0, 1, 2]


def test_convergence_with_its_baseline_is_compared_with_the_baseline_curve(cells):
    cell = cells["conv_2d_base"]
    [baseline] = (cell.out / "baseline").iterdir()
    summary = OmegaConf.to_container(OmegaConf.load(cell.out / "run.json"))["convergence"]
    assert summary["reference"] == str(baseline / "convergence.csv")


def test_a_training_step_counts_forward_and_backward(cells):
    """Each linear's backward is two products the size of its forward: 3x the forward's FLOPs, at 2x2
    and in its cp=1 baseline."""
    rows = cells["train_2d_base"].rows()
    rows = rows[(rows["status"] == "ok") & (rows["kind"] == "point")]  # max-fit rows: probe steps
    assert set(rows["cp"]) == {1, 4}
    assert counted(rows) == [3 * axial_mix_flops(r.N_tokens, r.grid) for r in rows.itertuples()]
