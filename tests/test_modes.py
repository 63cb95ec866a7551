"""Benchmark modes (speed, accuracy) and the same-answer-twice check (repeat_check), through the real
entry point, plus the pure rules they rest on."""

from __future__ import annotations

import json
import math
import multiprocessing as mp
import os
import queue
import socket
import time

import pandas as pd
import pytest
import torch
import torch.distributed as dist
from conftest import cpbench, ok, rank_processes, results
from omegaconf import OmegaConf

from cpbench.app.preflight import check_runs_of_its_own
from cpbench.checks.accuracy import check_point, disagreements, tolerance
from cpbench.checks.repeat import repeat_spread, spread
from cpbench.core import ConfigError, Shape, Topology
from cpbench.measure.point import PointSettings, measure_point
from cpbench.measure.stats import settled, spread_wide
from cpbench.measure.step import StepRunner
from cpbench.record.run_record import RepeatCheck, Spread
from cpbench.results.folder import RunFolder
from cpbench.runtime.rank import rank_runtime
from cpbench.settings.cp1 import cp1_settings
from cpbench.settings.schema import BenchConfig, Mode, TimingConfig
from cpbench.settings.validate import validate

QUIET = ["log.progress=false", "probe.enabled=false", "timing.warmup=1", "timing.repeats=2"]
ACCURACY = ["mode=accuracy", "workflow=training", *QUIET]


# The rules, pure.


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


# Real runs.


def _reference(out):
    """The cp=1 reference run's folder: the baseline's, in the run's cache."""
    (folder,) = (out / RunFolder.BASELINE).iterdir()
    return folder


@pytest.fixture(scope="module")
def accuracy_1d(tmp_path_factory):
    """cp=2 training in accuracy mode; rank 1 perturbed from N=32 on: N=16 agrees with cp=1, N=32 not."""
    cwd = tmp_path_factory.mktemp("accuracy_1d")
    perturb = ["fault.rank=1", "fault.at_n=32", "fault.kind=perturb"]
    proc = cpbench(
        "topology.cp=2", "sweep.n_tokens=[16,32]", *ACCURACY, *perturb, "output_dir=out", cwd=cwd, timeout=300
    )
    return proc, cwd / "out"


def test_accuracy_mode_at_1d_cp2_agrees_with_cp1_and_records_what_it_checks(accuracy_1d):
    _, out = accuracy_1d
    reference = results(_reference(out))
    assert list(reference["cp"]) == [1, 1] and set(reference["status"]) == {"ok"}
    row = results(out).set_index("N_tokens").loc[16]
    assert row["status"] == "ok" and not isinstance(row["error"], str)
    ref = reference.set_index("N_tokens").loc[16]
    for name in ("checksum", "loss", "grad_norm"):
        assert row[name] == pytest.approx(ref[name], rel=1e-5) and row[name] > 0, name
    assert row["loss"] == row["checksum"]  # native training: the step's output is the loss
    assert (row["warmup_steps"], row["repeats"]) == (1, 2)  # accuracy mode: the counts are fixed
    assert row["first_step_ms"] > 0


def test_a_perturbed_rank_fails_its_point_with_both_values(accuracy_1d):
    proc, out = accuracy_1d
    assert proc.returncode == 1, proc.stderr
    row = results(out).set_index("N_tokens").loc[32]
    ref = results(_reference(out)).set_index("N_tokens").loc[32]
    assert row["status"] == "mismatch"
    shown = f"checksum {row['checksum']:.17g} here vs {ref['checksum']:.17g} at cp=1 (rtol 1e-05)"
    assert shown in row["error"] and shown in proc.stderr
    assert f"loss {row['loss']:.17g} here vs {ref['loss']:.17g}" in row["error"]
    assert f"grad_norm {row['grad_norm']:.17g} here vs {ref['grad_norm']:.17g}" in row["error"]
    assert "N=32 differs from cp=1" in proc.stderr
    assert "mismatch" in (out / "cp_benchmark.md").read_text()


