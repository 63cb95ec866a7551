"""The command line's overrides checked against the schema before Hydra merges them: a value a typed
key cannot take, or a key no setting has, is one line that names it. Hydra's own message for either
is six lines naming its internal classes; the workload's own keys are checked when it is built
(app/preflight.py), the values' ranges by `settings.validate`."""

from __future__ import annotations

import re
from importlib import resources
from typing import Any

from hydra._internal.utils import get_args_parser  # Hydra's own command line: its flags, then overrides
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from cpbench.core import ConfigError
from cpbench.settings.schema import BenchConfig

# The keys below these are the workload's own (untyped here), Hydra's, or config.yaml's own (the output
# folder, whose default reads the environment).
FREE = ("workload", "hydra", "output_dir")


def check_overrides(argv: list[str]) -> None:
    """Raise ConfigError, in one line, for the first override on the command line `argv` (Hydra's
    flags apart) whose key no setting has or whose value (each value of a sweep) its key's type
    cannot take."""
    try:
        given = get_args_parser().parse_args(argv).overrides
        overrides = OverridesParser.create().parse_overrides(given)
    except HydraException as err:
        raise ConfigError(str(err).splitlines()[0]) from None
    schema = OmegaConf.structured(BenchConfig)
    groups = _config_groups()
    for override in overrides:
        key = override.key_or_group
        head = re.split(r"[./]", key)[0]  # a group's path names its parent group: hydra/launcher
        if override.is_delete() or override.is_add() or head in FREE or head in groups:
            continue
        if not _has_key(schema, key):
            raise ConfigError(f"{key}: no such setting (docs/settings.md lists them; +{key}=... adds a key)")
        for value in _values(override):
            try:
                OmegaConf.update(schema, key, value, merge=False)
            except OmegaConfBaseException as err:
                reason = str(err).splitlines()[0]
                raise ConfigError(f"{key}={_shown(value)}: {reason}") from None


def _config_groups() -> set[str]:
    """The config groups (configs/<group>/): `group=option` picks a file, not a value."""
    return {entry.name for entry in resources.files("cpbench.configs").iterdir() if entry.is_dir()}


def _has_key(schema: DictConfig, key: str) -> bool:
    node: Any = schema
    for part in key.split("."):
        if not isinstance(node, DictConfig) or part not in node:
            return False
        node = node._get_node(part)
    return True


def _values(override: Override) -> list[Any]:
    """The values an override sets: its one value, or each of a choice sweep's (a range's are numbers
    its own syntax made)."""
    if not override.is_sweep_override():
        return [override.value()]
    if override.is_choice_sweep():
        return list(override.sweep_iterator())
    return []


def _shown(value: Any) -> str:
    """A value as it was typed: `abc`, `[a, 1]`."""
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_shown(v) for v in value) + "]"
    return "null" if value is None else str(value)
