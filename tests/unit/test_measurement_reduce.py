"""The numbers of a results row pinned, in-process: the walltime statistics against fixed per-rank
timings (support/rank_timings.py), the largest comm bytes over ranks, and the per-step peak."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from support.rank_timings import EXPECTED, MS, RANKS

from cpbench.core import Shape, Topology
from cpbench.measure.memory import read_peak_gib, release, reset_peak
from cpbench.measure.point import PointSettings, measure_point
from cpbench.measure.stats import PointTimes, comm_mib_per_step, median_iqr, slowest
from cpbench.measure.step import StepRunner
from cpbench.runtime.rank import rank_runtime
from cpbench.settings.schema import TimingConfig


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
