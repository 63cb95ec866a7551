"""Your own CP model, unchanged: a module written for the fold-cp driver, built on DTensor
(tests/adapters/dtensor_pair.py), through `python -m cpbench workload=adapter` on a 2x2 grid."""

from __future__ import annotations

from datetime import datetime

import numpy as np
import pandas as pd
import pytest
from support.flops_expected import counted, dtensor_pair_flops
from support.processes import TIMING, cpbench, ok, results

from cpbench.results.row import BASELINE

DTENSOR = ["workload=adapter", "workload.module=adapters.dtensor_pair", "topology.kind=2d"]
GRID = [*DTENSOR, "topology.cp=4"]
POINTS = ["sweep.n_tokens=[16,32]", "probe.enabled=false", *TIMING]
# A rank's failure ends the attempt within agree_timeout_s; a hang would wait out dist.timeout_s,
# longer than the test's own timeout.
BOUNDED = ["dist.agree_timeout_s=5", "dist.timeout_s=900"]


@pytest.fixture(scope="module")
def inference(tmp_path_factory):
    """The DTensor module at 2x2, twice with one model config; the second run with its cp=1 baseline
    (a 1x1 grid of the same (cp0, cp1) mesh), whose rows are the one-rank result, and with
    measure.profile_comm=true, which times the collectives without changing what is computed."""
    root = tmp_path_factory.mktemp("dtensor")
    runs, reports = {}, {}
    for name, extra in (("first", []), ("again", ["baseline=true", "measure.profile_comm=true"])):
        proc = ok(cpbench(*GRID, *POINTS, *extra, f"output_dir={root / name}", cwd=root, timeout=300))
        assert "baseline failed" not in proc.stderr
        frame = results(root / name)
        runs[name] = frame[frame["source"] != BASELINE].reset_index(drop=True)
        reports[name] = (root / name / "cp_benchmark.md").read_text()
    frame = results(root / "again")
    runs["one"] = frame[frame["source"] == BASELINE].reset_index(drop=True)
    return runs, reports


def test_dtensor_module_runs_unchanged_at_2x2(inference):
    runs, reports = inference
    frame = runs["first"]
    assert list(frame["status"]) == ["ok", "ok"] and set(frame["grid"]) == {"2x2"}
    assert frame["walltime_ms"].gt(0).all()
    assert frame["comm_ms"].isna().all()  # its collectives bypass cpbench's ledger: blank, not 0
    assert "Time in collectives is not known at cp=4" in reports["first"] and "-bound" not in reports["first"]


def test_the_same_config_gives_the_same_checksums_profiled_or_not(inference):
    runs, _ = inference
    assert list(runs["first"]["checksum"]) == list(runs["again"]["checksum"])


def test_dtensor_checksum_counts_each_value_once(inference):
    """Sharded outputs summed over the 4 ranks equal the one-rank sum (a replica counted once)."""
    runs, _ = inference
    cp4, one = runs["first"]["checksum"], runs["one"]["checksum"]
    assert cp4.notna().all() and list(runs["one"]["cp"]) == [1, 1]
    assert list(cp4) == pytest.approx(list(one), rel=1e-6)


def test_the_dtensor_modules_flops_are_counted_once_per_rank_share(inference):
    """DTensor ops counted at the local shapes DTensor runs and summed over the ranks (counted at the
    DTensor's global shape, or with DTensor's own shape propagation, every rank would add the whole
    model again): at 2x2 and at cp=1 (1x1), each as the module runs it."""
    runs, reports = inference
    for frame, ranks in ((runs["first"], 4), (runs["one"], 1)):
        assert counted(frame) == [dtensor_pair_flops(n, ranks) for n in frame["N_tokens"]]
    assert "### Hardware efficiency" in reports["again"] and "not a datasheet" in reports["again"]


def test_training_the_module_steps_itself(tmp_path):
    out = tmp_path / "out"
    # No FLOP count: of a DTensor training step on fake tensors, it took 45-59 s of each shape here, and
    # this test asserts nothing it gives (the module's counts: test_the_dtensor_modules_flops_are_...).
    ok(cpbench(*GRID, *POINTS, "workflow=training", "measure.count_flops=false", f"output_dir={out}",
               cwd=tmp_path, timeout=300))  # fmt: skip
    frame = results(out)
    assert list(frame["status"]) == ["ok", "ok"] and frame["checksum"].notna().all()
    # The driver adds no backward or optimizer: the step's phases are the module's, not split.
    assert frame[["forward_ms", "backward_ms", "optimizer_ms"]].isna().all().all()


