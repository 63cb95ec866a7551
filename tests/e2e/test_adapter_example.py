"""The worked example of docs/adapters.md: Boltz-2's Pairformer from PyPI (examples/adapters/
boltz_pairformer.py) through `python -m cpbench` at cp=1 with its own options file, where boltz is
installed (`pip install --no-deps boltz einops scipy`: not an extra of cpbench, boltz pins numpy<2)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.processes import FAST, cpbench, ok, results

from cpbench.inputs.make_example import main as make_example

pytest.importorskip(
    "boltz.model.layers.pairformer", reason="boltz not installed (pip install --no-deps boltz einops)"
)

REPO = Path(__file__).resolve().parents[2]
BOLTZ = ["workload=adapter", "workload.module=examples.adapters.boltz_pairformer", "topology.kind=2d",
         "topology.cp=1", f"workload.options_file={REPO / 'examples' / 'adapters' / 'boltz_pairformer.yaml'}",
         *FAST]  # fmt: skip
ON_PATH = {"PYTHONPATH": str(REPO)}  # `examples.adapters` imports from the repository's root


def test_boltz_pairformer_infers_on_a_feature_file(tmp_path):
    small = tmp_path / "small.npz"
    assert make_example(["--chains", "A:protein:40,L:ligand:8", "--msa-depth", "4", "--out", str(small)]) == 0
    out = tmp_path / "out"
    ok(cpbench(*BOLTZ, f"data.path={small}", f"output_dir={out}", cwd=tmp_path, env=ON_PATH, timeout=240))
    [row] = results(out).itertuples()
    assert (row.status, row.N_tokens, row.input, row.grid) == ("ok", 48, "small", "1x1")
    assert row.walltime_ms > 0 and row.checksum == row.checksum  # a number, not blank
    changed = {c["what"]: c for c in json.loads((out / "run.json").read_text())["what_changed"]}
    blocks = changed["Pairformer blocks"]
    assert (blocks["benchmark"], blocks["real"], blocks["setting"]) == ("2", "64", "workload.options.blocks")


@pytest.fixture(scope="module")
def training(tmp_path_factory):
    """One training step's rows without and with Boltz's activation checkpointing."""
    root, rows = tmp_path_factory.mktemp("boltz"), {}
    for checkpointing in ("false", "true"):
        out = root / checkpointing
        options = f"workload.options={{blocks: 1, checkpointing: {checkpointing}}}"
        args = [*BOLTZ, "workflow=training", "sweep.n_tokens=[32]", options, f"output_dir={out}"]
        ok(cpbench(*args, cwd=root, env=ON_PATH, timeout=240))
        [rows[checkpointing]] = results(out).itertuples()
        assert json.loads((out / "run.json").read_text())["workload"]["options"]["blocks"] == 1
    return rows, (root / "true" / "cp_benchmark.md").read_text()


def test_boltz_pairformer_trains_with_its_own_optimizer(training):
    for row in training[0].values():
        assert row.status == "ok" and row.checksum > 0  # the stand-in loss, a sum of squares


def test_a_checkpointed_models_recomputation_counts_as_hardware_flops_only(training):
    """Model FLOPs are the same with checkpointing or without; hardware FLOPs add the recomputed forward
    (one block's forward: between a third and a half of the step's model FLOPs)."""
    rows, report = training
    plain, checkpointed = rows["false"], rows["true"]
    assert checkpointed.model_tflop == plain.model_tflop == plain.hardware_tflop
    assert 1.3 < checkpointed.hardware_tflop / checkpointed.model_tflop < 1.5
    assert checkpointed.hfu > checkpointed.mfu
    assert "recomputes forward ops in its backward (activation checkpointing)" in report
