"""The cp=1 baseline in-process (cpbench/app/baseline.py): the default run plans it, and its cache key
holds what changes the cp=1 answer and nothing else."""

from __future__ import annotations

from support.settings import composed

from cpbench.app.baseline import baseline_settings, cache_key


def test_the_default_run_plans_its_baseline():
    default = composed()
    base = baseline_settings(default)
    assert default.baseline and default.topology.cp == 2
    assert base is not None and (base.topology.kind, base.topology.cp, base.topology.grid) == ("1d", 1, None)
    assert base.memory == default.memory and base.sweep == default.sweep and base.probe == default.probe
    assert baseline_settings(composed("baseline=false")) is None
    assert baseline_settings(composed("topology.cp=1")) is None  # a cp=1 run is its own baseline


def test_the_cache_key_holds_what_changes_the_cp1_answer_and_nothing_else():
    key = cache_key(composed())
    for same in ("topology.cp=4", "output_dir=elsewhere", "log.progress=false"):
        assert cache_key(composed(same)) == key, same
    for other in ("topology.kind=2d", "workload=axial_mix", "workflow=training", "dtype=bfloat16",
                  "sweep.n_tokens=[64]", "shape.msa_depth=8", "probe.start=192", "memory.cpu_budget_gib=2",
                  "timing.repeats=3", "seed=1"):  # fmt: skip
        assert cache_key(composed(other)) != key, other
