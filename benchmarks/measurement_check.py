"""cpbench's walltime and peak against independent references, on one rank: a GPU where one is
present (NCCL), else the CPU (gloo).

    python benchmarks/measurement_check.py [--n-tokens 256] [--rounds 40] [--buffer-mib 512] [--backend gloo]

Timer: the same one-rank axial_mix step timed by cpbench (`measure_point`, one repeat) and by
torch.utils.benchmark.Timer (with cpbench's thread count; Timer's default is one thread), interleaved
round by round; the two agree when their medians differ by no more than the sum of their IQRs.

Peak: a step that allocates a known buffer and keeps it as its output; cpbench's peak over its reset
baseline against the buffer's size, and on CPU against tracemalloc's peak (the buffer is numpy's, so
tracemalloc sees it), on CUDA against the caching allocator's reserved peak.
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

    def __init__(self, device: torch.device):
        self.device = device

    def build_model(self, ctx: RankContext) -> torch.nn.Module:
        return torch.nn.Identity()

    def build_batch(self, shape: Shape, ctx: RankContext) -> int:
        return shape.n_tokens  # bytes

    def run_step(self, model: torch.nn.Module, batch: int, train: bool) -> torch.Tensor:
        if self.device.type == "cuda":
            return torch.ones(batch, dtype=torch.uint8, device=self.device)
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
        f"timer on {ctx.device.type}, axial_mix inference N={n_tokens}, {torch.get_num_threads()} threads, "
        f"{rounds} rounds: "
        f"cpbench median {ours_ms:.2f} ms (IQR {ours_iqr:.2f}), Timer median {timer_ms:.2f} ms "
        f"(IQR {timer_iqr:.2f}); difference {diff:.2f} ms ({diff / timer_ms:.1%}), spread {spread:.2f} ms: "
        f"{'agree' if diff <= spread else 'DISAGREE'}"
    )


def check_peak(ctx: RankContext, buffer_mib: int) -> None:
    size, cuda = buffer_mib * MIB, ctx.device.type == "cuda"
    runner = StepRunner(BufferWorkload(ctx.device), torch.nn.Identity(), False, ctx, 1e-4, 0.0)
    release(ctx.device)
    reset_peak(ctx.device)
    baseline_gib = read_peak_gib(ctx.device)
    if cuda:
        torch.cuda.reset_peak_memory_stats(ctx.device)
    else:
        tracemalloc.start()
    result = measure_point(runner, Shape(size, 1, 1), ctx, dist.group.WORLD, PointSettings(0, 3))
    if cuda:
        reference = f"CUDA reserved peak {torch.cuda.max_memory_reserved(ctx.device) / MIB:.1f} MiB"
    else:
        reference = f"tracemalloc {tracemalloc.get_traced_memory()[1] / MIB:.1f} MiB"
        tracemalloc.stop()
    ours = (result.peak_mem_gib - baseline_gib) * 2**30
    verdict = "agree" if abs(ours - size) <= PEAK_TOLERANCE_MIB * MIB else "DISAGREE"
    print(
        f"peak on {ctx.device.type}, a {buffer_mib} MiB buffer per step: cpbench {ours / MIB:.1f} MiB over "
        f"its baseline, {reference}; cpbench - buffer {(ours - size) / MIB:+.1f} MiB "
        f"(tolerance {PEAK_TOLERANCE_MIB} MiB): {verdict}"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n-tokens", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--buffer-mib", type=int, default=512)
    parser.add_argument("--backend", choices=["gloo", "nccl"], default=None, help="default: nccl on a GPU")
    args = parser.parse_args()
    with rank_runtime(Topology("1d", 1, (1, 1)), args.backend, 60, torch.float32, 0) as ctx:
        check_timer(ctx, args.n_tokens, args.rounds)
        check_peak(ctx, args.buffer_mib)


if __name__ == "__main__":
    main()
