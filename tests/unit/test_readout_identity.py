"""One run's cp_benchmark.md: rows of each config apart, the budget said, noisy points marked and
counted, oversubscription named. Rows are written with the store's own writer."""

from __future__ import annotations

from cpbench.report.single import write_report
from cpbench.results.folder import RunFolder


def _row(n: int, config: str, seed: int, wall: float, iqr: float, kind: str = "point", **values) -> dict:
    return {
        "workload": "axial_mix", "workflow": "inference", "topology": "1d", "cp": 2, "grid": "2x1",
        "N_tokens": n, "N_atoms": 9 * n, "MSA_depth": 16, "dtype": "float32", "status": "ok",
        "peak_mem_gib": 1.17, "walltime_ms": wall, "walltime_iqr_ms": iqr, "kind": kind, "seed": seed,
        "config_hash": config, "budget_gib": 1.0, "baseline_gib": 0.27, **values,
    }  # fmt: skip


def test_rows_of_two_configs_are_never_mixed_and_the_budget_and_noise_are_said(tmp_path):
    folder = RunFolder(tmp_path)
    meta = {"seed": 1, "config_hash": "bbb222", "budget_gib": 1.0, "baseline_gib": 0.27,
            "oversubscribed": "yes (4 ranks on 2 CPU core(s))", "ranks_per_device": 2.0}  # fmt: skip
    folder.write_json(folder.run_json, meta)
    folder.append_results([
        _row(64, "aaa111", 0, 10.0, 0.5),
        _row(960, "aaa111", 0, None, None, kind="max-fit", oom_at=1024, walltime_ms=None),
        _row(64, "bbb222", 1, 10.0, 2.0),  # IQR 20% of the median: noisy
        _row(512, "bbb222", 1, None, None, kind="max-fit", oom_at=576, walltime_ms=None),
    ])  # fmt: skip
    text = write_report(tmp_path).read_text()
    rest = text.split("### config `aaa111`, seed 0")[1]
    first, second = rest.split("### config `bbb222` (this run's), seed 1")
    assert "Largest N_tokens that fits: 960 at cp=2" in first and "512" not in first
    assert "Largest N_tokens that fits: 512 at cp=2" in second and "960" not in second
    assert "noisy" not in first
    assert "| ok, noisy |" in second
    assert "1 point(s) are noisy (IQR over 10% of the median walltime)" in second
    assert "Oversubscribed (4 ranks on 2 CPU core(s)): walltimes and the share of time" in second
    assert "| seed | 1 |" in text and "| config hash | bbb222 |" in text
    assert "Memory cap: 1 GiB per rank on top of the 0.270 GiB" in text and "under 1.270 GiB" in text


def test_a_merge_flags_runs_that_overlapped_on_one_host(tmp_path):
    from cpbench.report.merge import merge

    spans = {
        "0_cp1": ("00:00:00", "00:01:00"),
        "1_cp2": ("00:00:30", "00:02:00"),
        "2_cp4": ("00:03:00", "00:04:00"),
    }
    for name, (start, end) in spans.items():
        folder = RunFolder(tmp_path / "sweep" / name)
        cp = int(name.split("cp")[1])
        folder.write_json(
            folder.run_json,
            {
                "host": "box",
                "cp": cp,
                "topology": "1d",
                "config_hash": f"h{cp}",
                "date": f"2026-01-01 {start} UTC",
                "finished": f"2026-01-01 {end} UTC",
            },
        )
        folder.append_results([{**_row(64, f"h{cp}", 0, 10.0, 0.5), "cp": cp}])  # fmt: skip
    text = merge([tmp_path / "sweep"]).report.read_text()
    assert "`0_cp1` and `1_cp2` ran at the same time on box: their walltimes do not compare." in text
    assert "`2_cp4` ran at the same time" not in text and "and `2_cp4` ran" not in text
