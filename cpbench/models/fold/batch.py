"""The fold model's inputs on one rank: the Pairformer's token and pair fields, its MSA columns and
its atoms with their attention windows."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from cpbench.models.fold.diffusion import AtomContext
from cpbench.models.pairformer.batch import PairformerBatch


@dataclass
class FoldBatch(PairformerBatch):
    """The Pairformer's token and pair fields, the MSA and atoms, and the diffusion samples per trunk
    pass of the point (None: the workload's own count)."""

    msa: dict[str, torch.Tensor]  # the MSA columns of my row tokens [S, N/rows]
    atoms: AtomContext  # my atoms and their windows
    samples: int | None = None