def test_profile_comm_sees_the_models_own_collectives(inference):
    runs, _ = inference
    frame = runs["again"]
    assert frame["comm_ms"].gt(0).all() and (frame["comm_ms"] < frame["walltime_ms"]).all()


@pytest.mark.parametrize(("rank", "where"), [(0, "batch"), (1, "step")])
def test_a_rank_out_of_memory_inside_the_models_collectives_is_bounded(tmp_path, rank, where):
    """Rank 0 before build_batch's distribute_tensor (its peers wait for its scatter), or rank 1
    between two of the model's own collectives: the point is recorded as not fitting, quickly."""
    out = tmp_path / "out"
    proc = cpbench(*GRID, *POINTS, *BOUNDED, f"output_dir={out}", cwd=tmp_path, timeout=400,
                   env={"CPBENCH_TEST_OOM": f"{rank}:32:{where}"})  # fmt: skip
    ok(proc)
    frame = results(out)
    assert list(zip(frame["N_tokens"], frame["status"], strict=True)) == [(16, "ok"), (32, "oom")]
    assert f"rank {rank}" in frame["error"].iloc[1]
    # The failing rank gave up (its error file) at most agree_timeout_s + 10 s after it failed (its log).
    failed_at = next(
        datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")
        for line in (out / "logs" / f"rank{rank}.log").read_text().splitlines()
        if "N=32: RuntimeError" in line
    )
    [error_file] = (out / "logs" / "launch").glob(f"*/attempt_0/{rank}/error.json")
    waited = datetime.fromtimestamp(error_file.stat().st_mtime) - failed_at
    assert waited.total_seconds() < 5 + 10, waited


def test_the_probe_under_a_cpu_budget_and_a_fault_in_the_full_measurement(tmp_path):
    """The probe's steps fit up to 128, but the full measurement at each N >= 96 runs out of memory
    (every rank, from its second batch): the answer steps down to 64 instead of keeping a max-fit row."""
    out = tmp_path / "out"
    probe = ["sweep.n_tokens=[]", "probe.enabled=true", "probe.start=64", "probe.max_tokens=128",
             "probe.granularity=32", "memory.cpu_budget_gib=1.0", "measure.count_flops=false",
             *TIMING]  # fmt: skip
    ok(cpbench(*GRID, *probe, f"output_dir={out}", cwd=tmp_path, timeout=300,
               env={"CPBENCH_TEST_OOM": "*:96:repeat"}))  # fmt: skip
    frame = results(out)
    points = frame[frame["kind"] == "point"]
    assert list(zip(points["N_tokens"], points["status"], strict=True)) == [
        (128, "oom"),
        (96, "oom"),
        (64, "ok"),
    ]
    fit = frame[frame["kind"] == "max-fit"].iloc[0]
    assert (fit["N_tokens"], fit["status"], fit["oom_at"]) == (64, "ok", 96)


NATIVE = ["workload=adapter", "workload.module=adapters.dtensor_native", "workload.contract=native",
          "workflow=convergence", "shape.n_tokens=16", "convergence.steps=10",
          "log.progress=false"]  # fmt: skip


def test_a_native_dtensor_model_trains_at_cp2_as_on_one_rank(tmp_path):
    """cpbench's own contract: the driver sums the plain parameter's gradient over the ranks and leaves
    the DTensor parameters' gradients, which DTensor completed, alone; the curve equals one rank's."""
    curves = {}
    for cp in (1, 2):
        out = tmp_path / f"cp{cp}"
        ok(cpbench(*NATIVE, f"topology.cp={cp}", f"output_dir={out}", cwd=tmp_path, timeout=300))
        curves[cp] = pd.read_csv(out / "convergence.csv")
    for column in ("loss", "grad_norm"):
        np.testing.assert_allclose(curves[2][column], curves[1][column], rtol=1e-5)
    assert curves[1]["loss"].iloc[-1] < curves[1]["loss"].iloc[0]  # it trains
