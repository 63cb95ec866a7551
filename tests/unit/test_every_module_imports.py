"""Every module of cpbench imports under whatever torch runs the suite (.ci/floor runs it at torch 2.6)."""

from __future__ import annotations

import importlib
import pkgutil

import cpbench as package


def test_every_module_of_cpbench_imports():
    names = [m.name for m in pkgutil.walk_packages(package.__path__, "cpbench.")]
    assert len(names) > 100  # the whole package, not a stray path
    for name in names:
        importlib.import_module(name)
