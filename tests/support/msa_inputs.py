"""The MSA module at the tests' sizes (`N` tokens, the last `PAD` of them padding, `S` sequences,
`CFG`) and its random inputs (`msa_inputs`), for one rank and for the CP ranks alike."""

from __future__ import annotations

import torch

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


def msa_inputs(seed: int = 5):
    """The MSA features, s_inputs, z, the token mask and a cotangent on the valid pairs."""
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
