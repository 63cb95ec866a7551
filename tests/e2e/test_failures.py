"""Bad input gets one clear line and leaves nothing; a failing rank ends the job and keeps the rows."""

from __future__ import annotations

import pytest
from support.processes import FAST, cpbench, refused, results

BAD = [
    (["workload=nope"], "workload"),
    (["shape.n_tokens=0"], "shape.n_tokens=0: must be > 0"),
    (["sweep.n_tokens=[64,-8]"], "sweep.n_tokens=[64, -8]: entries must be integers > 0"),
    (["shape.msa_depth=-1"], "shape.msa_depth=-1: must be > 0"),
    (["timing.repeats=0"], "timing.repeats=0: must be >= 1"),
    (["measure.peak_tflops=-1"], "measure.peak_tflops=-1.0: must be > 0"),
    (["topology.cp=0"], "topology.cp=0: must be an integer >= 1"),
    (
        ["topology.kind=2d", "topology.cp=4", "topology.grid=[3,2]"],
        "topology.grid=[3, 2]: must be [rows, cols]",
    ),
    (["topology.kind=3d"], "topology.kind=3d: allowed values are 1d, 2d"),
    (["topology.cp=2", "dist.backend=nccl"], "topology.cp=2: needs 2 GPUs on this node, 0 visible"),
    (
        ["workload=adapter", "workload.module=no_such_module"],
        "workload.module=no_such_module: cannot be imported",
    ),
    (["workload=adapter", "workload.module=adapters.missing_hook"], "lacks hook(s) run_step"),
    (["workflow=serving"], "workflow"),
    (["topology.cpp=2"], "topology.cpp"),
]


# As a `python -m cpbench` process, one refusal of each kind: by cpbench's own checks (topology.cp=0) and
# by Hydra's own config check (topology.cpp=2, exit 2: once tests/e2e/test_faults.py's
# test_hydras_own_config_errors_exit_2, merged here, which proved the same through a second process);
# the others in this process, through the same main().
AS_PROCESS = {"topology.cp=0": None, "topology.cpp=2": 2}  # and the exit code it must give, if one


@pytest.mark.parametrize("overrides,message", BAD, ids=[" ".join(o) for o, _ in BAD])
def test_bad_input_is_rejected_by_name(tmp_path, overrides, message):
    out = tmp_path / "out"
    if " ".join(overrides) in AS_PROCESS:
        proc = cpbench(*overrides, f"output_dir={out}", cwd=tmp_path, timeout=60)
    else:
        proc = refused(*overrides, f"output_dir={out}", cwd=tmp_path)
    assert proc.returncode != 0
    if AS_PROCESS.get(" ".join(overrides)) is not None:
        assert proc.returncode == AS_PROCESS[" ".join(overrides)], proc.stderr
    assert message in proc.stderr, proc.stderr
    assert not out.exists() or not any(out.iterdir()), list(out.rglob("*"))
    assert sorted(p.name for p in tmp_path.iterdir()) in ([], ["out"])
    if message.startswith(overrides[0].split("=")[0]) and "=" in message:
        assert proc.stderr.strip().count("\n") == 0, "one clear line"


def test_a_rank_raising_mid_sweep_ends_the_job_and_keeps_measured_rows(tmp_path):
    out = tmp_path / "out"
    proc = cpbench(
        "topology.cp=2",
        "workload=adapter",
        "workload.module=adapters.fold_cp_style",
        "workload.contract=native",
        "sweep.n_tokens=[16,32,64]",
        *FAST,
        f"output_dir={out}",
        cwd=tmp_path,
        timeout=120,
        env={"CPBENCH_TEST_FAIL": "1:32"},
    )
    assert proc.returncode == 1
    assert "rank 1 failed: ValueError: injected failure at N=32" in proc.stderr
    assert "fold_cp_style.py" in proc.stderr  # the head of its traceback
    frame = results(out)
    assert list(frame["N_tokens"]) == [16, 32]
    assert list(frame["status"]) == ["ok", "error"]
    assert "injected failure" in frame["error"].iloc[1]
    assert "| 32 |" in (out / "cp_benchmark.md").read_text()
