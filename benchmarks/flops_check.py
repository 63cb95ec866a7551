"""The model-FLOP counter and the CPU peak against independent references (docs/measurement.md).

    python benchmarks/flops_check.py [--n-tokens 256] [--gemm 512] [--rounds 5] [--fold-n 2048]

Counter: one Pairformer block at AlphaFold3's sizes (c_z 128, c_s 384, 4 x 32 triangle heads, 16
single heads), forward at N tokens on one rank, counted on fake tensors, against the analytic count
of its matmuls written down in docs/pairformer.md (tests/unit/test_flops.py holds the same formula).

Time: counting one step of `workload=fold` (AF3's sizes, 200 sampling steps, inference) at
--fold-n tokens on one rank (cp=1), as a run's `measure.count_flops` does (`count_step`: each
identical-pass loop counted at 1 and 2 passes and extrapolated); 0 skips it.

Peak: cpbench's CPU GEMM rate (`record/peaks.py` `measure_gemm`, the one run.json records: the
fastest of its products) against the fastest of torch.utils.benchmark.Timer's single products for
the same n^3 product on the same threads, interleaved round by round (ten of each a round).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from torch.utils.benchmark import Timer

from cpbench.core import Topology
from cpbench.measure.flops import FlopCount, count_step
from cpbench.models.pairformer import PairformerConfig, PairLayout
from cpbench.models.pairformer.block import PairformerBlock
from cpbench.probe.trace import fake_rank
from cpbench.record.peaks import measure_gemm
from cpbench.sweep import resolve_shape

TESTS = Path(__file__).resolve().parent.parent / "tests"
sys.path[:0] = [str(TESTS), str(TESTS / "unit")]  # tests/support/ as the tests import it, and test_flops
from support.flops_expected import builtin  # noqa: E402  a workload as `workload=<name>` composes it
from test_flops import pairformer_block_flops  # noqa: E402  the formula the test pins


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-tokens", type=int, default=256)
    parser.add_argument("--gemm", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--fold-n", type=int, default=2048)
    args = parser.parse_args()

    if args.fold_n:
        workload, shape_settings = builtin("fold", "workload.sampling.steps=200")
        shape = resolve_shape(shape_settings, n_tokens=args.fold_n)
        with fake_rank(Topology.from_config("1d", 1, None), 0, torch.float32, 0) as ctx:
            model, start = workload.build_model(ctx), time.perf_counter()
            step = count_step(workload, model, shape, ctx, train=False, seed=0)
            took = time.perf_counter() - start
        print(f"workload=fold, inference, {shape}, 200 sampling steps, cp=1: {step.flops / 1e12:.6g} TFLOP "
              f"counted in {took:.1f} s on {torch.get_num_threads()} thread(s)")  # fmt: skip

    cfg, n = PairformerConfig(n_blocks=1), args.n_tokens
    with FlopCount() as count, torch.no_grad():
        PairformerBlock(cfg)(torch.randn(n, cfg.c_s), torch.randn(n, n, cfg.c_z), torch.ones(n), PairLayout())
    counted, analytic = count.result().flops, pairformer_block_flops(n, cfg)
    print(f"Pairformer block, N={n}: counted {counted:,} FLOPs, analytic {analytic:,} "
          f"({counted / analytic - 1:+.4%}); by op: {count.result().by_op}")  # fmt: skip

    g = args.gemm
    a, b, out = torch.randn(g, g), torch.randn(g, g), torch.empty(g, g)
    timer = Timer("torch.mm(a, b, out=out)", globals=dict(torch=torch, a=a, b=b, out=out),
                  num_threads=torch.get_num_threads())  # fmt: skip
    ours, theirs = [], []
    for _ in range(args.rounds):
        ours.append(measure_gemm(g, torch.float32).tflops)
        theirs.append(2 * g**3 / min(timer.timeit(1).times[0] for _ in range(10)) / 1e12)
    mine, ref = max(ours), max(theirs)
    print(f"CPU GEMM {g}^3 float32 on {torch.get_num_threads()} thread(s): cpbench {mine * 1e3:.2f} GFLOP/s, "
          f"torch.utils.benchmark {ref * 1e3:.2f} GFLOP/s ({mine / ref - 1:+.1%}); rounds: "
          f"{[round(x * 1e3, 2) for x in ours]} vs {[round(x * 1e3, 2) for x in theirs]}")  # fmt: skip


if __name__ == "__main__":
    main()
