"""The path matrix's inference cells (tests/support/path_matrix.py)."""

from __future__ import annotations

import pytest
from support.flops_expected import axial_mix_flops, counted
from support.path_matrix import (
    assert_checksums_match,
    assert_ran,
    assert_readout_against_cp1,
    run_cell,
)


@pytest.fixture(scope="module")
def cells(tmp_path_factory):
    root = tmp_path_factory.mktemp("matrix")
    return {name: run_cell(name, root) for name in ("inf_cp1", "inf_1d_base", "inf_2d_acc", "inf_1d_alone")}


@pytest.mark.parametrize("name", ["inf_cp1", "inf_1d_base", "inf_2d_acc", "inf_1d_alone"])
def test_each_inference_cell_runs_to_its_report(cells, name):
    assert_ran(cells[name])


def test_a_cp_run_with_its_default_baseline_matches_its_cp1_rows(cells):
    cell = cells["inf_1d_base"]
    assert_checksums_match(cell.measured(), cell.reference())
    assert_readout_against_cp1(cell)
    # Speed mode's adaptive counts: whatever they were, the checksum is the cp=1 one.
    points = cell.measured()[cell.measured()["kind"] == "point"]
    assert (points["warmup_steps"] >= 1).all()


def test_accuracy_at_2d_checks_every_point_against_cp1(cells):
    cell = cells["inf_2d_acc"]
    assert_checksums_match(cell.measured(), cell.reference())
    assert "mismatch" not in (cell.out / "cp_benchmark.md").read_text()


def test_a_cp_run_without_baseline_matches_a_cp1_run(cells):
    assert_checksums_match(cells["inf_1d_alone"].measured(), cells["inf_cp1"].measured())
    assert "No cp=1 baseline was run" in (cells["inf_1d_alone"].out / "cp_benchmark.md").read_text()


def test_the_probe_answers_the_same_at_every_layout_under_its_cap(cells):
    """probe.max_tokens bounds every probe: each layout's max-fit is the same N."""
    for name in ("inf_cp1", "inf_1d_base", "inf_1d_alone"):
        fits = cells[name].measured()
        assert fits[fits["kind"] == "max-fit"]["N_tokens"].tolist() == [48], name


def test_the_model_flops_of_every_point_are_the_analytic_count(cells):
    """axial_mix's counted FLOPs, summed over ranks, at cp=1, 1d cp=2 (and its baseline) and 2x2."""
    for name in ("inf_cp1", "inf_1d_base", "inf_2d_acc"):
        rows = cells[name].rows()
        rows = rows[(rows["status"] == "ok") & (rows["kind"] == "point")]  # max-fit rows: probe steps
        expected = [axial_mix_flops(r.N_tokens, r.grid) for r in rows.itertuples()]
        assert counted(rows) == expected, name
        assert rows["mfu"].gt(0).all() and rows["tflops_per_rank"].gt(0).all(), name
