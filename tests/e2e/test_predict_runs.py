"""The prediction in real runs: a predicted probe records what was predicted beside what was measured,
and `python -m cpbench.predict` prints the estimate and runs no step."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from support.processes import FAST, TIMING, cpbench, ok, results

from cpbench.probe import predict, trace


@pytest.fixture(scope="module")
def guided_run(tmp_path_factory):
    """cp=1: the rank runs in the process that made the prediction, after its fake group is gone."""
    out = tmp_path_factory.mktemp("predict")
    args = ["topology.cp=1", "sweep.n_tokens=[64]", "probe.enabled=true", "probe.predict=true",
            "probe.start=64", "probe.granularity=64", "probe.measure_at_max=false", "memory.budget_gib=0.1",
            *TIMING]  # fmt: skip
    proc = ok(cpbench(*args, f"output_dir={out}", cwd=out, timeout=300))
    return out, proc


def test_a_predicted_probe_records_predicted_beside_measured(guided_run):
    out, proc = guided_run
    prediction = json.loads((out / "prediction.json").read_text())
    trials = pd.read_csv(out / "probe.csv")
    steps = trials[~trials["point"]]  # the walltime point at N=64 is a trial the probe did not step
    assert steps["N_tokens"].iloc[0] == prediction["calibrations"][0]["proposal"] and steps["guided"].iloc[0]
    assert len(steps) <= 3  # the prediction held: the proposal, one step past it, at most one more
    assert steps["predicted_peak_gib"].notna().all() and trials["max_peak_gib"].notna().all()
    # The walltime point at N=64 calibrated the estimate first: its miss is added to every later
    # estimate, until a larger step fits and calibrates it again.
    calibrations = prediction["calibrations"]
    assert calibrations[0]["N_tokens"] == 64 and calibrations[-1] == {
        **prediction["calibration"],
        "proposal": prediction["proposal"],
    }
    point = results(out).query("kind == 'point' and N_tokens == 64").iloc[0]
    missed = calibrations[0]["missed_gib"]
    assert point["predicted_peak_gib"] + missed == pytest.approx(point["peak_mem_gib"], abs=1e-9)
    traces = prediction["estimates"]
    raw = predict.Prediction([trace.Estimate(e["N_tokens"], e["peak_gib"]) for e in traces])
    baseline = point["predicted_peak_gib"] - raw.at(64)
    largest_fit = 64
    for step in steps.itertuples():  # in the order they ran, each with the calibration of its time
        assert step.predicted_peak_gib == pytest.approx(raw.at(step.N_tokens) + missed + baseline, abs=1e-9)
        if step.fits and step.N_tokens > largest_fit:
            largest_fit = step.N_tokens
            again = next(c for c in calibrations if c["N_tokens"] == largest_fit)
            assert again["missed_gib"] == pytest.approx(step.max_peak_gib - baseline - raw.at(largest_fit))
            missed = again["missed_gib"]
    assert calibrations[-1]["N_tokens"] == largest_fit
    assert "probe.predict: at N=64 the real peak was" in proc.stderr
    rows = results(out)
    assert rows["predicted_peak_gib"].notna().all()
    assert "fake-tensor estimate" in (out / "cp_benchmark.md").read_text()
    assert "probe.predict: max N_tokens" in proc.stderr


def test_the_predict_command_prints_the_estimate_and_runs_no_step(tmp_path):
    args = [
        "topology.kind=2d",
        "topology.cp=4",
        "memory.budget_gib=0.02",
        "probe.start=128",
        "command=predict",
    ]
    proc = ok(cpbench(*args, *FAST, f"output_dir={tmp_path}", cwd=tmp_path, timeout=120))
    assert "predicted max N_tokens:" in proc.stdout and "assumes:" in proc.stdout
    assert not (tmp_path / "results.csv").exists()
