"""The explicit package list in pyproject.toml covers every subpackage, so a regular install works."""

from pathlib import Path

import pytest
import tomllib

pytestmark = pytest.mark.unit  # in-process: the fast lane (pytest -m unit)

ROOT = Path(__file__).resolve().parent.parent


def test_every_subpackage_is_listed():
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "cpbench").rglob("__init__.py")}
    assert found | {"cpbench.configs"} == listed
