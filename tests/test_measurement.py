"""The numbers of a results row pinned: the walltime statistics against fixed per-rank timings, the
per-point peak, and the cross-rank agreement on "does not fit"."""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import subprocess
import sys

import pandas as pd
import pytest
import torch
import torch.distributed as dist
from conftest import FAST, TIMING, cpbench, ok, rank_processes, results

from cpbench.core import Shape, Topology
from cpbench.measure.memory import read_peak_gib, release, reset_peak
from cpbench.measure.point import PointSettings, RankSteps, _summarise, agree_fits, measure_point
from cpbench.measure.stats import PointTimes, RepeatTiming, comm_mib_per_step, median_iqr, slowest
from cpbench.measure.step import StepRunner
from cpbench.runtime.rank import rank_runtime
from cpbench.settings.schema import TimingConfig

MS = 1e-3


def timings(total_ms: list[float], comm_ms: list[float]) -> list[RepeatTiming]:
    """Repeats whose phases split the total 1/2 forward, 1/4 backward, 1/4 optimizer."""
    return [
        RepeatTiming(t * MS, t / 2 * MS, t / 4 * MS, t / 4 * MS, c * MS)
        for t, c in zip(total_ms, comm_ms, strict=True)
    ]


# Rank 0 is fastest in two repeats and much slower in the third. Per repeat the slowest rank is
# [2, 2, 10] ms: median 2 and IQR 4 (inclusive quartiles 2 and 6). The fastest rank would give
# [1, 1, 2] (median 1); the mean of the slowest 4.67, of all six values 3.
RANKS = [timings([1, 1, 10], comm_ms=[0.5, 0.5, 5]), timings([2, 2, 2], comm_ms=[1, 1, 1])]
EXPECTED = PointTimes(
    walltime_ms=2, walltime_iqr_ms=4, forward_ms=1, backward_ms=0.5, optimizer_ms=0.5, comm_ms=1
)


def test_slowest_takes_the_slowest_rank_per_repeat_and_field():
    assert [r.total / MS for r in slowest(RANKS)] == pytest.approx([2, 2, 10])
    assert [r.comm / MS for r in slowest(RANKS)] == pytest.approx([1, 1, 5])


def test_median_and_iqr_of_the_slowest_rank():
    assert median_iqr([2, 2, 10]) == pytest.approx((2, 4))
    assert median_iqr([3, 1, 4, 1, 5]) == pytest.approx((3, 3))  # quartiles 1 and 4
    assert median_iqr([7]) == (7, 0)


def test_point_times_across_ranks():
    times = PointTimes.across_ranks(RANKS)
    for name, value in vars(EXPECTED).items():
        assert getattr(times, name) == pytest.approx(value), name


def test_comm_bytes_are_the_largest_over_ranks():
    assert comm_mib_per_step([2**20, 3 * 2**20, 2 * 2**20]) == pytest.approx(3)


def _summarise_on_rank(rank: int, store: str, out: mp.Queue) -> None:
    dist.init_process_group("gloo", init_method=store, rank=rank, world_size=2)
    try:
        ops = [
            {"op": "a2a", "calls": 4, "fwd_bytes": 2**20 * (rank + 1), "bwd_bytes": 0, "seconds": 0.1 * rank}
        ]
        first = [30.0, 40.0][rank] * MS
        timed = RankSteps(RANKS[rank], 1.5 * (rank + 1), 2**20 * [4, 6][rank], ops, 0.0, first, 1, None)
        result = _summarise(timed, peak=0.5, control=dist.group.WORLD)
        # The agreement: a point fits only when it fit on every rank (rank 1 did not, then both did).
        agreed = (agree_fits(rank == 0, dist.group.WORLD), agree_fits(True, dist.group.WORLD, wait_s=30))
        out.put((rank, (result, agreed)))
    finally:
        dist.destroy_process_group()


