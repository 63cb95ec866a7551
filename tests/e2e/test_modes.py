"""Benchmark modes (speed, accuracy) and the same-answer-twice check (repeat_check), through the real
entry point (the pure rules they rest on: tests/unit/test_modes_checks.py)."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import queue
import socket
import time

import pytest
import torch
import torch.distributed as dist
from support.processes import cpbench, ok, rank_processes, results

from cpbench.core import Shape, Topology
from cpbench.measure.point import PointSettings, measure_point
from cpbench.measure.step import StepRunner
from cpbench.results.folder import RunFolder
from cpbench.runtime.rank import rank_runtime
from cpbench.settings.schema import TimingConfig

QUIET = ["log.progress=false", "probe.enabled=false", "timing.warmup=1", "timing.repeats=2"]
ACCURACY = ["mode=accuracy", "workflow=training", *QUIET]


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