def test_accuracy_mode_at_2d_2x2_agrees_with_cp1(tmp_path):
    ok(
        cpbench(
            "topology.kind=2d",
            "topology.cp=4",
            "sweep.n_tokens=[16]",
            *ACCURACY,
            "output_dir=out",
            cwd=tmp_path,
            timeout=300,
        )
    )
    row, ref = results(tmp_path / "out").iloc[0], results(_reference(tmp_path / "out")).iloc[0]
    assert (row["status"], row["grid"], ref["cp"]) == ("ok", "2x2", 1)
    for name in ("checksum", "loss", "grad_norm"):
        assert row[name] == pytest.approx(ref[name], rel=1e-5), name


def test_repeat_check_records_the_spread_of_each_figure(tmp_path):
    """Three runs in speed mode, the warm-up and repeats free to grow; every run gives the same checksum."""
    adaptive = ["timing.warmup_max=4", "timing.repeats_max=3"]
    ok(
        cpbench(
            "repeat_check=3",
            "topology.cp=2",
            "sweep.n_tokens=[16]",
            *QUIET,
            *adaptive,
            "output_dir=out",
            cwd=tmp_path,
            timeout=300,
        )
    )
    out = tmp_path / "out"
    check = json.loads((out / "run.json").read_text())["repeat_check"]
    assert check["runs"] == 3 and [p["N_tokens"] for p in check["points"]] == [16]
    (point,) = check["points"]
    walltimes = [
        results(f)["walltime_ms"].iloc[0] for f in (out, out / "repeat_check/run2", out / "repeat_check/run3")
    ]
    assert point["walltime_ms"]["min"] == min(walltimes) and point["walltime_ms"]["max"] == max(walltimes)
    assert check["tolerance"]["walltime_ms"] == point["walltime_ms"]["relative"] > 0
    assert point["checksum"]["spread"] == 0.0  # same seed, same layout: the same answer
    assert "## Same answer twice (repeat_check=3)" in (out / "cp_benchmark.md").read_text()
    row = results(out).iloc[0]
    assert 1 <= row["warmup_steps"] <= 4 and 2 <= row["repeats"] <= 3 and row["first_step_ms"] > 0


class PacedWorkload:
    """A step that sleeps: 20 ms every step on rank 0 (it settles at once); on rank 1 a warm-up that
    keeps getting faster (it never settles), then alternately 5 and 100 ms (its IQR stays wide)."""

    name = "paced"

    def __init__(self, rank: int):
        self.rank, self.steps = rank, 0

    def build_batch(self, shape, ctx) -> None:
        return None

    def run_step(self, model, batch, train: bool) -> torch.Tensor:
        self.steps += 1
        if self.rank == 0:
            time.sleep(0.02)
        else:  # its warm-up keeps getting faster (0.2 s / step), then its repeats alternate
            time.sleep(0.2 / self.steps if self.steps <= 5 else (0.005, 0.1)[self.steps % 2])
        return torch.ones(4)


def _paced_rank(rank: int, port: int, out: mp.Queue) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2")
    with rank_runtime(Topology.from_config("1d", 2, None), "gloo", 60, torch.float32, 0) as ctx:
        runner = StepRunner(PacedWorkload(rank), torch.nn.Identity(), False, ctx, 1e-4, 0.0)
        settings = PointSettings(TimingConfig(warmup=1, repeats=2, warmup_max=5, repeats_max=4))
        result = measure_point(runner, Shape(16, 1, 1), ctx, dist.group.WORLD, settings)
        out.put((rank, result, runner.workload.steps))


def test_ranks_take_the_same_steps_decided_on_the_slowest_rank():
    """Rank 0 alone would stop after 3 warm-up steps and 2 repeats; rank 1 sets the pace for both:
    every cap is reached, on both ranks, and no collective is left waiting."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ranks = rank_processes()
    out = ranks.Queue()
    procs = [ranks.Process(target=_paced_rank, args=(r, port, out)) for r in range(2)]
    for p in procs:
        p.start()
    try:
        got = dict((rank, (result, steps)) for rank, result, steps in (out.get(timeout=90) for _ in procs))
    except queue.Empty:
        pytest.fail("the two ranks did not report within 90 s")
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    for result, steps in got.values():
        assert (result.status, result.warmup_steps, result.repeats) == ("ok", 5, 4)
        assert steps == 9
        assert result.first_step_ms >= 20  # the slower of the ranks' first steps
