"""Fold inputs: the inventory contract, synthesized shard by shard, or read from a feature file.

    shard = synthesize(shape, topology, coords, seed)            # this rank's shard, made here
    shard = shard_features(load_features(path), topology, coords) # this rank's shard of a file

See docs/inputs.md for the contract, padding and placement.
"""

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
    "load_features",
    "padded_tokens",
    "parse_chains",
    "save_features",
    "shard_features",
    "synthesize",
    "validate_features",
]
