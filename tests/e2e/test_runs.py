"""Real multi-rank runs on CPU (gloo) through `python -m cpbench` and `torchrun -m cpbench`."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from support.processes import FAST, cpbench, ok, results, torchrun

POINTS = "sweep.n_tokens=[16,32]"
# Without the FLOP count, which these tests do not check (axial_mix's counts at every layout: the path
# matrix's cells, tests/e2e/test_path_matrix_inference.py).
FAST = [*FAST, "measure.count_flops=false"]


TOPOLOGIES = {
    "1d-cp1": ["topology.cp=1"],
    "1d-cp2": ["topology.cp=2"],
    "1d-cp4": ["topology.cp=4"],
    "2d-2x2": ["topology.kind=2d", "topology.cp=4"],
    "2d-1x2": ["topology.kind=2d", "topology.cp=2", "topology.grid=[1,2]"],
}
CP = {"1d-cp1": 1, "1d-cp2": 2, "1d-cp4": 4, "2d-2x2": 4, "2d-1x2": 2}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """One run per topology, shared by the tests below."""
    outs = {}
    for name, topology in TOPOLOGIES.items():
        cwd = tmp_path_factory.mktemp(name)
        ok(cpbench(*topology, POINTS, *FAST, f"output_dir={cwd / 'out'}", cwd=cwd))
        outs[name] = cwd / "out"
    return outs


@pytest.mark.parametrize("name", TOPOLOGIES)
def test_python_m_cpbench_runs_every_topology(runs, name):
    out = runs[name]
    frame = results(out)
    assert list(frame["N_tokens"]) == [16, 32]
    assert set(frame["status"]) == {"ok"}
    assert (frame["walltime_ms"] > 0).all() and (frame["peak_mem_gib"] > 0).all()
    assert set(frame["cp"]) == {CP[name]}
    if CP[name] > 1:  # the workload really communicates, and the per-op table says through which op
        assert (frame["comm_ms"] > 0).all() and (frame["comm_mib_per_step"] > 0).all()
        ops = pd.read_csv(out / "comm_ops.csv")
        assert set(ops["N_tokens"]) == {16, 32}
        assert set(ops["op"]) <= {"axial_mix.row_mean", "axial_mix.col_mean"} and (ops["fwd_bytes"] > 0).all()


def test_checksum_does_not_depend_on_the_cp_layout(runs):
    """The built-in workload computes the same function at every CP layout."""
    sums = {name: list(results(out)["checksum"]) for name, out in runs.items()}
    for name, values in sums.items():
        assert values == pytest.approx(sums["1d-cp1"], rel=1e-5), name


@pytest.mark.parametrize(
    "extra",
    [["topology.cp=2"], ["topology.kind=2d", "topology.cp=2", "topology.grid=[2,1]"]],
    ids=["1d-cp2", "2d-2x1"],
)
def test_torchrun_runs_one_rank_per_process(tmp_path, extra):
    out = tmp_path / "out"
    proc = ok(torchrun(2, *extra, POINTS, *FAST, f"output_dir={out}", cwd=tmp_path))
    frame = results(out)
    assert list(frame["N_tokens"]) == [16, 32] and set(frame["status"]) == {"ok"}
    assert set(frame["cp"]) == {2}
    assert "point(s) to measure" in proc.stderr  # rank 0 speaks ...
    assert proc.stderr.count("point(s) to measure") == 1  # ... and only rank 0


def test_adapter_module_runs_unchanged(tmp_path):
    out = tmp_path / "out"
    ok(
        cpbench(
            "topology.cp=2",
            "workload=adapter",
            "workload.module=adapters.fold_cp_style",
            "workload.contract=native",
            POINTS,
            *FAST,
            f"output_dir={out}",
            cwd=tmp_path,
        )
    )
    frame = results(out)
    assert set(frame["workload"]) == {"adapters.fold_cp_style"} and set(frame["status"]) == {"ok"}
    assert frame["checksum"].notna().all()
