"""A topology an adapter's contract cannot serve is refused in one line, in-process, before any rank
starts."""

from __future__ import annotations

import pytest
from support.processes import refused


@pytest.mark.parametrize(("kind", "cp"), [("1d", 4), ("2d", 2)])
def test_a_topology_the_contract_cannot_serve_is_refused_in_one_line(tmp_path, kind, cp):
    out = tmp_path / "out"
    args = ["workload=adapter", "workload.module=adapters.dtensor_pair", f"topology.kind={kind}"]
    proc = refused(*args, f"topology.cp={cp}", f"output_dir={out}", cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0, proc.stderr
    assert "workload.contract=foldcp needs the fold-cp driver's square 2d mesh" in proc.stderr
    assert not out.exists()
