"""Phases timed in real runs: fold_small's trunk pass and sampling step apart, and training on two ranks."""

from __future__ import annotations

import re

import pytest
from support.processes import FAST, cpbench, ok, results


def test_fold_small_times_its_trunk_pass_and_sampling_step_apart(tmp_path) -> None:
    """Two trunk passes and four sampling steps inside each timed step: each pass's time, the slowest
    rank's median, fits in the step with the rest; the report scales them to AF3's 11 and 200."""
    out = tmp_path / "out"
    ok(cpbench("workload=fold_small", "workload.n_cycles=2", *FAST, "sweep.n_tokens=[32]", "topology.cp=1",
               "measure.count_flops=false", f"output_dir={out}", cwd=tmp_path, timeout=300))  # fmt: skip
    [row] = results(out).to_dict("records")
    assert row["status"] == "ok" and (row["n_cycles"], row["sampling_steps"]) == (2, 4)
    trunk, sampling, walltime = row["trunk_ms"], row["sampling_step_ms"], row["walltime_ms"]
    assert trunk > 0 and sampling > 0
    assert 2 * trunk + 4 * sampling <= walltime
    assert row["peak_mem_min_gib"] == row["peak_mem_gib"]  # one rank
    text = (out / "cp_benchmark.md").read_text()
    number = r"([\d.]+) (ms|s)"
    found = re.search(
        rf"- cp=1, N_tokens=32: 11 trunk passes x {number} \+ 200 sampling steps x {number} \+ {number} rest "
        rf"= \*\*{number}\*\* \(the measured step ran 2 and 4 of them",
        text,
    )
    assert found, text
    shown = [float(found[i]) * (1e3 if found[i + 1] == "s" else 1) for i in range(1, 9, 2)]  # in ms
    rest = walltime - 2 * trunk - 4 * sampling
    real = (trunk, sampling, rest, 11 * trunk + 200 * sampling + rest)
    assert shown == pytest.approx(real, rel=6e-3)  # printed to 3 significant digits


def test_training_on_two_ranks_times_the_trunk_and_the_denoising_step_and_both_peaks(tmp_path) -> None:
    """The denoising step of training is its sampling step; the least peak over the ranks is beside
    the largest."""
    out = tmp_path / "out"
    ok(cpbench("workload=fold_small", *FAST, "workflow=training", "sweep.n_tokens=[32]", "topology.cp=2",
               "measure.count_flops=false", f"output_dir={out}", cwd=tmp_path, timeout=300))  # fmt: skip
    [row] = results(out).to_dict("records")
    assert row["status"] == "ok" and row["sampling_steps"] == 0
    assert row["trunk_ms"] > 0 and row["sampling_step_ms"] > 0
    assert row["trunk_ms"] + row["sampling_step_ms"] <= row["walltime_ms"]
    assert 0 < row["peak_mem_min_gib"] <= row["peak_mem_gib"]
