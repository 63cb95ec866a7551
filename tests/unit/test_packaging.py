"""The explicit package list in pyproject.toml covers every subpackage, so a regular install works."""

from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[2]


def test_every_subpackage_is_listed():
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "cpbench").rglob("__init__.py")}
    assert found | {"cpbench.configs"} == listed
