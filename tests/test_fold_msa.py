"""The MSA module in 1d and 2d context parallelism equals its one-rank self.

Each case spawns real CPU/gloo ranks (the harness of test_pairformer_cp); every rank builds the
module with the same seed, runs it on the whole input with the one-rank layout and on its shard
with the CP layout, and compares its block of z, the input gradients (z block; s_inputs and
deletion_value summed over the row group, which replicates them) and the parameter gradients
summed over the world, with torch.testing.assert_close defaults. Ranks report failures as strings.
"""

from __future__ import annotations

import traceback

import pytest
import torch
import torch.distributed as dist
from test_pairformer_cp import rank_context, report, spawn

from cpbench.distributed.comm import LEDGER, all_reduce_sum
from cpbench.distributed.grid import Grid
from cpbench.models.fold.msa import MSA_OP_LABELS, MSAConfig, MSAModule
from cpbench.models.pairformer import PairLayout

N = 12  # tiles 2, 4, 2x2 and 1x2; the last PAD tokens are padding
PAD = 3
S = 5
CFG = dict(
    c_m=8,
    c_z=8,
    c_s_inputs=6,
    n_blocks=2,
    opm_hidden=4,
    pwa_heads=2,
    pwa_width=4,
    tri_mul_hidden=6,
    tri_heads=2,
    tri_head_width=4,
    transition_factor=2,
)


def _inputs(seed: int = 5):
    gen = torch.Generator().manual_seed(seed)
    msa = {
        "msa": torch.randint(0, 33, (S, N), generator=gen),
        "has_deletion": torch.rand(S, N, generator=gen) < 0.3,
        "deletion_value": torch.rand(S, N, generator=gen),
        "msa_mask": torch.rand(S, N, generator=gen) < 0.7,  # some entries out, some pairs with none shared
    }
    msa["msa_mask"][0] = True  # the query row
    s_inputs = torch.randn(N, CFG["c_s_inputs"], generator=gen)
    z = torch.randn(N, N, CFG["c_z"], generator=gen)
    mask = torch.ones(N)
    mask[N - PAD :] = 0
    # Cotangent on the valid pairs, scaled like a per-row mean so that gradients are O(1).
    wz = torch.randn(N, N, CFG["c_z"], generator=gen) / N * (mask[:, None] * mask[None, :])[..., None]
    return msa, s_inputs, z, mask, wz


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
        msa, s_inputs, z, mask, wz = _inputs()
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


def test_padding_changes_no_valid_output() -> None:
    """Whatever the padded tokens' features, pairs and MSA entries hold, valid pairs come out the same."""
    torch.manual_seed(3)
    module = MSAModule(MSAConfig(**CFG))
    msa, s_inputs, z, mask, _ = _inputs()
    gen = torch.Generator().manual_seed(9)
    pad = mask == 0
    msa2 = {k: v.clone() for k, v in msa.items()}
    msa2["msa"][:, pad] = torch.randint(0, 33, (S, PAD), generator=gen)
    msa2["has_deletion"][:, pad] = True
    msa2["deletion_value"][:, pad] = 100 * torch.rand(S, PAD, generator=gen)
    msa2["msa_mask"][:, pad] = ~msa2["msa_mask"][:, pad]
    s2, z2 = s_inputs.clone(), z.clone()
    s2[pad] = 100 * torch.randn(PAD, CFG["c_s_inputs"], generator=gen)
    z2[pad] = 100 * torch.randn(z2[pad].shape, generator=gen)
    z2[:, pad] = 100 * torch.randn(z2[:, pad].shape, generator=gen)
    with torch.no_grad():
        out1 = module(msa, s_inputs, z, mask, PairLayout())
        out2 = module(msa2, s2, z2, mask, PairLayout())
    keep = ~pad
    torch.testing.assert_close(out2[keep][:, keep], out1[keep][:, keep])
    assert not torch.allclose(out2, out1)  # the perturbation did reach the padded pairs


def test_one_hot_msa_is_accepted() -> None:
    torch.manual_seed(4)
    module = MSAModule(MSAConfig(**CFG))
    msa, s_inputs, z, mask, _ = _inputs()
    one_hot = {**msa, "msa": torch.nn.functional.one_hot(msa["msa"], 33).float()}
    with torch.no_grad():
        torch.testing.assert_close(
            module(one_hot, s_inputs, z, mask, PairLayout()), module(msa, s_inputs, z, mask, PairLayout())
        )


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("n_blocks", 0, "n_blocks=0: must be a positive integer"),
        ("c_m", -1, "c_m=-1: must be a positive integer"),
        ("pwa_heads", 2.0, "pwa_heads=2.0: must be a positive integer"),
        ("opm_hidden", True, "opm_hidden=True: must be a positive integer"),
        ("chunk_size", 0, "chunk_size=0: must be null or a positive integer"),
    ],
)
def test_bad_config_fails_by_name(field: str, value, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        MSAConfig(**{field: value})


def test_last_block_skips_msa_updates() -> None:
    """The last block's m is never read: it has no MSA-update parameters, so every parameter of the
    module gets a gradient."""
    module = MSAModule(MSAConfig(**CFG))
    assert not hasattr(module.blocks[-1], "pair_weighted_averaging")
    msa, s_inputs, z, mask, wz = _inputs()
    module(msa, s_inputs, z, mask, PairLayout()).mul(wz).sum().backward()
    assert all(p.grad is not None for p in module.parameters())
