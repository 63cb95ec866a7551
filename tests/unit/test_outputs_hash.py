"""A hash that looks like a number survives appends to results.csv."""

from __future__ import annotations

from cpbench.results.folder import RunFolder
from cpbench.results.store import append_row, read_results


def test_a_hash_that_looks_like_a_number_survives_appends(tmp_path):
    """6168e7108345 reads as a float (inf) unless the store keeps labels as text; then every
    rewrite corrupted it and a resumed run measured its points again (seen in a CI run)."""
    path = tmp_path / "results.csv"
    row = {"kind": "point", "N_tokens": 16, "N_atoms": 144, "MSA_depth": 16, "status": "ok"}
    append_row(path, {**row, "config_hash": "6168e7108345"})
    append_row(path, {**row, "N_tokens": 32, "config_hash": "0012345678"})
    frame = read_results(path)
    assert list(frame["config_hash"]) == ["6168e7108345", "0012345678"]
    assert RunFolder(tmp_path).done_keys("6168e7108345") == {"point:16:144:16"}
