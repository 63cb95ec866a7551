"""Checks no type can express: each failure names the setting and what is allowed."""

from __future__ import annotations

import math

from omegaconf import DictConfig

from cpbench.workloads.base import Topology


class ConfigError(ValueError):
    """A setting a run cannot use; the message starts with the setting's name."""


def squarest_grid(cp: int) -> tuple[int, int]:
    rows = max(r for r in range(1, math.isqrt(cp) + 1) if cp % r == 0)
    return rows, cp // rows


def topology_of(cfg: DictConfig) -> Topology:
    t = cfg.topology
    if t.cp < 1:
        raise ConfigError(f"topology.cp={t.cp}: must be an integer >= 1")
    if t.kind == "1d":
        if t.grid is not None:
            raise ConfigError(
                f"topology.grid={list(t.grid)}: only for topology.kind=2d (1d shards token rows)"
            )
        return Topology("1d", t.cp, (t.cp, 1))
    if t.kind != "2d":
        raise ConfigError(f"topology.kind={t.kind}: allowed values are 1d, 2d")
    if t.grid is None:
        return Topology("2d", t.cp, squarest_grid(t.cp))
    grid = list(t.grid)
    if len(grid) != 2 or min(grid) < 1 or grid[0] * grid[1] != t.cp:
        raise ConfigError(
            f"topology.grid={grid}: must be [rows, cols] of positive integers whose product is "
            f"topology.cp={t.cp}"
        )
    return Topology("2d", t.cp, (grid[0], grid[1]))


def _positive(name: str, value, allow_null: bool = False) -> None:
    if value is None and allow_null:
        return
    if value is None or value <= 0:
        raise ConfigError(f"{name}={value}: must be > 0")


def validate(cfg: DictConfig) -> Topology:
    """Validate the run's settings and return its topology."""
    topology = topology_of(cfg)
    for key in ("n_tokens", "atoms_per_token", "msa_depth"):
        _positive(f"shape.{key}", cfg.shape[key])
    _positive("shape.n_atoms", cfg.shape.n_atoms, allow_null=True)
    for key in ("n_tokens", "n_atoms", "msa_depth"):
        values = list(cfg.sweep[key])
        if not values and key != "n_tokens":  # no N_tokens at all: no sweep points, the probe alone
            raise ConfigError(f"sweep.{key}=[]: give at least one value (null takes shape.*)")
        for value in values:
            if value is not None and (not isinstance(value, int) or value <= 0):
                raise ConfigError(f"sweep.{key}={values}: entries must be integers > 0 or null")
    for n in cfg.sweep.n_tokens:
        if n is not None and not topology.accepts(n):
            raise ConfigError(
                f"sweep.n_tokens={list(cfg.sweep.n_tokens)}: {n} does not tile the "
                f"{topology.grid[0]}x{topology.grid[1]} grid of topology.kind={topology.kind}"
            )
    if cfg.timing.repeats < 1:
        raise ConfigError(f"timing.repeats={cfg.timing.repeats}: must be >= 1")
    if cfg.timing.warmup < 1:
        raise ConfigError(f"timing.warmup={cfg.timing.warmup}: must be >= 1 (the first steps are not timed)")
    p = cfg.probe
    _positive("probe.start", p.start)
    _positive("probe.granularity", p.granularity)
    _positive("probe.max_tokens", p.max_tokens, allow_null=True)
    if p.factor <= 1:
        raise ConfigError(f"probe.factor={p.factor}: must be > 1")
    _positive("memory.budget_gib", cfg.memory.budget_gib, allow_null=True)
    _positive("dist.timeout_s", cfg.dist.timeout_s)
    _positive("dist.agree_timeout_s", cfg.dist.agree_timeout_s)
    if cfg.dist.backend not in (None, "gloo", "nccl"):
        raise ConfigError(f"dist.backend={cfg.dist.backend}: allowed values are null (auto), gloo, nccl")
    if cfg.data.path is not None:
        _check_data(cfg)
    return topology


def _check_data(cfg: DictConfig) -> None:
    from cpbench.inputs import FeatureError, load_features

    if cfg.probe.enabled:
        raise ConfigError(
            "probe.enabled=true: a feature file (data.path) has one N_tokens; "
            "set probe.enabled=false to measure it"
        )
    try:
        load_features(cfg.data.path)
    except (FeatureError, OSError) as err:
        message = str(err)
        raise ConfigError(
            message if message.startswith("data.path=") else f"data.path={cfg.data.path}: {message}"
        ) from None
