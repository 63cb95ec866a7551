"""A machine's figures as a small YAML file: a calibration that `python -m cpbench.calibrate` wrote
from this machine's points, or a datasheet preset shipped in configs/hardware/ (`h100_sxm`), each
figure with its source."""

from __future__ import annotations

from dataclasses import asdict
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from cpbench.core import ConfigError
from cpbench.steptime.model import Hardware, Link, OpCost


def presets() -> list[str]:
    """The datasheet presets shipped with cpbench, by name."""
    folder = resources.files("cpbench.configs") / "hardware"
    return sorted(p.name.removesuffix(".yaml") for p in folder.iterdir() if p.name.endswith(".yaml"))


def load_hardware(spec: str) -> Hardware:
    """A preset by name, or a calibration file by path; a ConfigError names what is wrong."""
    path = Path(spec).expanduser()
    if path.suffix in (".yaml", ".yml") or path.exists():
        if not path.is_file():
            raise ConfigError(f"forecast.hardware: no file {path}")
        text, where = path.read_text(), str(path)
    elif spec in presets():
        text, where = (resources.files("cpbench.configs") / "hardware" / f"{spec}.yaml").read_text(), spec
    else:
        raise ConfigError(
            f"forecast.hardware: {spec!r} is neither a file nor a preset ({', '.join(presets())})"
        )
    try:
        return from_dict(yaml.safe_load(text))
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        raise ConfigError(f"forecast.hardware: {where} is not a machine's figures: {err!r}") from err


def from_dict(raw: dict[str, Any]) -> Hardware:
    links = {
        name: Link(**{k: float(v) for k, v in link.items()})
        for name, link in (raw.get("links") or {}).items()
    }
    ops = {
        op: OpCost(
            float(c["kernel_s"]),
            float(c["per_s"]),
            tuple((float(w), float(s)) for w, s in c.get("measured", ())),
        )
        for op, c in (raw.get("ops") or {}).items()
    }
    return Hardware(
        name=str(raw["name"]),
        rates={c: float(v) for c, v in raw["rates"].items()},
        kernel_s=float(raw.get("kernel_s", 0.0)),
        links=links,
        devices_per_node=int(raw["devices_per_node"]),
        dtype=str(raw["dtype"]),
        memory_gib=None if raw.get("memory_gib") is None else float(raw["memory_gib"]),
        ops=ops,
        sources=dict(raw.get("sources") or {}),
    )


def to_dict(hw: Hardware) -> dict[str, Any]:
    """The file's form: plain numbers (a rate the fit found no cost for is .inf)."""
    raw = asdict(hw)
    return {**raw, "ops": {op: raw["ops"][op] for op in sorted(raw["ops"])}}


def hardware_text(hw: Hardware, notes: list[str]) -> str:
    """The figures as the file holds them, `notes` (how they were fitted) as comments above."""
    return "".join(f"# {line}\n" for line in notes) + yaml.safe_dump(to_dict(hw), sort_keys=False)
