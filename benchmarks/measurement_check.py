"""cpbench's walltime and peak against independent references, on one CPU rank.

    python benchmarks/measurement_check.py [--n-tokens 256] [--rounds 40] [--buffer-mib 512]

Timer: the same one-rank axial_mix step timed by cpbench (`measure_point`, one repeat) and by
torch.utils.benchmark.Timer (with cpbench's thread count; Timer's default is one thread), interleaved
round by round; the two agree when their medians differ by no more than the sum of their IQRs.

Peak: a step that allocates a known buffer (numpy, so tracemalloc sees it) and keeps it as its
output; cpbench's peak over its reset baseline against the buffer's size and tracemalloc's peak.
"""

from __future__ import annotations

import argparse
import tracemalloc

import numpy as np
import torch
import torch.distributed as dist
from torch.utils.benchmark import Timer

from cpbench.core import RankContext, Shape, Topology
from cpbench.measure.memory import read_peak_gib, release, reset_peak
from cpbench.measure.point import PointSettings, measure_point
from cpbench.measure.step import StepRunner
from cpbench.runtime.rank import rank_runtime
from cpbench.workloads.axial_mix import AxialMixWorkload

MIB = 2**20
PEAK_TOLERANCE_MIB = 32  # what else becomes resident during the step: interpreter, allocator arenas, gloo


class BufferWorkload:
    """Each step allocates and touches `batch` bytes and returns them: the step's peak is known."""

    name = "buffer"

    def build_model(self, ctx: RankContext) -> torch.nn.Module:
        return torch.nn.Identity()

    def build_batch(self, shape: Shape, ctx: RankContext) -> int:
        return shape.n_tokens  # bytes

    def run_step(self, model: torch.nn.Module, batch: int, train: bool) -> torch.Tensor:
        return torch.from_numpy(np.ones(batch, dtype=np.uint8))


def median_iqr_ms(seconds: list[float]) -> tuple[float, float]:
    q1, median, q3 = np.percentile(np.array(seconds) * 1e3, [25, 50, 75])
    return float(median), float(q3 - q1)


def check_timer(ctx: RankContext, n_tokens: int, rounds: int) -> None:
    """Interleaved, one step each per round (so that both see the same load on a shared machine):
    cpbench's `measure_point` of one repeat and one `Timer.timeit(1)`."""
    workload = AxialMixWorkload()
    runner = StepRunner(workload, workload.build_model(ctx), False, ctx, 1e-4, 0.0)
    shape = Shape(n_tokens, 9 * n_tokens, 16)
    batch = workload.build_batch(shape, ctx)
    timer = Timer(
        "runner(batch)", globals={"runner": runner, "batch": batch}, num_threads=torch.get_num_threads()
    )
    timer.timeit(3)  # warm-up
    ours, theirs = [], []
    one_step = PointSettings(warmup=0, repeats=1)
    for _ in range(rounds):
        ours.append(measure_point(runner, shape, ctx, dist.group.WORLD, one_step).walltime_ms / 1e3)
        theirs.append(timer.timeit(1).median)
    (ours_ms, ours_iqr), (timer_ms, timer_iqr) = median_iqr_ms(ours), median_iqr_ms(theirs)
    diff, spread = abs(ours_ms - timer_ms), ours_iqr + timer_iqr
    print(
        f"timer, axial_mix inference N={n_tokens}, {torch.get_num_threads()} threads, {rounds} rounds: "
        f"cpbench median {ours_ms:.2f} ms (IQR {ours_iqr:.2f}), Timer median {timer_ms:.2f} ms "
        f"(IQR {timer_iqr:.2f}); difference {diff:.2f} ms ({diff / timer_ms:.1%}), spread {spread:.2f} ms: "
        f"{'agree' if diff <= spread else 'DISAGREE'}"
    )


def check_peak(ctx: RankContext, buffer_mib: int) -> None:
    size = buffer_mib * MIB
    runner = StepRunner(BufferWorkload(), torch.nn.Identity(), False, ctx, 1e-4, 0.0)
    release(ctx.device)
    reset_peak(ctx.device)
    baseline_gib = read_peak_gib(ctx.device)
    tracemalloc.start()
    result = measure_point(runner, Shape(size, 1, 1), ctx, dist.group.WORLD, PointSettings(0, 3))
    _, traced = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    ours = (result.peak_mem_gib - baseline_gib) * 2**30
    verdict = "agree" if abs(ours - size) <= PEAK_TOLERANCE_MIB * MIB else "DISAGREE"
    print(
        f"peak, a {buffer_mib} MiB buffer per step: cpbench {ours / MIB:.1f} MiB over its baseline, "
        f"tracemalloc {traced / MIB:.1f} MiB; cpbench - buffer {(ours - size) / MIB:+.1f} MiB "
        f"(tolerance {PEAK_TOLERANCE_MIB} MiB): {verdict}"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n-tokens", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--buffer-mib", type=int, default=512)
    args = parser.parse_args()
    with rank_runtime(Topology("1d", 1, (1, 1)), "gloo", 60, torch.float32, 0) as ctx:
        check_timer(ctx, args.n_tokens, args.rounds)
        check_peak(ctx, args.buffer_mib)


if __name__ == "__main__":
    main()
