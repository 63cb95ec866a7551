"""cpbench across its torch range (pyproject: torch 2.6 up). Every module imports under whatever torch
runs the suite (tests/unit/test_every_module_imports.py); the real runs below are CI's second lane
(.ci/floor runs `pytest -m "unit or floor"` at torch 2.6): they go through `python -m cpbench` and
`python -m cpbench.predict` on the paths that touch what differs across versions (gather/scatter
collectives, the 2d grid's ring, fake tensors, DCP-free convergence), and the main lane leaves them out
(tests/conftest.py), its own tests covering them."""

from __future__ import annotations

import sys

import pytest
from support.processes import TIMING, cpbench, ok, results, run_cmd

FOLD_2D = [
    "workload=fold_small",
    "topology.kind=2d",
    "topology.cp=4",
    "sweep.n_tokens=[32]",
    "probe.enabled=false",
]


@pytest.mark.floor
def test_a_cp2_run_with_its_cp1_baseline(tmp_path):
    ok(cpbench("topology.cp=2", "baseline=true", "sweep.n_tokens=[32]", "probe.enabled=false", *TIMING,
               f"output_dir={tmp_path}", cwd=tmp_path, fresh=True))  # fmt: skip
    rows = results(tmp_path).set_index("cp")
    assert sorted(rows.index) == [1, 2] and set(rows["status"]) == {"ok"}  # the report holds both
    assert rows.loc[2, "checksum"] == pytest.approx(rows.loc[1, "checksum"], rel=1e-5)


@pytest.mark.floor
@pytest.mark.parametrize("workflow", ["inference", "training"])
def test_fold_small_on_a_2x2_grid(tmp_path, workflow):
    ok(
        cpbench(
            *FOLD_2D, f"workflow={workflow}", *TIMING, f"output_dir={tmp_path}", cwd=tmp_path, timeout=240
        )
    )
    rows = results(tmp_path)
    assert list(rows["status"]) == ["ok"] and rows["grid"].iloc[0] == "2x2"


@pytest.mark.floor
def test_the_probe_led_by_the_prediction(tmp_path):
    args = [
        "topology.cp=2",
        "sweep.n_tokens=[]",
        "probe.enabled=true",
        "probe.predict=true",
        "probe.start=64",
        "probe.granularity=64",
        "probe.max_tokens=256",
        "memory.budget_gib=0.1",
    ]
    ok(cpbench(*args, *TIMING, f"output_dir={tmp_path}", cwd=tmp_path, timeout=240, fresh=True))
    trials = results(tmp_path)
    assert (trials["kind"] == "max-fit").any()
    assert (tmp_path / "prediction.json").exists()


@pytest.mark.floor
def test_predict_estimates_the_largest_n(tmp_path):
    args = ["workload=fold_small", "topology.kind=2d", "topology.cp=4", "memory.budget_gib=0.5",
            "probe.start=128", f"output_dir={tmp_path}"]  # fmt: skip
    proc = ok(run_cmd([sys.executable, "-m", "cpbench.predict", *args], tmp_path, timeout=240))
    assert "predicted max N_tokens:" in proc.stdout


@pytest.mark.floor
def test_a_convergence_run_at_cp2(tmp_path):
    proc = ok(cpbench("workflow=convergence", "topology.cp=2", "baseline=true", "shape.n_tokens=32",
                      "convergence.steps=4", f"output_dir={tmp_path}", cwd=tmp_path, fresh=True))  # fmt: skip
    assert "equal over 4 step(s)" in proc.stdout + proc.stderr
