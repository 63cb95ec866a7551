"""The modes' checks in-process: when a step time has settled, a wide spread, disagreements bit-exact or
within rtol, the accuracy reference, repeat spreads, and bad settings in one line each."""

from __future__ import annotations

import math

import pandas as pd
import pytest
from omegaconf import OmegaConf

from cpbench.app.preflight import check_runs_of_its_own
from cpbench.checks.accuracy import check_point, disagreements, tolerance
from cpbench.checks.repeat import repeat_spread, spread
from cpbench.core import ConfigError
from cpbench.measure.stats import settled, spread_wide
from cpbench.record.run_record import RepeatCheck, Spread
from cpbench.settings.cp1 import cp1_settings
from cpbench.settings.schema import BenchConfig, Mode
from cpbench.settings.validate import validate


def test_settled_once_the_step_time_stops_falling():
    assert not settled([100.0, 10.0], 5)  # fewer than three steps
    assert settled([300.0, 100.0, 104.0, 110.0], 5)  # the first (compile) step is past; 110 is noise
    assert not settled([300.0, 200.0, 100.0], 5)  # still falling
    assert not settled([300.0, 200.0, 100.0, 101.0], 5)  # 100 is 50% under the fastest before it
    assert settled([300.0, 200.0, 100.0, 101.0, 99.0], 5)  # 99 is within 5% of 100
    assert not settled([300.0, 200.0, 100.0, 101.0, 94.0], 5)  # 94 is 6% under 100


def test_spread_wide_is_an_iqr_over_the_percentage_of_the_median():
    assert spread_wide([10.0, 10.0, 14.0, 14.0, 10.0], 10)  # IQR 4 on a median of 10
    assert not spread_wide([10.0, 10.1, 10.0, 10.1, 10.0], 10)


def test_disagreements_bit_exact_or_within_rtol_and_show_both_values():
    row, same = {"checksum": 1.0, "loss": 2.0, "grad_norm": None}, {"checksum": 1.0, "loss": 2.0}
    assert disagreements(row, same, 0.0) == []
    nudged = {"checksum": 1.0 + 1e-12, "loss": 2.0}
    assert disagreements(row, nudged, 1e-5) == []
    (found,) = disagreements(row, nudged, 0.0)  # bit-exact: one ulp-level difference is one
    assert found.startswith("checksum 1 here vs 1.000000000001") and "bit-exact" in found
    (found,) = disagreements(row, {"checksum": 1.0, "loss": 2.01}, 1e-5)
    assert found == "loss 2 here vs 2.0099999999999998 at cp=1 (rtol 1e-05)"
    assert disagreements({"loss": math.nan}, {"loss": 1.0}, 1e-5) == [
        "loss none here vs 1 at cp=1 (rtol 1e-05)"
    ]


def test_check_point_names_what_it_could_not_check():
    assert check_point({"checksum": 1.0}, None, 0.0)[0] == "ok"
    assert "oom" in check_point({"checksum": 1.0}, {"status": "oom"}, 0.0)[1]
    status, error = check_point({"checksum": 1.0}, {"status": "ok", "checksum": 2.0}, 1e-5)
    assert status == "mismatch" and "checksum 1 here vs 2 at cp=1" in error


def _settings(*overrides: str) -> BenchConfig:
    base = OmegaConf.structured(BenchConfig)
    cfg = OmegaConf.merge(base, OmegaConf.from_dotlist(["workload={}", "output_dir=x", *overrides]))
    return OmegaConf.to_object(cfg)


def test_the_reference_is_the_same_config_on_one_rank_and_its_tolerance():
    settings = _settings(
        "topology.kind=2d", "topology.cp=4", "fault.rank=1", "fault.kind=perturb", "mode=accuracy"
    )
    reference = cp1_settings(settings)
    assert (reference.topology.kind, reference.topology.cp, reference.topology.grid) == ("2d", 1, None)
    assert reference.fault.rank is None and not reference.probe.enabled
    assert reference.mode is Mode.accuracy and reference.workflow is settings.workflow
    assert (
        tolerance(settings) == 1e-5 and tolerance(_settings("accuracy.rtol=0.001", "topology.cp=2")) == 1e-3
    )
    assert tolerance(_settings("dtype=bfloat16", "topology.cp=2")) == 1e-2
    assert tolerance(_settings("topology.cp=1")) == 0.0  # the same layout: bit-exact


def test_spread_is_the_range_and_its_share_of_the_median():
    assert spread([10.0, 12.0, 11.0]) == Spread(10, 12, 2, pytest.approx(2 / 11))
    assert spread([0.0, 0.0]) == Spread(0.0, 0.0, 0.0, 0.0)


def test_repeat_spread_takes_points_ok_in_every_run_of_the_config():
    def frame(walltime: float, checksum: float, status: str = "ok") -> pd.DataFrame:
        point = {"kind": "point", "N_tokens": 16, "N_atoms": 144, "MSA_depth": 16, "config_hash": "h"}
        rows = [
            {**point, "status": status, "walltime_ms": walltime, "checksum": checksum, "loss": math.nan},
            {**point, "N_tokens": 32, "status": "ok", "walltime_ms": 5.0, "checksum": 1.0, "loss": math.nan},
            {**point, "config_hash": "other", "status": "ok", "walltime_ms": 99.0, "checksum": 9.0},
        ]
        return pd.DataFrame(rows)

    check = repeat_spread([frame(10.0, 3.0), frame(12.0, 3.0), frame(11.0, 3.0)], "h")
    assert [p.n_tokens for p in check.points] == [16, 32]
    assert check.points[0].figures["walltime_ms"] == spread([10, 12, 11])
    assert check.points[0].figures["walltime_ms"].relative == pytest.approx(2 / 11)
    assert "loss" not in check.points[0].figures  # blank: not a figure of this run
    assert check.tolerance == pytest.approx({"walltime_ms": 2 / 11, "checksum": 0.0})
    assert RepeatCheck.from_json(check.to_json()) == check  # as run.json keeps it
    check = repeat_spread([frame(10.0, 3.0), frame(12.0, 3.0, status="oom")], "h")
    assert [p.n_tokens for p in check.points] == [32]


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("repeat_check=1", "repeat_check=1: must be 0 (off) or >= 2 (runs in all)"),
        ("timing.warmup_max=0", "timing.warmup_max=0: must be >= 1"),
        ("timing.settle_pct=0", "timing.settle_pct=0.0: must be > 0"),
        ("accuracy.rtol=-1", "accuracy.rtol=-1.0: must be > 0"),
        ("fault.where=batch", "fault.where=batch: fault.kind=perturb changes the step's outputs"),
    ],
)
def test_bad_settings_are_one_line_each(override, message):
    with pytest.raises(ConfigError, match="^" + message.replace("(", r"\(").replace(")", r"\)")):
        validate(_settings("fault.kind=perturb", override))


def test_modes_that_launch_runs_of_their_own_refuse_torchrun(monkeypatch):
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "x")
    with pytest.raises(ConfigError, match="^mode=accuracy: it launches runs of its own"):
        check_runs_of_its_own(_settings("mode=accuracy"))
    check_runs_of_its_own(_settings())  # speed mode runs under torchrun as before
