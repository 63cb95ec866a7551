"""A feature file (data.path) refused in-process before any rank starts: a bad file by name, and the probe
with a file."""

from __future__ import annotations

import numpy as np
from support.processes import refused
from support.run_inputs import EXAMPLE


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