def test_summarise_reduces_every_rank_through_the_pure_functions(tmp_path):
    """The same timings through `_summarise` in a real two-rank gloo group give the same figures; and
    `agree_fits` there says no when one rank did not fit."""
    ranks = rank_processes()
    out = ranks.Queue()
    store = f"file://{tmp_path / 'store'}"
    procs = [ranks.Process(target=_summarise_on_rank, args=(r, store, out)) for r in range(2)]
    for p in procs:
        p.start()
    try:
        got = dict(out.get(timeout=60) for _ in procs)
    except queue.Empty:
        pytest.fail("the two ranks did not report within 60 s")
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    for result, agreed in got.values():  # every rank reports the same row and the same agreement
        assert agreed == (False, True)
        assert result.status == "ok"
        for name, value in vars(EXPECTED).items():
            assert getattr(result, name) == pytest.approx(value), name
        assert result.comm_mib_per_step == pytest.approx(6)
        assert [float(v) for v in result.repeats_ms.split()] == pytest.approx([2, 2, 10])
        assert result.checksum == pytest.approx(4.5)
        assert result.repeats == 3 and result.warmup_steps == 1
        assert result.first_step_ms == pytest.approx(40)  # the slowest rank's first step
        assert result.comm_ops == [
            pytest.approx(
                {"op": "a2a", "calls": 4 / 3, "fwd_bytes": 2 * 2**20 / 3, "bwd_bytes": 0, "seconds": 0.1 / 3}
            )
        ]


BUFFER_GIB = 0.5


def _allocate_and_free(device: torch.device) -> None:
    buffer = torch.ones(int(BUFFER_GIB * 2**30), dtype=torch.uint8, device=device)  # touched: resident
    del buffer


@pytest.mark.parametrize(
    "device",
    [
        "cpu",
        pytest.param(
            "cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
        ),
    ],
)
def test_peak_sees_a_freed_buffer_until_it_is_reset(device):
    device = torch.device(device)
    release(device)
    reset_peak(device)
    before = read_peak_gib(device)
    _allocate_and_free(device)
    release(device)
    assert read_peak_gib(device) - before == pytest.approx(BUFFER_GIB, abs=0.05)  # freed, still the peak
    reset_peak(device)
    assert read_peak_gib(device) - before == pytest.approx(0, abs=0.05)  # the next point starts clean


class OnesWorkload:
    """Each step returns a fresh 256 MiB float32 tensor of ones: the step's peak is known."""

    name = "ones"

    def build_batch(self, shape: Shape, ctx) -> None:
        return None

    def run_step(self, model: torch.nn.Module, batch: None, train: bool) -> torch.Tensor:
        return torch.ones(2**26)


def test_peak_is_the_steps_and_the_checksum_is_exact():
    """The output's float64 checksum is no part of the peak (a float64 copy would add 0.5 GiB)."""
    with rank_runtime(Topology("1d", 1, (1, 1)), "gloo", 60, torch.float32, 0) as ctx:
        runner = StepRunner(OnesWorkload(), torch.nn.Identity(), False, ctx, 1e-4, 0.0)
        release(ctx.device)
        reset_peak(ctx.device)
        baseline = read_peak_gib(ctx.device)
        result = measure_point(
            runner, Shape(64, 1, 1), ctx, dist.group.WORLD, PointSettings(TimingConfig(1, 2, 1, 2))
        )
    # Measured 0.29-0.31 GiB: the output and what else the first steps make resident (tens of MiB).
    assert result.peak_mem_gib - baseline == pytest.approx(0.25, abs=0.1)
    assert result.checksum == 2**26


def test_each_point_has_its_own_peak(tmp_path):
    """A large N then a small one in one run: the small one does not inherit the large one's peak."""
    out = tmp_path / "out"
    ok(cpbench("topology.cp=1", "sweep.n_tokens=[768,64]", *FAST, f"output_dir={out}", cwd=tmp_path))
    peak = results(out).set_index("N_tokens")["peak_mem_gib"]
    assert peak[768] - peak[64] > 0.2  # measured 0.70 and 0.28 GiB


