"""The path matrix's training and convergence cells (tests/support/path_matrix.py), and items 1 and 2
of the user-paths issue on them (tests/e2e/test_user_paths.py has the others): a convergence run whose
baseline writes no result rows compares its curve with the baseline's; training checksums do not depend
on the warm-up count (train_1d_acc again with 3 warm-up steps) and equal the cp=1 baseline's."""

from __future__ import annotations

import math

import pandas as pd
import pytest
from omegaconf import OmegaConf
from support.flops_expected import axial_mix_flops, counted
from support.path_matrix import (
    CELLS,
    Cell,
    assert_checksums_match,
    assert_ran,
    assert_readout_against_cp1,
    run_cell,
)
from support.processes import cpbench, ok

NAMES = ("train_cp1_acc", "train_2d_base", "train_1d_acc", "conv_2d_base", "conv_1d_alone")
STEPS = {"conv_2d_base": 4, "conv_1d_alone": 3}
WARMUP3 = ["timing.warmup=3", "timing.warmup_max=3"]  # later overrides win over the cell's TIMING


@pytest.fixture(scope="module")
def cells(tmp_path_factory):
    root = tmp_path_factory.mktemp("matrix")
    return {name: run_cell(name, root) for name in NAMES}


@pytest.fixture(scope="module")
def warmup3(tmp_path_factory) -> Cell:
    """train_1d_acc's run (training at 1d cp=2 with its cp=1 baseline, 1 warm-up step) with 3."""
    root = tmp_path_factory.mktemp("warmup3")
    out = root / "out"
    proc = ok(cpbench(*CELLS["train_1d_acc"], *WARMUP3, f"output_dir={out}", cwd=root, timeout=300))
    return Cell("train_1d_acc_warmup3", proc, out)


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
    assert summary["match"] and summary["steps"] == STEPS[name], summary
    curve = pd.read_csv(cell.out / "convergence.csv")
    assert curve["step"].tolist() == list(range(STEPS[name]))


def test_convergence_with_its_baseline_is_compared_with_the_baseline_curve(cells):
    """User-paths item 1: a convergence run at cp>1 with its default baseline, at an N with no published
    curve: the baseline's curve has no result rows; the run ends 0 with its curve compared with the
    baseline's."""
    cell = cells["conv_2d_base"]
    assert_ran(cell)
    [baseline] = (cell.out / "baseline").iterdir()
    assert len(pd.read_csv(baseline / "convergence.csv")) == 4
    summary = OmegaConf.to_container(OmegaConf.load(cell.out / "run.json"))["convergence"]
    assert summary["reference"] == str(baseline / "convergence.csv")
    assert summary["match"] and summary["steps"] == 4
    assert (cell.out / "convergence.png").exists() and not (cell.out / "results.csv").exists()


def test_training_checksums_do_not_depend_on_the_warm_up_count(cells, warmup3):
    """User-paths item 2: each training point starts from the seed's weights and its checksum is its
    first step's: 1 or 3 warm-up steps, the same checksums (its baseline's too)."""
    one, three = cells["train_1d_acc"].rows(), warmup3.rows()
    for frame, warmup in ((one, 1), (three, 3)):
        assert (frame[frame["source"] != "baseline"]["warmup_steps"] == warmup).all()
    key = ["source", "N_tokens"]
    one, three = (f.sort_values(key) for f in (one, three))
    assert one["checksum"].tolist() == pytest.approx(three["checksum"].tolist(), rel=1e-9)


def test_training_checksums_at_cp2_equal_their_cp1_baseline_with_3_warm_up_steps(warmup3):
    """User-paths item 2: a correct CP layout gives the cp=1 checksum within float tolerance, in one
    folder (1 warm-up step: test_training_accuracy_with_its_baseline_checks_loss_and_grad_norm)."""
    frame = warmup3.rows()
    mine = frame[frame["source"] != "baseline"].set_index("N_tokens")
    base = frame[frame["source"] == "baseline"].set_index("N_tokens")
    assert sorted(mine.index) == sorted(base.index) == [16, 32]
    for n in (16, 32):
        assert math.isclose(mine.loc[n, "checksum"], base.loc[n, "checksum"], rel_tol=1e-5)
        assert mine.loc[n, "loss"] == mine.loc[n, "checksum"]


def test_a_training_step_counts_forward_and_backward(cells):
    """Each linear's backward is two products the size of its forward: 3x the forward's FLOPs, at 2x2
    and in its cp=1 baseline."""
    rows = cells["train_2d_base"].rows()
    rows = rows[(rows["status"] == "ok") & (rows["kind"] == "point")]  # max-fit rows: probe steps
    assert set(rows["cp"]) == {1, 4}
    assert counted(rows) == [3 * axial_mix_flops(r.N_tokens, r.grid) for r in rows.itertuples()]
