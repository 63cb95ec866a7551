"""Fold inputs: the inventory contract, synthesized shard by shard, or read from a feature file or a
complex (AlphaFold3 JSON, Boltz YAML).

    shard = synthesize(shape, topology, coords, seed)            # this rank's shard, made here
    shard = shard_features(load_features(path), topology, coords) # this rank's shard of a file
    shard = fold_inputs(shape, ctx)                                # whichever the run asks for

See docs/inputs.md for the contract, padding and placement.
"""

from cpbench.core import RankContext, Shape
from cpbench.inputs.chains import ChainTable, chains_from_seed, parse_chains
from cpbench.inputs.contract import FEATURES, MOL_TYPES, RES_TYPES, SPECS, FeatureSpec, padded_tokens
from cpbench.inputs.files import (
    FeatureError,
    FoldFeatures,
    load_features,
    save_features,
    shard_features,
    validate_features,
)
from cpbench.inputs.shard import FoldShard
from cpbench.inputs.synth import synthesize


def fold_inputs(shape: Shape, ctx: RankContext) -> FoldShard:
    """This rank's shard of the run's inputs: the user's file (`data.path`) or synthesized ones."""
    if ctx.data_path:
        features = load_features(ctx.data_path, seed=ctx.seed)
        return shard_features(features, ctx.topology, ctx.coords, shape.msa_depth)
    return synthesize(shape, ctx.topology, ctx.coords, ctx.seed)


__all__ = [
    "FEATURES",
    "MOL_TYPES",
    "RES_TYPES",
    "SPECS",
    "ChainTable",
    "FeatureError",
    "FeatureSpec",
    "FoldFeatures",
    "FoldShard",
    "chains_from_seed",
    "fold_inputs",
    "load_features",
    "padded_tokens",
    "parse_chains",
    "save_features",
    "shard_features",
    "synthesize",
    "validate_features",
]