AT_N = 64
ONE_RANK = [
    "topology.cp=2",
    "sweep.n_tokens=[32,64]",
    "fault.rank=1",
    f"fault.at_n={AT_N}",
    "fault.where=step",
]


def test_budget_overrun_on_one_rank_is_does_not_fit_for_all(tmp_path):
    """Rank 1 alone goes over its budget with every allocation served: both ranks agree it does not
    fit, in process (no restart), and the row names the rank and the reason."""
    out = tmp_path / "out"
    args = [*ONE_RANK, "fault.kind=overrun", "memory.cpu_budget_gib=0.5", *FAST, f"output_dir={out}"]
    proc = ok(cpbench(*args, cwd=tmp_path, timeout=120))
    rows = results(out).set_index("N_tokens")
    assert rows.loc[32, "status"] == "ok" and rows.loc[32, "walltime_ms"] > 0
    assert rows.loc[AT_N, "status"] == "oom"
    assert rows.loc[AT_N, "error"].startswith("rank 1: BudgetExceeded")
    assert rows.loc[AT_N, "peak_mem_gib"] > 1  # the largest over ranks: rank 1's
    assert "relaunching" not in proc.stderr


def test_budget_overrun_on_one_rank_bounds_the_probe(tmp_path):
    out = tmp_path / "out"
    probe = ["sweep.n_tokens=[16]", "probe.enabled=true", "probe.start=64", "probe.granularity=64"]
    fault = ["fault.rank=1", "fault.at_n=256", "fault.where=step", "fault.kind=overrun"]
    args = ["topology.cp=2", *probe, "probe.measure_at_max=false", "memory.cpu_budget_gib=0.5", *fault]
    args += [*TIMING, f"output_dir={out}"]
    proc = ok(cpbench(*args, cwd=tmp_path, timeout=180))
    frame = results(out)
    row = frame[frame["kind"] == "max-fit"].iloc[0]
    assert (row["N_tokens"], row["oom_at"]) == (192, 256)
    assert "relaunching" not in proc.stderr


def test_oom_inside_the_step_on_one_rank_is_does_not_fit_for_all(tmp_path):
    """Rank 1 runs out of memory between two collectives: its peer is stuck in the next one, so the
    job ends and resumes, and the point is recorded as not fitting (the rank's note), never as measured."""
    out = tmp_path / "out"
    args = [*ONE_RANK, "fault.kind=oom", "dist.agree_timeout_s=2", *FAST, f"output_dir={out}"]
    proc = ok(cpbench(*args, cwd=tmp_path, timeout=180))
    rows = results(out).set_index("N_tokens")
    assert rows.loc[32, "status"] == "ok"
    assert rows.loc[AT_N, "status"] == "oom" and pd.isna(rows.loc[AT_N, "walltime_ms"])
    assert f"rank 1: N={AT_N} does not fit: out of memory alone" in proc.stderr
    assert "crashed" not in proc.stderr  # running out of memory is a finding, not a crash


def _flight_recorder_in_rank(env: dict) -> str:
    code = (
        "import os, torch; from cpbench.core import Topology; from cpbench.runtime.rank import rank_runtime\n"
        "with rank_runtime(Topology('1d', 1, (1, 1)), 'gloo', 60, torch.float32, 0):\n"
        "    print(os.environ.get('TORCH_FR_BUFFER_SIZE'))"
    )
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    return run.stdout.strip()


def test_a_cpu_rank_keeps_no_flight_record_unless_the_environment_asks():
    """torch's flight recorder holds its last collectives in the rank's memory, which a CPU cap counts
    (7.0 MiB of peak over 30 cp=2 steps with it, 1.8 MiB without): off on CPU ranks, kept where set."""
    env = {k: v for k, v in os.environ.items() if k != "TORCH_FR_BUFFER_SIZE"}
    assert _flight_recorder_in_rank(env) == "0"
    assert _flight_recorder_in_rank({**env, "TORCH_FR_BUFFER_SIZE": "2000"}) == "2000"
