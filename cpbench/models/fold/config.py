"""Sizes and knobs of the fold model: the Pairformer's, the MSA module's, the atom and diffusion
sizes, recycling and sampling. Defaults are AlphaFold3's; every value is checked up front."""

from __future__ import annotations

from dataclasses import dataclass, field

from cpbench.models.embeddings import TOKEN_FEATURES
from cpbench.models.fold.diffusion import DiffusionSizes
from cpbench.models.fold.msa import MSAConfig
from cpbench.models.pairformer import PairformerConfig
from cpbench.models.pairformer.config import require_positive


@dataclass(frozen=True)
class FoldConfig:
    pairformer: PairformerConfig = field(default_factory=PairformerConfig)
    msa: MSAConfig = field(default_factory=MSAConfig)
    diffusion: DiffusionSizes = field(default_factory=DiffusionSizes)
    input_atom_blocks: int = 3  # the input embedder's atom transformer (AF3: 3 blocks, 4 heads)
    n_cycles: int = 4  # trunk passes; all but the last run without autograd
    sampling_steps: int = 200  # inference: denoising steps of the diffusion sampler

    def __post_init__(self) -> None:
        require_positive(self, "input_atom_blocks", "n_cycles", "sampling_steps")
        d = self.diffusion
        require_positive(d, "c_atom", "c_atom_pair", "c_token", "atom_blocks", "atom_heads", "token_blocks",
                         "token_heads", "fourier")  # fmt: skip
        for width, heads in (("c_atom", "atom_heads"), ("c_token", "token_heads")):
            if getattr(d, width) % getattr(d, heads):
                raise ValueError(f"{heads}={getattr(d, heads)}: must divide {width}={getattr(d, width)}")
        pf = self.pairformer
        if (self.msa.c_z, self.msa.c_s_inputs) != (pf.c_z, self.c_s_inputs):
            raise ValueError("the MSA module's c_z and c_s_inputs must match the Pairformer's")

    @property
    def c_s_inputs(self) -> int:
        """s_inputs: the input embedder's token activations (c_s wide) and the token features."""
        return self.pairformer.c_s + TOKEN_FEATURES
