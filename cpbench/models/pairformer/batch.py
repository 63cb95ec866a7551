"""The Pairformer's inputs on one rank: token features of its rows and columns, its bond block and
the token mask, made from the rank's input shard."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from cpbench.inputs import FoldShard


@dataclass
class PairformerBatch:
    rows: dict[str, torch.Tensor]  # token features of my row tokens [N/rows, ...]
    cols: dict[str, torch.Tensor]  # ... and of my column tokens [N/cols, ...]
    bonds: torch.Tensor  # [N/rows, N/cols] token_bonds block
    mask: torch.Tensor  # [N] float token mask of every (padded) token
    n_valid: int  # real tokens

    @staticmethod
    def token_fields(shard: FoldShard) -> dict:
        """The token and pair fields of a batch from a shard already on its device."""
        n = shard.n_tokens_padded
        return dict(
            rows=shard.row_tokens,
            cols=shard.col_tokens,
            bonds=shard.pair["token_bonds"],
            # Real tokens first, padding last: the global mask needs no communication.
            mask=(torch.arange(n, device=shard.pair["token_bonds"].device) < shard.n_tokens).float(),
            n_valid=shard.n_tokens,
        )

    @classmethod
    def of(cls, shard: FoldShard) -> PairformerBatch:
        return cls(**cls.token_fields(shard))
