"""Inference chunking (the in-place, chunk-by-chunk form of every pair op) equals the plain form.

The fold workload with chunking against the plain one-rank model: the sampled positions, and in
training (where the recycling passes before the last run without autograd, hence chunked) the loss
and every parameter's gradient; at cp=1 in this process, and on real gloo ranks in 1d cp 2 and 2d
2x2 (the harness of test_pairformer_cp.py). The Pairformer stack alone the same way. The chunk
rule itself, and that a chunked trace holds no N^3 tensor, are pure functions checked here too.
"""

from __future__ import annotations

import traceback
from pathlib import Path

import pytest
import torch
from test_fold_cp import TINY, fold_failures, fold_run
from test_pairformer_cp import CFG, Checks, rank_context, report, spawn

from cpbench.core import RankContext, Shape, Topology
from cpbench.models.pairformer import PairformerConfig, PairformerStack, chunking
from cpbench.probe import predict
from cpbench.workloads.fold import FoldWorkload
from cpbench.workloads.pairformer import PairformerWorkload

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


def test_fold_chunked_equals_plain_one_rank(plain: Path) -> None:
    loss, grads, x = torch.load(plain)
    loss_c, grads_c, x_c = fold_run(_single(), SHAPE, CHUNK)[:3]
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
        failures = fold_failures(ctx, grid, SHAPE, CHUNK, reference=torch.load(plain))
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


def test_auto_chunks_shrink_with_the_transient_and_the_budget():
    per_row = chunking.AUTO_CEILING // 3  # three rows fit
    assert chunking.row_slices(8, chunking.AUTO, per_row) == [slice(0, 3), slice(3, 6), slice(6, 8)]
    one_row = [slice(i, i + 1) for i in range(8)]
    assert chunking.row_slices(8, chunking.AUTO, 10 * chunking.AUTO_CEILING) == one_row
    # A rank's budget bounds the transient: 1/64 of 1 GiB is 4 Mi float32 elements, an 80 GB card's
    # share stays at the ceiling.
    assert chunking.auto_elements(1.0) == 2**22 and chunking.auto_elements(78.0) == chunking.AUTO_CEILING
    with chunking.sized_for(1.0):
        assert chunking.row_slices(8, chunking.AUTO, 2**21) == [
            slice(0, 2),
            slice(2, 4),
            slice(4, 6),
            slice(6, 8),
        ]
    assert chunking.row_slices(8, chunking.AUTO, 2**21) == [slice(0, 8)]  # the ceiling again
    assert chunking.row_slices(8, None, per_row) == [slice(0, 8)]
    with chunking.peak_only():
        assert chunking.row_slices(8, 3, per_row) == [slice(0, 3), slice(3, 6)]
    with pytest.raises(ValueError, match="chunk_size='big'"):
        PairformerConfig(chunk_size="big")


def _peak(workload, n: int) -> float:
    return predict.trace_peak(workload, Topology("1d", 1, (1, 1)), Shape(n, 0, 1), False, torch.float32, 0, 0)


def test_chunked_inference_holds_no_n_cubed_tensor():
    """Pairformer inference traced on fake tensors: doubling N multiplies the plain form's peak by
    close to 8 (the triangle attention logits, N^3 H), the chunked form's by close to 4 (z)."""
    sizes = dict(c_s=16, c_z=16, n_blocks=1, tri_mul_hidden=16, tri_heads=4, tri_head_width=4, single_heads=2)
    plain, chunked = PairformerWorkload(**sizes), PairformerWorkload(**sizes, chunk_size=chunking.AUTO)
    growth_plain = _peak(plain, 512) / _peak(plain, 256)
    growth_chunked = _peak(chunked, 512) / _peak(chunked, 256)
    assert growth_plain > 6.5, growth_plain
    assert growth_chunked < 4.5, growth_chunked


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
    fast = predict.trace_peak(workload, topology, shape, train, dtype, 0, 0)
    every_pass = predict.TracedForm(workload)
    full = predict.trace_peak(workload, topology, shape, train, dtype, 0, 0, form=every_pass)
    assert fast == full
