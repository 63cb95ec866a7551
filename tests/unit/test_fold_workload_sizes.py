"""A bad fold workload size fails by name when the workload is built."""

from __future__ import annotations

import pytest
from support.tiny_fold import TINY

from cpbench.workloads.fold import FoldWorkload


@pytest.mark.parametrize(
    ("knob", "value", "words"),
    [
        ("atom_heads", 3, "atom_heads=3: must divide c_atom=16"),
        ("sampling", {"steps": 0}, "sampling_steps=0: must be a positive integer"),
        ("sampling", {"step": 2}, "the sampler takes one setting, `steps`"),
        ("msa_blocks", 0, "msa_blocks=0: must be a positive integer"),
        ("token_heads", 5, "token_heads=5: must divide c_token=16"),
    ],
)
def test_bad_size_fails_by_name(knob: str, value: object, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        FoldWorkload(**{**TINY, knob: value})
