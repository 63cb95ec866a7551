"""A workload's optional attributes and hooks, read in one place (`cpbench.workloads.base.traits`):
what a workload leaves out is the declared default; what it sets is taken as set."""

from __future__ import annotations

import pytest

from cpbench.workloads.base import Contract, WorkloadTraits, traits
from cpbench.workloads.pairformer import PairformerWorkload


class _Bare:
    """The three hooks alone."""

    def build_model(self, ctx): ...

    def build_batch(self, shape, ctx): ...

    def run_step(self, model, batch, train): ...


class _Declared(_Bare):
    name = "mine"
    contract = "foldcp"  # as a module or a config gives it: a string
    counts_comm = True
    takes_inputs = True
    real_job = []
    columns = None  # an attribute that is no hook is none

    def check_topology(self, topology) -> None:
        raise ValueError(topology)


def test_a_workload_that_declares_nothing_gets_every_default():
    assert traits(_Bare()) == WorkloadTraits(name="_Bare")


def test_what_a_workload_declares_is_taken_and_typed():
    declared = traits(_Declared())
    assert (declared.name, declared.contract, declared.counts_comm, declared.takes_inputs) == (
        "mine",
        Contract.foldcp,
        True,
        True,
    )
    assert declared.real_job == () and declared.columns is None
    with pytest.raises(ValueError, match="2d"):
        declared.check_topology("2d")


def test_a_built_in_workload_declares_its_forms_and_its_real_job():
    declared = traits(PairformerWorkload(c_z=8, n_blocks=2))
    assert declared.peak_form is not None and declared.flop_form is not None and declared.real_job
    assert declared.flop_form({"n_blocks": 1}).knobs["n_blocks"] == 1
