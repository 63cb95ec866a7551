"""The MSA module in 1d and 2d context parallelism equals its one-rank self.

Each case spawns real CPU/gloo ranks (support/cp_ranks.py); every rank builds the
module with the same seed, runs it on the whole input with the one-rank layout and on its shard
with the CP layout, and compares its block of z, the input gradients (z block; s_inputs and
deletion_value summed over the row group, which replicates them) and the parameter gradients
summed over the world, with torch.testing.assert_close defaults. Ranks report failures as strings.
The module on one rank alone: tests/unit/test_fold_msa_one_rank.py.
"""

from __future__ import annotations

import traceback

import pytest
import torch
import torch.distributed as dist
from support.cp_ranks import rank_context, report, spawn
from support.msa_inputs import CFG, N, msa_inputs

from cpbench.distributed.comm import LEDGER, all_reduce_sum
from cpbench.distributed.grid import Grid
from cpbench.models.fold.msa import MSA_OP_LABELS, MSAConfig, MSAModule
from cpbench.models.pairformer import PairLayout


def _zeros_for_none(tensors, grads) -> list[torch.Tensor]:
    return [torch.zeros_like(t) if g is None else g for t, g in zip(tensors, grads, strict=True)]


class Checks:
    def __init__(self, ctx):
        self.ctx = ctx
        self.layout = PairLayout(Grid.from_context(ctx))
        self.rows, self.cols = ctx.block(N)
        self.failures: list[str] = []

    def check(self, what: str, actual, expected) -> None:
        try:
            torch.testing.assert_close(actual, expected)
        except AssertionError as err:
            self.failures.append(f"rank {self.ctx.rank} {self.ctx.coords}: {what}: {err}")

    def run(self, chunk: bool) -> list[str]:
        torch.manual_seed(1)
        self.compare("msa module", MSAModule(MSAConfig(**CFG)))
        if chunk:
            torch.manual_seed(2)
            self.compare(
                "msa module chunk_size=2 (inference)", MSAModule(MSAConfig(**CFG, chunk_size=2)), False
            )
        return self.failures

    def compare(self, what: str, module: MSAModule, train: bool = True) -> None:
        msa, s_inputs, z, mask, wz = msa_inputs()
        params = list(module.parameters())
        # One rank, the whole input.
        msa1 = {**msa, "deletion_value": msa["deletion_value"].clone().requires_grad_(train)}
        s1, z1 = s_inputs.clone().requires_grad_(train), z.clone().requires_grad_(train)
        with torch.set_grad_enabled(train):
            out = module(msa1, s1, z1, mask, PairLayout())
        if train:
            leaves = [msa1["deletion_value"], s1, z1, *params]
            ref = _zeros_for_none(leaves, torch.autograd.grad((out * wz).sum(), leaves, allow_unused=True))
        # My shard: the MSA columns and s_inputs of my row tokens, my z block.
        msa_b = {k: v[:, self.rows].clone() for k, v in msa.items()}
        msa_b["deletion_value"].requires_grad_(train)
        sb, zb = s_inputs[self.rows].clone().requires_grad_(train), z[self.rows, self.cols].clone()
        zb.requires_grad_(train)
        LEDGER.reset()
        with torch.set_grad_enabled(train):
            cp_out = module(msa_b, sb, zb, mask, self.layout)
        if train:
            leaves = [msa_b["deletion_value"], sb, zb, *params]
            loss = (cp_out * wz[self.rows, self.cols]).sum()
            grads = _zeros_for_none(leaves, torch.autograd.grad(loss, leaves, allow_unused=True))
        self.check(f"{what}: z", cp_out, out[self.rows, self.cols])
        labels = {label.removesuffix(".bwd") for label in LEDGER.bytes_sent}
        if self.ctx.world_size > 1 and not labels <= set(MSA_OP_LABELS):
            self.failures.append(f"rank {self.ctx.rank}: collectives outside the op labels: {labels}")
        if not train:
            return
        # s_inputs and the MSA features are replicated over the row group: each copy's gradient is
        # the share of its own z block, and the shares add up to the whole.
        row_group = self.ctx.row_peers
        self.check(f"{what}: grad deletion_value", all_reduce_sum(grads[0], row_group), ref[0][:, self.rows])
        self.check(f"{what}: grad s_inputs", all_reduce_sum(grads[1], row_group), ref[1][self.rows])
        self.check(f"{what}: grad z", grads[2], ref[2][self.rows, self.cols])
        world = dist.group.WORLD if self.ctx.world_size > 1 else None
        for (name, _), g, r in zip(module.named_parameters(), grads[3:], ref[3:], strict=True):
            self.check(f"{what}: grad {name}", all_reduce_sum(g, world), r)


def _rank_main(rank: int, world: int, tmp: str, kind: str, grid: tuple[int, int], chunk: bool) -> None:
    failures: list[str] = []
    try:
        failures = Checks(rank_context(rank, world, tmp, kind, grid)).run(chunk)
    except Exception:
        failures.append(f"rank {rank}: {traceback.format_exc()}")
    finally:
        report(tmp, rank, failures)


CASES = [
    ("1d", 2, (2, 1), False),
    ("1d", 4, (4, 1), True),
    ("2d", 4, (2, 2), True),
    ("2d", 2, (1, 2), False),
]


@pytest.mark.parametrize(
    ("kind", "cp", "grid", "chunk"), CASES, ids=[f"{k}-{g[0]}x{g[1]}" for k, _, g, _ in CASES]
)
def test_cp_equals_one_rank(kind: str, cp: int, grid: tuple[int, int], chunk: bool) -> None:
    reports = spawn(_rank_main, cp, kind, grid, chunk, timeout=120)
    failures = [line for report in reports for line in report]
    assert not failures, "\n".join(failures)
