"""docs/settings.md is what `python -m cpbench.settings.reference` writes from the code today, and every
key of the schema carries a description beside its field."""

from __future__ import annotations

from omegaconf import OmegaConf

from cpbench.settings import reference
from cpbench.settings.schema import BenchConfig


def test_the_page_is_the_schemas():
    assert reference.PAGE.read_text() == reference.render(), (
        "docs/settings.md disagrees with cpbench/settings/: run `python -m cpbench.settings.reference`"
    )


def test_every_key_and_section_is_described_beside_its_field():
    assert reference.undescribed() == [], "add a comment beside each field (a docstring for a section)"


def _leaves(node, prefix: str = "") -> list[str]:
    """Every key of a structured config, nested ones dotted; an open dict is one key."""
    keys = []
    for key in node:
        child = node._get_node(key)
        if OmegaConf.is_dict(child) and key != "additional_parameters":
            keys += _leaves(child, f"{prefix}{key}.")
        else:
            keys.append(f"{prefix}{key}")
    return keys


def test_every_key_hydra_accepts_has_a_row():
    page = reference.render()
    for key in _leaves(OmegaConf.structured(BenchConfig)):
        assert f"| `{key}` |" in page, key
