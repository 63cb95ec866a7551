"""Every setting given a value it cannot take is refused in one line that names it, before anything
runs: each key of docs/settings.md (a value of the wrong type, or for a text key with allowed values
one of none of them) and each built-in workload's own keys, walked in-process through Hydra's compose
API and the checks `python -m cpbench` makes (settings/overrides.py, then app/preflight.py); then
through `python -m cpbench` once, for the exit code and the absence of a traceback."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf
from support.processes import cpbench

from cpbench.app.preflight import checked_run
from cpbench.core import ConfigError
from cpbench.settings.overrides import check_overrides
from cpbench.settings.schema import register

ROOT = Path(__file__).resolve().parents[2]
# A wrong value for each type docs/settings.md gives (its type column, with "| null" dropped).
WRONG = {"int": "abc", "float": "abc", "bool": "maybe", "list[int]": "[abc]", "dict[str, Any]": "abc"}
# Text keys that take any text (a path, a label, an sbatch field, an interface, the allocator's
# settings, the entry point's command): no value of the right type is wrong before it is used.
FREE_TEXT = {
    "workload_preset", "job", "output_dir", "data.path", "memory.alloc_conf", "dist.backend",
    "dist.socket_ifname", "slurm.partition", "slurm.account", "slurm.qos", "slurm.constraint",
    "slurm.setup", "slurm.python", "slurm.job_name", "log.level", "forecast.against", "forecast.pool",
    "forecast.hardware", "checkpoint.path", "matmul_precision", "fault.where", "fault.kind",
    "slurm.cluster", "slurm.srun_args", "command", "convergence.reference",
}  # fmt: skip
# A workload's torch.compile backend is looked up by name when compile is on: any registered name,
# a user's own too.
FREE_WORKLOAD_TEXT = {"compile_backend"}
# Lists of any entry (null or an integer) are checked by settings.validate: a word is out of range.
ANY_LIST = "[abc]"


def _documented() -> list[tuple[str, str]]:
    """(key, wrong value) for every key docs/settings.md lists with a type a wrong value exists for."""
    rows = re.findall(
        r"^\| `([a-z_.]+)` \| ([^|`]+?(?:\\\|[^|`]+?)*) \| ", (ROOT / "docs/settings.md").read_text(), re.M
    )
    walked = []
    for key, kind in rows:
        kinds = [k.strip() for k in kind.split("\\|")]
        kinds = [k for k in kinds if k != "null"]
        if kinds[0].startswith("config group") or key in FREE_TEXT:
            continue
        if len(kinds) > 1:  # allowed values: measure | predict ..., inference | training ...
            walked.append((key, "nonsense"))
        elif kinds[0] == "list[Any]":
            walked.append((key, ANY_LIST))
        elif kinds[0] == "str":
            walked.append((key, "nonsense"))  # a text key with allowed values (topology.kind, ...)
        else:
            walked.append((key, WRONG[kinds[0]]))
    return walked


def _workload_keys() -> list[tuple[str, str, str]]:
    """(workload, key, wrong value) for every leaf of each built-in workload's config but its target."""
    register()
    found = []
    for path in sorted((ROOT / "configs/workload").glob("*.yaml")):
        if path.stem == "adapter":  # its keys are a user module's (tests/unit/test_adapter_options.py)
            continue
        with initialize_config_module("cpbench.configs", version_base="1.3"):
            workload = OmegaConf.to_container(compose("config", [f"workload={path.stem}"]).workload)
        for key, value in _leaves(workload):
            if key != "_target_" and key not in FREE_WORKLOAD_TEXT:
                found.append((path.stem, key, "[abc]" if isinstance(value, list) else "abc"))
    return found


def _leaves(node: dict, prefix: str = "") -> list[tuple[str, object]]:
    out = []
    for key, value in node.items():
        if isinstance(value, dict):
            out += _leaves(value, f"{prefix}{key}.")
        else:
            out.append((f"{prefix}{key}", value))
    return out


def _refusal(*overrides: str) -> str:
    """What `python -m cpbench` says of these overrides before any rank starts (its one line)."""
    register()
    try:
        check_overrides(list(overrides))
        with initialize_config_module("cpbench.configs", version_base="1.3"):
            checked_run(compose("config", ["output_dir=out", *overrides]))
    except ConfigError as err:
        return str(err)
    return ""


def test_the_walk_covers_the_documented_keys_and_the_workloads():
    documented = dict(_documented())
    assert {"timing.repeats", "topology.kind", "sweep.n_atoms", "probe.enabled", "workflow"} <= set(
        documented
    )
    assert len(documented) > 60, len(documented)
    assert ("fold_small", "sampling.steps", "abc") in _workload_keys()


@pytest.mark.parametrize(("key", "value"), _documented())
def test_each_documented_key_refuses_a_wrong_value_by_name(key: str, value: str):
    said = _refusal(f"{key}={value}")
    assert said.startswith(key) or f" {key}=" in said or f"{key}=" in said, said
    assert "\n" not in said


@pytest.mark.parametrize(("workload", "key", "value"), _workload_keys())
def test_each_workload_key_refuses_a_wrong_value_by_name(workload: str, key: str, value: str):
    said = _refusal(f"workload={workload}", f"workload.{key}={value}")
    named = {f"workload.{key}", f"workload.{key.replace('.', '_')}"}
    assert any(said.startswith(name) for name in named), said
    assert "\n" not in said


def test_a_wrong_value_is_one_line_and_exit_2_from_the_command(tmp_path):
    for override, line in (
        ("timing.repeats=abc", "cpbench: error: timing.repeats=abc: Value 'abc' of type 'str' could not be "
                               "converted to Integer"),
        ("nonsense.key=3", "cpbench: error: nonsense.key: no such setting"),
    ):  # fmt: skip
        proc = cpbench(override, cwd=tmp_path)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        assert proc.stderr.strip().splitlines()[0].startswith(line), proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_what_hydra_takes_passes_the_check():
    """Config groups (nested ones too), Hydra's own keys, additions, deletions and a sweep's values."""
    register()
    check_overrides(["-m", "hydra/launcher=submitit_local", "hydra.sweep.dir=x", "workload=fold",
                     "experiment=cpu_smoke", "topology.cp=1,2", "+workload.extra=1", "~probe.start",
                     "workload.sampling.steps=3", "memory.budget_gib=null", "output_dir=x"])  # fmt: skip
