"""Calibrate, then forecast, through their entry points: `python -m cpbench.calibrate`, then
`python -m cpbench.forecast`."""

from __future__ import annotations

import math
import sys

import pandas as pd
from support.processes import BASE, TIMING, ok, run_cmd

from cpbench.steptime.hardware import load_hardware
from cpbench.steptime.model import INTRA


def test_calibrate_then_forecast_through_their_entry_points(tmp_path):
    """`python -m cpbench.calibrate` runs cp=2 at two N, times each op, fits the link to the run's
    collectives and writes calibration.yaml with the run checked against it; `python -m
    cpbench.forecast` predicts from that file, shows the run's rows beside their predictions, fills
    the planning table, and refuses what it cannot price, by name."""
    cal = tmp_path / "cal"
    calibrate = [
        sys.executable,
        "-m",
        "cpbench.calibrate",
        *BASE,
        *TIMING,
        "topology.cp=2",
        f"output_dir={cal}",
    ]
    calibrated = ok(run_cmd([*calibrate, "sweep.n_tokens=[32,64]"], tmp_path, timeout=240))
    assert "| 1d cp=2 | 32 |" in calibrated.stdout and "| 1d cp=2 | 64 |" in calibrated.stdout
    hw = load_hardware(str(cal / "calibration.yaml"))
    assert hw.devices_per_node >= 1 and hw.dtype == "float32" and INTRA in hw.links
    assert "aten.addmm" in hw.ops and all(c.kernel_s >= 0 and c.per_s > 0 for c in hw.ops.values())
    assert "python -m cpbench.calibrate" in hw.sources["ops"]
    # A second run of the configuration pools with the first: each point's step is the median of
    # the two (their mean), in the calibration's check and in a forecast's against a glob of both.
    again = ok(run_cmd([*calibrate[:-1], f"output_dir={tmp_path / 'cal2'}", "sweep.n_tokens=[32,64]",
                        f"forecast.pool={cal}"], tmp_path, timeout=240))  # fmt: skip
    steps = [
        pd.read_csv(d / "results.csv").set_index(["cp", "N_tokens"])["walltime_ms"]
        for d in (cal, tmp_path / "cal2")
    ]
    pooled = f"{(steps[0][(2, 64)] + steps[1][(2, 64)]) / 2:.3g} ms"
    checked = [line for line in again.stdout.splitlines() if line.startswith("| 1d cp=")]
    assert f"| 1d cp=2 | 64 | {pooled} |" in again.stdout and len(checked) == 2
    assert all(line.endswith("%) |") and "| 2 (" in line for line in checked)
    assert "median of 2 runs" in (tmp_path / "cal2" / "calibration.yaml").read_text()

    common = [
        sys.executable,
        "-m",
        "cpbench.forecast",
        *BASE,
        f"forecast.hardware={cal / 'calibration.yaml'}",
    ]
    out = tmp_path / "forecast"
    forecast = ok(run_cmd([*common, f"output_dir={out}", f"forecast.against={cal}", "forecast.n_tokens=[128]",
                           "forecast.cp=[1,2,4]", "forecast.ranks_per_node=4", "forecast.plan_n_tokens=[64]",
                           "forecast.plan_max_cp=4"], tmp_path, timeout=240))  # fmt: skip
    text = (out / "forecast.md").read_text()
    assert text == forecast.stdout
    predicted = [line for line in text.splitlines() if line.startswith("| 1d cp=") and "| 128 |" in line]
    assert len(predicted) == 3
    shared = {line.split("|")[1].strip(): float(line.split("|")[-2]) for line in predicted}
    assert shared == {"1d cp=1": 1.0, "1d cp=2": 1.0, "1d cp=4": 4 / hw.devices_per_node}
    measured = text.split("## Against")[1].split("##")[0]
    assert measured.count("| 1d cp=2 |") == 2
    errors = [
        float(line.split("|")[7].strip().rstrip("%"))
        for line in measured.splitlines()
        if "| 1d cp=2 |" in line
    ]
    assert all(math.isfinite(e) for e in errors)
    plan = text.split("## Planning table")[1]
    assert "| 64 | 1d | cp=1 (1d) |" in plan and "| 64 | 2d | cp=1 (1d) |" in plan
    # cp=4 at 2 ranks a node crosses nodes: a one-node calibration has no figures for that.
    at_two = ["forecast.cp=[4]", "forecast.ranks_per_node=2", "forecast.n_tokens=[64]"]
    crossed = run_cmd([*common, f"output_dir={tmp_path / 'crossed'}", *at_two], tmp_path, timeout=120)
    assert crossed.returncode == 2 and "no inter-node link figures" in crossed.stderr
    both = ok(run_cmd([*common, f"output_dir={tmp_path / 'both'}", f"forecast.against={tmp_path}/cal*",
                       "forecast.n_tokens=[64]"], tmp_path, timeout=120))  # fmt: skip
    assert "median over 2 runs" in both.stdout and f"| 1d cp=2 | 64 | {pooled} |" in both.stdout
