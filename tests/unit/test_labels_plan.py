"""Labels in-process: each run of a plan labelled with its own preset, and the max-fit row keeping where
the probe failed."""

from __future__ import annotations

import pandas as pd
from hydra import compose, initialize_config_module

from cpbench.experiment.runner import PlanRun
from cpbench.report.analysis import max_fit
from cpbench.settings.schema import register


def test_each_run_of_a_plan_is_labelled_with_its_own_preset(tmp_path):
    """A plan composes its runs inside the app, whose Hydra choice is the command line's (fold_small)."""
    register()
    with initialize_config_module("cpbench.configs", version_base=None):
        cfg = compose("config", ["experiment=cpu_smoke", f"output_dir={tmp_path}"])
        plan = PlanRun(cfg, [], lambda c: None, run_one=lambda c: 1)
        assert plan.config((), "baseline").workload_preset == "pairformer_small"  # the plan's baseline
        assert plan.config(["workload=axial_mix"], "axial").workload_preset == "axial_mix"


def test_max_fit_keeps_where_the_probe_failed():
    """The max-N plot's bracket: the largest N that fit and the first that did not."""
    rows = pd.DataFrame(
        [
            {"kind": "max-fit", "status": "ok", "topology": "1d", "cp": cp, "grid": f"{cp}x1",
             "N_tokens": n, "oom_at": n + 64}
            for cp, n in ((1, 512), (2, 704))
        ]
    )  # fmt: skip
    fits = max_fit(rows)
    assert list(fits["max_n"]) == [512, 704] and list(fits["oom_at"]) == [576, 768]
    assert not fits["oversubscribed"].any()
