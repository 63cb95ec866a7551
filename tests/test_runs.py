"""Real multi-rank runs on CPU (gloo) through `python -m cpbench` and `torchrun -m cpbench`."""

from __future__ import annotations

import pandas as pd
import pytest
from conftest import FAST, cpbench, ok, results, torchrun

POINTS = "sweep.n_tokens=[16,32]"


@pytest.mark.parametrize(
    "topology",
    [
        ["topology.cp=1"],
        ["topology.cp=2"],
        ["topology.cp=4"],
        ["topology.kind=2d", "topology.cp=4"],
        ["topology.kind=2d", "topology.cp=2", "topology.grid=[1,2]"],
    ],
    ids=["1d-cp1", "1d-cp2", "1d-cp4", "2d-2x2", "2d-1x2"],
)
def test_python_m_cpbench_runs_every_topology(tmp_path, topology):
    out = tmp_path / "out"
    ok(cpbench(*topology, POINTS, *FAST, f"output_dir={out}", cwd=tmp_path))
    frame = results(out)
    assert list(frame["N_tokens"]) == [16, 32]
    assert set(frame["status"]) == {"ok"}
    assert (frame["walltime_ms"] > 0).all() and (frame["peak_mem_gib"] > 0).all()
    cp = int(topology[-1].split("=")[1]) if "grid" not in topology[-1] else 2
    assert set(frame["cp"]) == {cp}
    if cp > 1:  # the workload really communicates, and the per-op table says through which op
        assert (frame["comm_ms"] > 0).all() and (frame["comm_mib_per_step"] > 0).all()
        ops = pd.read_csv(out / "comm_ops.csv")
        assert set(ops["N_tokens"]) == {16, 32} and "axial_mix.col_mean" in set(ops["op"])
        assert (ops.loc[ops["op"] == "axial_mix.col_mean", "fwd_bytes"] > 0).all()


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


def test_checksum_does_not_depend_on_the_cp_layout(tmp_path):
    """The built-in workload computes the same function at every CP layout."""
    sums = []
    for i, topology in enumerate(
        [["topology.cp=1"], ["topology.cp=2"], ["topology.kind=2d", "topology.cp=4"]]
    ):
        out = tmp_path / f"o{i}"
        ok(cpbench(*topology, "sweep.n_tokens=[32]", *FAST, f"output_dir={out}", cwd=tmp_path))
        sums.append(results(out)["checksum"].iloc[0])
    assert sums[1] == pytest.approx(sums[0], rel=1e-5) and sums[2] == pytest.approx(sums[0], rel=1e-5)


def test_training_times_each_phase(tmp_path):
    out = tmp_path / "out"
    ok(
        cpbench(
            "topology.cp=2",
            "workflow=training",
            "sweep.n_tokens=[32]",
            *FAST,
            f"output_dir={out}",
            cwd=tmp_path,
        )
    )
    row = results(out).iloc[0]
    assert row["workflow"] == "training" and row["status"] == "ok"
    for phase in ("forward_ms", "backward_ms", "optimizer_ms"):
        assert row[phase] > 0
    assert row["walltime_ms"] == pytest.approx(
        row["forward_ms"] + row["backward_ms"] + row["optimizer_ms"], rel=0.5
    )


def test_adapter_module_runs_unchanged(tmp_path):
    out = tmp_path / "out"
    ok(
        cpbench(
            "topology.cp=2",
            "workload=adapter",
            "workload.module=adapters.fold_cp_style",
            POINTS,
            *FAST,
            f"output_dir={out}",
            cwd=tmp_path,
        )
    )
    frame = results(out)
    assert set(frame["workload"]) == {"adapters.fold_cp_style"} and set(frame["status"]) == {"ok"}
    assert frame["checksum"].notna().all()
