"""Inference chunking (the in-place, chunk-by-chunk form of every pair op) equals the plain form.

The fold workload with chunking, with the reference kernels and the fused sdpa, against the plain
one-rank model with the reference kernels: the sampled positions, and in
training (where the recycling passes before the last run without autograd, hence chunked) the loss
and every parameter's gradient; at cp=1 in this process, and on real gloo ranks in 1d cp 2 and 2d
2x2 (support/cp_ranks.py). The Pairformer stack alone the same way. The chunk rule itself, and that a
chunked trace holds no N^3 tensor, are pure functions: tests/unit/test_fold_chunk_rule.py.
"""

from __future__ import annotations

import traceback
from pathlib import Path

import pytest
import torch
from support.cp_ranks import rank_context, report, spawn
from support.pairformer_checks import CFG, Checks
from support.tiny_fold import TINY, fold_failures, fold_run

from cpbench.core import RankContext, Shape, Topology
from cpbench.models.pairformer import PairformerConfig, PairformerStack
from cpbench.models.pairformer.kernels import KERNELS
from cpbench.probe import trace
from cpbench.probe.trace import TraceSpec
from cpbench.workloads.fold import FoldWorkload

SHAPE = Shape(11, 120, 3)
CHUNK = 3  # rows per chunk: 2 to 4 chunks per op on every layout (a ragged last one at cp=1)


def _single() -> RankContext:
    return RankContext(0, 1, torch.device("cpu"), None, Topology("1d", 1, (1, 1)), torch.float32, 0, (0, 0),
                       None, None)  # fmt: skip


@pytest.fixture(scope="module")
def plain(tmp_path_factory) -> Path:
    """The plain one-rank fold model's loss, gradients and sampled positions, computed once (one
    torch thread, as on the ranks) for every case, in a file the ranks read."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        path = tmp_path_factory.mktemp("plain") / "reference.pt"
        torch.save(fold_run(_single(), SHAPE)[:3], path)
    finally:
        torch.set_num_threads(threads)
    return path


@pytest.mark.parametrize("kernels", KERNELS[:2])
def test_fold_chunked_equals_plain_one_rank(plain: Path, kernels: str) -> None:
    loss, grads, x = torch.load(plain)
    loss_c, grads_c, x_c = fold_run(_single(), SHAPE, CHUNK, kernels)[:3]
    torch.testing.assert_close(x_c, x)
    torch.testing.assert_close(loss_c, loss)
    for g_c, g in zip(grads_c, grads, strict=True):
        torch.testing.assert_close(g_c, g)


def _cp_rank(rank: int, world: int, tmp: str, kind: str, grid: tuple[int, int], plain: str) -> None:
    """On each rank: the chunked fold model on its shard against the plain one-rank model (its run
    read from `plain`), then the chunked Pairformer stack against the plain one (inference)."""
    failures: list[str] = []
    try:
        ctx = rank_context(rank, world, tmp, kind, grid)
        reference = torch.load(plain)
        for kernels in KERNELS[:2]:  # the reference and sdpa (cueq: CUDA alone)
            failures += fold_failures(ctx, grid, SHAPE, CHUNK, reference=reference, kernels=kernels)
        checks = Checks(ctx)
        torch.manual_seed(3)
        plain = PairformerStack(PairformerConfig(**CFG))
        chunked = PairformerStack(PairformerConfig(**CFG, chunk_size=CHUNK))
        chunked.load_state_dict(plain.state_dict())
        checks.compare("stack chunked vs plain", plain, "stack", train=False, cp_module=chunked)
        failures.extend(checks.failures)
    except Exception:
        failures.append(f"rank {rank}: {traceback.format_exc()}")
    finally:
        report(tmp, rank, failures)


@pytest.mark.parametrize("kind, grid", [("1d", (2, 1)), ("2d", (2, 2))], ids=["1d-2", "2d-2x2"])
def test_chunked_cp_equals_plain_one_rank(kind: str, grid: tuple[int, int], plain: Path) -> None:
    reports = spawn(_cp_rank, grid[0] * grid[1], kind, grid, str(plain), timeout=180)
    failures = [line for r in reports for line in r]
    assert not failures, "\n".join(failures)


# Two passes of each loop show a cut pass (the second repeats the first's peak, or the trace misses it),
# but the MSA module keeps its first and last block, and training its last two recycling passes: three.
LOOPS = dict(TINY, n_blocks=2, msa_blocks=3, input_atom_blocks=2, atom_blocks=2, token_blocks=2, n_cycles=2,
             sampling={"steps": 2})  # fmt: skip


@pytest.mark.parametrize(
    ("train", "chunk", "dtype"),
    [(False, CHUNK, torch.float32), (False, CHUNK, torch.bfloat16), (False, None, torch.bfloat16),
     (True, CHUNK, torch.float32)],
    ids=["inference-chunked-fp32", "inference-chunked-bf16", "inference-plain-bf16", "training-fp32"],
)  # fmt: skip
def test_fast_estimate_equals_the_full_trace(train: bool, chunk, dtype) -> None:
    """The estimate traces the workload's `peak_form` (loops cut to the passes that set the peak,
    chunk loops two deep) and adds the weights it left out: the same bytes as tracing every pass."""
    workload = FoldWorkload(**LOOPS | {"n_cycles": 3 if train else 2}, chunk_size=chunk)
    topology, shape = Topology("1d", 1, (1, 1)), Shape(8, 72, 3)  # CHUNK: 3 chunks per pair op
    spec = TraceSpec(train, dtype)
    fast = trace.trace_peak(workload, topology, shape, spec, 0)
    full = trace.trace_peak(workload, topology, shape, spec, 0, form=trace.TracedForm(workload))
    assert fast == full
