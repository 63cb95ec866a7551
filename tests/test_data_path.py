"""A user's feature file through the real entry point: its shape is the run's one point."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from conftest import FAST, cpbench, ok, refused, results

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "complex_304.npz"
READS_INPUTS = ["workload=adapter", "workload.module=adapters.told", "workload.contract=native",
                "workload.options={width: 8, report_dir: .}"]  # fmt: skip


def test_feature_file_sets_the_point_and_is_recorded(tmp_path):
    """A workload that reads the file (axial_mix cannot, and is refused: tests/test_adapter_options.py)."""
    out = tmp_path / "out"
    ok(
        cpbench(
            "topology.cp=2",
            *READS_INPUTS,
            f"data.path={EXAMPLE}",
            "probe.enabled=false",
            *FAST,
            f"output_dir={out}",
            cwd=tmp_path,
        )
    )
    row = results(out).iloc[0]
    assert (row["N_tokens"], row["N_atoms"], row["MSA_depth"], row["status"]) == (304, 2736, 32, "ok")


def test_bad_feature_file_is_rejected_by_name(tmp_path):
    arrays = dict(np.load(EXAMPLE))
    del arrays["asym_id"]
    bad = tmp_path / "bad.npz"
    np.savez(bad, **arrays)
    out = tmp_path / "out"
    proc = refused(f"data.path={bad}", "probe.enabled=false", f"output_dir={out}", cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.startswith(f"cpbench: error: data.path={bad}") and "asym_id" in proc.stderr
    assert not out.exists()


def test_probe_with_a_feature_file_is_refused(tmp_path):
    proc = refused(f"data.path={EXAMPLE}", "probe.enabled=true", f"output_dir={tmp_path / 'o'}", cwd=tmp_path)
    assert proc.returncode == 2 and "probe.enabled=true: a feature file" in proc.stderr
