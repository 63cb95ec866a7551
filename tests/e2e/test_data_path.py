"""A user's feature file through the real entry point: its shape is the run's one point."""

from __future__ import annotations

from support.processes import FAST, cpbench, ok, results
from support.run_inputs import EXAMPLE

READS_INPUTS = ["workload=adapter", "workload.module=adapters.told", "workload.contract=native",
                "workload.options={width: 8, report_dir: .}"]  # fmt: skip


def test_feature_file_sets_the_point_and_is_recorded(tmp_path):
    """A workload that reads the file (axial_mix cannot, and is refused:
    tests/unit/test_adapter_options_checked.py)."""
    out = tmp_path / "out"
    ok(
        cpbench(
            "topology.cp=2",
            *READS_INPUTS,
            f"data.path={EXAMPLE}",
            "probe.enabled=false",
            *FAST,
            f"output_dir={out}",
            cwd=tmp_path,
        )
    )
    row = results(out).iloc[0]
    assert (row["N_tokens"], row["N_atoms"], row["MSA_depth"], row["status"]) == (304, 2736, 32, "ok")
