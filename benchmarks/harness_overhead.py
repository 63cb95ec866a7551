"""The harness's own time inside the timed region (outside run_step), against a step at the default size.

    python benchmarks/harness_overhead.py [--n-tokens 256] [--workflow inference|training]

The overhead is the StepRunner's time around a run_step that does nothing; the step is the default
workload's at N tokens, on one rank. Prints both medians and their ratio.
"""

from __future__ import annotations

import argparse
import statistics

import torch

from cpbench.core import Shape, Topology
from cpbench.measure.step import StepRunner
from cpbench.runtime.rank import rank_runtime
from cpbench.workloads.axial_mix import AxialMixWorkload


class NullWorkload:
    name = "null"

    def run_step(self, model, batch, train):
        return batch


def median_step_ms(runner: StepRunner, batch, repeats: int) -> float:
    return statistics.median(sum(runner(batch)[1]) for _ in range(repeats)) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n-tokens", type=int, default=256)
    parser.add_argument("--workflow", choices=["inference", "training"], default="inference")
    args = parser.parse_args()
    train = args.workflow == "training"
    with rank_runtime(Topology("1d", 1, (1, 1)), "gloo", 60, torch.float32, 0) as ctx:
        workload = AxialMixWorkload()
        model = workload.build_model(ctx)
        batch = workload.build_batch(Shape(args.n_tokens, 9 * args.n_tokens, 16), ctx)
        step = median_step_ms(StepRunner(workload, model, train, ctx, 1e-4, 0.0), batch, 20)
        null_model = torch.nn.Linear(1, 1)
        loss = torch.zeros((), requires_grad=True)
        null = StepRunner(NullWorkload(), null_model, train, ctx, 1e-4, 0.0)
        overhead = median_step_ms(null, loss if train else batch.z, 2000)
    print(
        f"{args.workflow} N={args.n_tokens}: step {step:.3f} ms, harness {overhead * 1e3:.1f} us, "
        f"ratio {overhead / step:.4%}"
    )


if __name__ == "__main__":
    main()
