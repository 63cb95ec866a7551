"""Fold inputs: the inventory contract, synthesized shard by shard, or read from a feature file or a
complex (AlphaFold3 JSON, Boltz YAML).

    shard = synthesize(shape, topology, coords, seed)            # this rank's shard, made here
    shard = shard_features(load_features(path), topology, coords) # this rank's shard of a file
    shard = fold_inputs(shape, ctx)                                # whichever the run asks for

See docs/inputs.md for the contract, padding and placement.
"""

from cpbench.core import RankContext, Shape
from cpbench.inputs.chains import ChainTable, chains_from_seed, parse_chains
from cpbench.inputs.contract import (
    FEATURES,
    MOL_TYPES,
    RES_TYPES,
    SPECS,
    FeatureError,
    FeatureSpec,
    padded_tokens,
)
from cpbench.inputs.files import (
    FoldFeatures,
    load_features,
    save_features,
    shard_features,
    validate_features,
)
from cpbench.inputs.point import input_columns, input_point, read_input
from cpbench.inputs.shard import FoldShard
from cpbench.inputs.synth import synthesize


def fold_inputs(shape: Shape, ctx: RankContext) -> FoldShard:
    """This rank's shard of the run's inputs: the user's file (`data.path`) or synthesized ones."""
    if ctx.data_path:
        return shard_features(read_input(ctx.data_path, ctx.seed), ctx.topology, ctx.coords, shape.msa_depth)
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
    "input_columns",
    "input_point",
    "load_features",
    "padded_tokens",
    "read_input",
    "parse_chains",
    "save_features",
    "shard_features",
    "synthesize",
    "validate_features",
]
