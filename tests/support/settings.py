"""A run's settings composed in-process from overrides, as `python -m cpbench` composes them (its
config, `output_dir=out` unless the overrides name another): typed and checked (`settings`, through
`to_settings`, which also refuses what no type can), or the schema's objects alone (`composed`)."""

from __future__ import annotations

from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

from cpbench.settings.schema import BenchConfig, register
from cpbench.settings.validate import to_settings


def settings(*overrides: str) -> BenchConfig:
    """The run's typed settings as `python -m cpbench` composes them, in-process."""
    register()
    with initialize_config_module("cpbench.configs", version_base="1.3"):
        return to_settings(compose("config", ["output_dir=out", *overrides]))


def composed(*overrides: str) -> BenchConfig:
    """The composed config as the schema's objects (`OmegaConf.to_object`), not checked further."""
    register()
    with initialize_config_module("cpbench.configs", version_base="1.3"):
        return OmegaConf.to_object(compose("config", ["output_dir=out", *overrides]))
