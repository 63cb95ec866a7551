"""The AlphaFold3 Pairformer stack with one-rank, 1d and 2d context parallelism (see docs/pairformer.md)."""

from cpbench.models.pairformer.block import OP_LABELS, PairformerBlock
from cpbench.models.pairformer.config import PairformerConfig
from cpbench.models.pairformer.layout import PairLayout
from cpbench.models.pairformer.stack import PairformerStack

__all__ = ["OP_LABELS", "PairLayout", "PairformerBlock", "PairformerConfig", "PairformerStack"]
