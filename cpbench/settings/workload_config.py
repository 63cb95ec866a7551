"""The workload's settings as the user gave them. A class named by `workload._target_=pkg.mod.Class`
gets only the keys the command line gives it, not the default workload's sizes; a model's options file
(`workload.options_file`) is read into `workload.options`, so that its contents, not its name, are
recorded (run.json) and hashed (config_hash, the baseline key)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

from cpbench.core import ConfigError


def workload_settings(
    workload: dict[str, Any], overrides: Sequence[str]
) -> tuple[dict[str, Any], str | None]:
    """The workload's settings and, for a `_target_` given alone, the label of its rows (the class's
    name: the default group's choice would name another workload)."""
    own = _target_alone(workload, overrides)
    settings = _with_options_file(own if own is not None else workload)
    return settings, (settings["_target_"].rsplit(".", 1)[-1] if own is not None else None)


def _target_alone(workload: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any] | None:
    """The keys the command line gives when it names `workload._target_` but no `workload=` group
    (whose keys would then be the user's choice too); None otherwise."""
    parsed = OverridesParser.create().parse_overrides(list(overrides))
    named = [o.key_or_group for o in parsed if not o.is_delete()]
    if "workload._target_" not in named or "workload" in named:
        return None
    given, kept = OmegaConf.create(workload), OmegaConf.create({})
    for key in named:
        if key.startswith("workload."):
            path = key.removeprefix("workload.")
            OmegaConf.update(kept, path, OmegaConf.select(given, path), merge=False)
    return OmegaConf.to_container(kept, resolve=True)


def _with_options_file(workload: dict[str, Any]) -> dict[str, Any]:
    """`options_file`'s mapping under `options`; options given on the command line win, key by key."""
    path = workload.get("options_file")
    if not path:
        return workload
    try:
        loaded = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as err:
        raise ConfigError(
            f"workload.options_file={path}: cannot be read ({str(err).splitlines()[0]})"
        ) from None
    if not isinstance(loaded, dict):
        raise ConfigError(f"workload.options_file={path}: must be a YAML mapping of the model's options")
    merged = OmegaConf.merge(OmegaConf.create(loaded), OmegaConf.create(workload.get("options") or {}))
    return {**workload, "options": OmegaConf.to_container(merged, resolve=True)}
