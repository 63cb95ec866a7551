"""Bad input gets one clear line and leaves nothing; a failing rank ends the job and keeps the rows."""

from __future__ import annotations

import pytest
from conftest import FAST, cpbench, refused, results

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


# Refused by cpbench's own checks, as a `python -m cpbench` process (tests/test_faults.py runs one that
# Hydra refuses); the others in this process, through the same main().
AS_PROCESS = {"topology.cp=0"}


@pytest.mark.parametrize("overrides,message", BAD, ids=[" ".join(o) for o, _ in BAD])
def test_bad_input_is_rejected_by_name(tmp_path, overrides, message):
    out = tmp_path / "out"
    if " ".join(overrides) in AS_PROCESS:
        proc = cpbench(*overrides, f"output_dir={out}", cwd=tmp_path, timeout=60)
    else:
        proc = refused(*overrides, f"output_dir={out}", cwd=tmp_path)
    assert proc.returncode != 0
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


def test_a_peer_error_file_cut_short_by_the_kill_does_not_hide_the_root_cause(tmp_path):
    """The agent kills the other ranks as soon as one fails: a peer may leave its error file empty."""
    import json

    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

    from cpbench.launch.local import _failure

    attempt = tmp_path / "attempt_0"
    for rank in (0, 1):
        (attempt / str(rank)).mkdir(parents=True)
    first = attempt / "0" / "error.json"
    message = {"message": "RuntimeError: boom", "extraInfo": {"py_callstack": "x\ny", "timestamp": "0"}}
    first.write_text(json.dumps({"message": message}))
    (attempt / "1" / "error.json").write_text("")
    err = ChildFailedError("rank", {0: ProcessFailure(0, 1, 1, str(first))})
    failure = _failure(err)
    assert (failure.rank, failure.reason, failure.crashed) == (0, "RuntimeError: boom", False)
