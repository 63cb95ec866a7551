"""Token embeddings that every built-in model shares (AlphaFold3 Algorithms 2 and 3)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from cpbench.inputs.contract import NUM_RES_TYPES
from cpbench.models.pairformer.modules import LinearNoBias

TOKEN_FEATURES = 2 * NUM_RES_TYPES + 1  # res_type one-hot, profile, deletion_mean
R_MAX, S_MAX = 32, 2  # AF3's relative position and chain clips


def token_features(t: dict[str, torch.Tensor]) -> torch.Tensor:
    """[n, TOKEN_FEATURES]: the residue class one-hot, the MSA profile and the deletion mean."""
    res = F.one_hot(t["res_type"].long(), NUM_RES_TYPES).float()
    return torch.cat([res, t["profile"].float(), t["deletion_mean"].float()[:, None]], dim=-1)


class RelativePosition(nn.Module):
    """Algorithm 3 for the pair block of row tokens x column tokens, each one-hot encoding applied
    as an embedding lookup (a LinearNoBias of a one-hot)."""

    def __init__(self, c_z: int):
        super().__init__()
        self.rel_residue = nn.Embedding(2 * R_MAX + 2, c_z)
        self.rel_token = nn.Embedding(2 * R_MAX + 2, c_z)
        self.rel_chain = nn.Embedding(2 * S_MAX + 2, c_z)
        self.same_entity = LinearNoBias(1, c_z)

    def forward(self, rows: dict[str, torch.Tensor], cols: dict[str, torch.Tensor]) -> torch.Tensor:
        def pairwise(name: str) -> torch.Tensor:
            return rows[name].long()[:, None] - cols[name].long()[None, :]

        same_chain = pairwise("asym_id") == 0
        same_entity = pairwise("entity_id") == 0
        far_res, far_chain = 2 * R_MAX + 1, 2 * S_MAX + 1
        d_res = torch.where(same_chain, (pairwise("residue_index") + R_MAX).clamp(0, 2 * R_MAX), far_res)
        same_res = same_chain & (pairwise("residue_index") == 0)
        d_tok = torch.where(same_res, (pairwise("token_index") + R_MAX).clamp(0, 2 * R_MAX), far_res)
        d_chain = torch.where(same_entity, (pairwise("sym_id") + S_MAX).clamp(0, 2 * S_MAX), far_chain)
        z = self.rel_residue(d_res) + self.rel_token(d_tok) + self.rel_chain(d_chain)
        return z + self.same_entity(same_entity[..., None].float())
