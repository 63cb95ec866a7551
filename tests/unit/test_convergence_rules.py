"""Convergence in-process: a curve compared to its reference, each step's own batch seed, which
checkpoint is resumed and how its bytes are counted, and bad settings named in one line."""

from __future__ import annotations

import json
import re

import pandas as pd
import pytest
from hydra import compose, initialize_config_module

from cpbench.core import ConfigError
from cpbench.measure import checkpoint
from cpbench.measure.convergence import Comparison, batch_seed, compare
from cpbench.settings.schema import register
from cpbench.settings.validate import to_settings, validate


def test_compare_names_the_first_step_outside_the_tolerance():
    reference = pd.DataFrame({"step": range(5), "loss": [5.0, 4.0, 3.0, 2.0, 1.0], "grad_norm": [1.0] * 5})
    assert compare(reference, reference, 1e-6, 0).match
    off = reference.assign(grad_norm=[1.0, 1.0, 1.0 + 1e-3, 1.5, 1.0])
    found = compare(off, reference, 1e-4, 0)
    assert (found.step, found.column, found.match) == (2, "grad_norm", False)
    assert "diverges first at step 2: grad_norm" in found.line()
    assert compare(off, reference, 0.6, 0).match  # within a looser tolerance
    assert compare(off.assign(step=off["step"] + 10), reference, 1e-4, 0) == Comparison(0, 1e-4, 0)


def test_each_step_draws_its_own_batch_seed():
    seeds = {batch_seed(seed, step) for seed in range(3) for step in range(100)}
    assert len(seeds) == 300


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["convergence.steps=0"], "convergence.steps=0: must be > 0"),
        (["checkpoint.every=-1"], "checkpoint.every=-1: must be >= 0 (0: no checkpoints)"),
        (["topology.cp=2", "shape.n_tokens=15"], "shape.n_tokens=15: does not tile the 2x1 grid"),
        (["data.path=x.npz"], "data.path=x.npz: workflow=convergence draws a batch per step"),
    ],
)
def test_bad_convergence_settings_are_named(overrides, message):
    register()
    with initialize_config_module("cpbench.configs", version_base="1.3"):
        cfg = compose("config", overrides=["workload=axial_mix", "workflow=convergence", *overrides])
    with pytest.raises(ConfigError, match=re.escape(message)):
        validate(to_settings(cfg))


def test_only_a_complete_checkpoint_of_the_same_settings_is_resumed(tmp_path):
    for step, key in ((5, "a"), (10, "a"), (15, "b"), (20, None)):  # None: cut short, no done.json
        path = tmp_path / f"step_{step:06d}"
        path.mkdir()
        if key:
            (path / checkpoint.DONE).write_text(json.dumps({"step": step, "key": key}))
    assert checkpoint.latest(tmp_path, "a") == tmp_path / "step_000010"
    assert checkpoint.latest(tmp_path, "b") == tmp_path / "step_000015"
    assert checkpoint.latest(tmp_path, "c") is None and checkpoint.latest(tmp_path / "none", "a") is None


def test_every_rank_counts_a_checkpoints_bytes_alike_while_rank_0_marks_it_done(tmp_path):
    """A slower rank counts while rank 0 writes done.json through a temporary file it renames away:
    neither is counted (counting the temporary file once failed a rank with FileNotFoundError)."""
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "__0_0.distcp").write_bytes(b"x" * 100)
    (tmp_path / "rank0.pt").write_bytes(b"y" * 10)
    before = checkpoint.checkpoint_bytes(tmp_path)
    (tmp_path / f".{checkpoint.DONE}.abc123.tmp").write_text("{}")
    during = checkpoint.checkpoint_bytes(tmp_path)
    (tmp_path / checkpoint.DONE).write_text('{"step": 5}')
    assert before == during == checkpoint.checkpoint_bytes(tmp_path) == 110
