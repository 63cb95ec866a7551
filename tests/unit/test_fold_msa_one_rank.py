"""The MSA module on one rank: padding changes no valid output, a one-hot MSA is accepted, the last block
skips the MSA updates, and a bad config fails by name."""

from __future__ import annotations

import pytest
import torch
from support.msa_inputs import CFG, PAD, S, msa_inputs

from cpbench.models.fold.msa import MSAConfig, MSAModule
from cpbench.models.pairformer import PairLayout


def test_padding_changes_no_valid_output() -> None:
    """Whatever the padded tokens' features, pairs and MSA entries hold, valid pairs come out the same."""
    torch.manual_seed(3)
    module = MSAModule(MSAConfig(**CFG))
    msa, s_inputs, z, mask, _ = msa_inputs()
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
    msa, s_inputs, z, mask, _ = msa_inputs()
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
    msa, s_inputs, z, mask, wz = msa_inputs()
    module(msa, s_inputs, z, mask, PairLayout()).mul(wz).sum().backward()
    assert all(p.grad is not None for p in module.parameters())
