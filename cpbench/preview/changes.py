"""The what-changed table: every way a benchmark differs from the real job it stands for, the setting
that controls it, and why. The real job is the workload's own (`real_job`: built-in workloads declare
their production settings; an adapter module its `REAL_JOB`) or the user's, `job=path.yaml` (settings
under cpbench's own keys), which wins where both set a key. Ways no setting changes are limitations."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from omegaconf import OmegaConf

from cpbench.core import ConfigError
from cpbench.record.run_record import Change
from cpbench.workloads.base import Limitation, RealSetting

# Why a job key set differently matters, by its first part.
_WHY = {
    "topology": "the CP size and layout set per-rank memory and communication: the bottleneck moves",
    "dtype": "precision sets memory and speed",
    "shape": "N sets memory and the balance of compute and communication",
    "sweep": "N sets memory and the balance of compute and communication",
    "workflow": "training adds the backward and optimizer step",
    "workload": "a model setting: it changes the work of a step",
}


def load_job(path: str) -> dict[str, Any]:
    """A user's real-job settings: a YAML mapping under cpbench's config keys, flattened to dotted keys."""
    try:
        loaded = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as err:
        raise ConfigError(f"job={path}: cannot be read ({str(err).splitlines()[0]})") from None
    if not isinstance(loaded, dict):
        raise ConfigError(f"job={path}: must be a YAML mapping of cpbench settings (topology: {{cp: 8}})")
    return _flatten(loaded)


def _flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    flat = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        flat.update(_flatten(value, f"{name}.") if isinstance(value, Mapping) else {name: value})
    return flat


def _text(value: Any) -> str:
    return "null" if value is None else str(value)


def what_changed(
    config: Mapping[str, Any],
    real_job: Sequence[RealSetting | Limitation] = (),
    job: Mapping[str, Any] | None = None,
) -> list[Change]:
    """The table's rows. `config`: the run's settings as plain containers; `real_job`: the workload's;
    `job`: the user's real-job settings (dotted keys), checked against `config`'s keys."""
    cfg, job = OmegaConf.create(dict(config)), dict(job or {})
    workflow = cfg.workflow
    rows, seen = [], set()
    for entry in real_job:
        if entry.workflow not in (None, workflow):
            continue
        if isinstance(entry, Limitation):
            rows.append(Change(entry.what, _text(entry.benchmark), _text(entry.real), "", entry.why, True))
            continue
        differ = {}
        for key, real in entry.keys.items():
            name = f"{entry.section}.{key}"
            real, bench = job.pop(name, real), OmegaConf.select(cfg, name)
            bench = OmegaConf.to_container(bench) if OmegaConf.is_config(bench) else bench
            seen.add(name)
            if bench != real:
                differ[key] = (bench, real)
        if not differ:
            continue
        if len(differ) == 1:
            [(key, (bench, real))] = differ.items()
            scale = real / bench if entry.scales and bench else None
            setting = entry.setting or f"{entry.section}.{key}"
            rows.append(Change(entry.what, _text(bench), _text(real), setting, entry.why, scale=scale))
        else:
            rows.append(Change(
                entry.what, ", ".join(f"{k}={b}" for k, (b, _) in differ.items()),
                ", ".join(f"{k}={r}" for k, (_, r) in differ.items()),
                entry.setting or ", ".join(f"{entry.section}.{k}" for k in differ), entry.why,
            ))  # fmt: skip
    rows += _job_rows(cfg, job)
    if cfg.data.path is None and "data.path" not in job:
        rows.append(Change(
            "inputs", "synthesized from the seed (random values, the job's shapes)", "the job's own features",
            "data.path", "memory and time follow the shapes (N, atoms, MSA depth), which are kept; a feature "
            "file (docs/inputs.md) measures the real inputs",
        ))  # fmt: skip
    rows.append(Change(
        "steps measured", f"{cfg.timing.warmup} warm-up + {cfg.timing.repeats} timed, median of the slowest "
        "rank", "one pass", "timing.warmup, timing.repeats", "first steps carry one-off costs; a median "
        "over repeats is the steady step the real job runs again and again",
    ))  # fmt: skip
    return rows


def _job_rows(cfg: Any, job: dict[str, Any]) -> list[Change]:
    rows = []
    for key, real in job.items():
        if key == "shape.n_tokens":  # the benchmark's N are its sweep points
            points = list(cfg.sweep.n_tokens)
            if real not in points:
                change = Change("N_tokens", f"sweep {points}", _text(real), "sweep.n_tokens", _WHY["sweep"])
                rows.append(change)
            continue
        if OmegaConf.select(cfg, key, default=KeyError) is KeyError:
            raise ConfigError(f"job: {key} is not a cpbench setting (a job file uses cpbench's config keys)")
        bench = OmegaConf.select(cfg, key)
        bench = OmegaConf.to_container(bench) if OmegaConf.is_config(bench) else bench
        if bench != real:
            why = _WHY.get(key.split(".")[0], "the benchmark's config sets it differently")
            rows.append(Change(key, _text(bench), _text(real), key, why))
    return rows


def budget_rows(cuts: Sequence[str]) -> list[Change]:
    """The time budget's cuts, as rows of the table."""
    return [
        Change("cut to fit the time budget", cut, "as set", "budget.minutes, budget.min_repeats",
               "the plan's estimated time was over budget.minutes")
        for cut in cuts
    ]  # fmt: skip
