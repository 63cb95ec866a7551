"""A sweep over diffusion samples records each count and reports each apart."""

from __future__ import annotations

import pytest
from support.processes import FAST, cpbench, ok, results
from support.tiny_fold import SIZES

from cpbench.report.analysis import like_for_like


def test_a_sweep_over_samples_records_each_count_and_reports_each_apart(tmp_path):
    """cp=2 with its default cp=1 baseline: every row names its count, the two counts are two points
    (and two like-for-like groups), the same at both CP sizes, and a rerun resumes both. Two counts
    other than the workload's own 3, the smallest; no FLOP count (not checked here)."""
    out = tmp_path / "out"
    args = ["workload=fold_small", *SIZES, *FAST, "baseline=true", "sweep.n_tokens=[16]",
            "sweep.diffusion_samples=[1,2]", "measure.count_flops=false", f"output_dir={out}"]  # fmt: skip
    ok(cpbench(*args, cwd=tmp_path, timeout=300))
    frame = results(out)
    points = frame[frame["kind"] == "point"]
    assert len(points) == 4 and set(points["status"]) == {"ok"}, frame.to_dict("records")
    for cp in (1, 2):
        mine = points[points["cp"] == cp].set_index("diffusion_samples")
        assert sorted(mine.index) == [1, 2]
        assert mine.loc[1, "checksum"] != mine.loc[2, "checksum"]
    # The same structures at cp=1 and cp=2.
    by_cp = points.set_index(["diffusion_samples", "cp"])["checksum"]
    for samples in (1, 2):
        assert by_cp[(samples, 2)] == pytest.approx(by_cp[(samples, 1)], rel=1e-5)
    assert sorted(int(g["diffusion_samples"].iloc[0]) for _, g in like_for_like(points)) == [1, 2]
    report = (out / "cp_benchmark.md").read_text()
    assert "float32, 1 diffusion sample(s), cap" in report and "float32, 2 diffusion sample(s), cap" in report
    again = ok(cpbench(*args, cwd=tmp_path, timeout=300))
    assert len(results(out)) == len(frame), again.stderr
