"""The merged report over run folders: rows, like-for-like groups, the readout computed from the data,
failed runs and plots (the on-demand CLI and publishing: tests/e2e/test_report_cli.py). The run
folders are written with the store's own writers, with numbers chosen so that every figure of the
readout is known (support/report_folders.py)."""

from __future__ import annotations

from pathlib import Path

import matplotlib.image
import pytest
from support.processes import results
from support.report_folders import point_rows, run_row, write_run, write_sweep

from cpbench.report.merge import collect, merge
from cpbench.report.plots import write_plots
from cpbench.report.sections.readout import readout
from cpbench.results.folder import RunFolder


@pytest.fixture
def sweep(tmp_path) -> Path:
    """support/report_folders.py's sweep: a cp=1,2,4 sweep, a bfloat16 run, a failed job, a killed one."""
    return write_sweep(tmp_path / "sweep")


def test_merged_rows_and_runs(sweep):
    merged = merge([sweep])
    frame = results(sweep)
    assert len(frame) == 3 + 3 + 3 + 1 + 1
    assert list(frame["run"].unique()) == ["0_cp1", "1_cp2", "2_cp4", "3_cp2", "5_cp4"]
    assert list(frame.columns[:3]) == ["workload", "workflow", "topology"] and frame.columns[-1] == "run"
    assert list(frame.columns[17:19]) == ["preset", "sizes_hash"]  # after the contract's columns
    assert [run.name for run in merged.failed] == ["4_cp8", "5_cp4"]
    assert merged.report == sweep / "cp_benchmark.md"
    merge([sweep])  # merging again reads the job folders, never the merge itself
    assert len(results(sweep)) == len(frame)


def test_merged_report_compares_only_like_for_like(sweep):
    merge([sweep])
    text = (sweep / "cp_benchmark.md").read_text()
    # Rows written without the label columns take the preset from the workload, the device from run.json.
    float32, bfloat16 = text.split("## axial_mix, inference, float32, uncapped on x86_64")[1].split(
        "## axial_mix, inference, bfloat16, uncapped on x86_64"
    )
    # The CP curve of the float32 runs: max N vs cp, against cp=1 and the sqrt(cp) ideal ...
    assert "| 1d | 1 | 1x1 | 1000 | 1.00x | 1.00x | N=1064 does not fit |" in float32
    assert "| 1d | 2 | 2x1 | 1400 | 1.40x | 1.41x | N=1464 does not fit |" in float32
    assert "| 1d | 4 | 4x1 | 1900 | 1.90x | 2.00x | N=1964 does not fit |" in float32
    # ... and walltime vs N per cp; the bfloat16 run's 7 ms is not in it.
    assert "| N_tokens | N_atoms | MSA | 1d cp=1 | 1d cp=2 | 1d cp=4 |" in float32
    assert (
        "| 256 | 2304 | 16 | 40 | 25 | 20 |" in float32 and "| 512 | 4608 | 16 | 160 | 90 | 50 |" in float32
    )
    assert "| 256 | 2304 | 16 | 7 |" in bfloat16.split("## Run metadata")[0]
    assert "| 7 |" not in float32
    # Failed runs, with their error.
    assert "- `4_cp8` (cp=8): rank 3 failed: RuntimeError: NCCL error" in text
    assert "- `5_cp4` (cp=4): stopped while measuring N=256: killed, or still running" in text
    assert "| 4_cp8 |  | 8 | 0 | 0 | rank 3 failed: RuntimeError: NCCL error |" in text
    # All metadata, one column per run.
    assert "|  | 0_cp1 | 1_cp2 | 2_cp4 | 3_cp2 | 4_cp8 | 5_cp4 |" in text
    assert "| project commit | abc1234 | abc1234 | abc1234 | abc1234 |  | abc1234 |" in text
    assert text.startswith("# cpbench: CP sweep\n\nHardware: CPU (x86_64, 2 cores), gloo.")


def test_readout_is_computed_from_the_data(sweep):
    frame = collect([sweep]).frame
    text = readout(frame[frame["dtype"] == "float32"])
    assert (
        "Largest N_tokens that fits: 1000 at cp=1; 1400 at cp=2 (1.40x cp=1; ideal sqrt(cp) = 1.41x); "
        in text
    )
    assert "1900 at cp=4 (1.90x cp=1; ideal sqrt(cp) = 2.00x)." in text
    assert "At cp=4 that is 95% of the ideal growth for memory growing as N^2." in text
    # Collectives: medians of 0/40, 0/160; 2.5/25, 9/90; 12/20, 30/50 and the killed job's 5/9.
    assert "0% at cp=1, 10% at cp=2, 60% at cp=4; at cp=4 the run is communication-bound." in text
    assert "At N_tokens=512, walltime is 160 ms at cp=1 and 50 ms at cp=4 (3.20x faster)." in text
    # Several groups: one paragraph each, named.
    both = readout(frame)
    assert both.count("**axial_mix, inference, ") == 2 and "\n\n" in both


def test_readout_without_probe_or_baseline(sweep):
    frame = collect([sweep / "1_cp2", sweep / "2_cp4"]).frame
    text = readout(frame)
    assert "No cp=1 baseline was run" in text
    points = readout(frame[frame["kind"] == "point"])
    assert points.startswith("Max N_tokens was not probed here")
    assert "compute-bound" not in points and "communication-bound" in points


def test_plots_are_written_and_not_empty(sweep, tmp_path):
    frame = collect([sweep]).frame
    written = write_plots(frame, tmp_path)
    assert sorted(written.values()) == sorted([RunFolder.MAX_N_PLOT, RunFolder.WALLTIME_PLOT])
    # One panel per like-for-like group that has data: max-fit rows only in float32, points in both.
    for name, panels in ((RunFolder.MAX_N_PLOT, 1), (RunFolder.WALLTIME_PLOT, 2)):
        image = matplotlib.image.imread(tmp_path / name)
        assert image.shape[0] > 300 and 500 * panels < image.shape[1] < 700 * panels
        assert image[..., :3].std() > 0.05, f"{name} is blank"
    # Without max-fit rows there is no max-N plot, and a stale one from an earlier merge goes.
    points = frame[frame["kind"] == "point"]
    assert write_plots(points, tmp_path) == {"walltime vs N_tokens per cp": RunFolder.WALLTIME_PLOT}
    assert not (tmp_path / RunFolder.MAX_N_PLOT).exists()


def test_rows_of_an_earlier_configuration_are_left_out(tmp_path):
    """A folder rerun under other settings keeps its old rows; they are not like-for-like."""
    run = write_run(
        tmp_path / "sweep" / "0_cp2", 2, [run_row(2, 64, config_hash="old", walltime_ms=1.0), *point_rows(2)]
    )
    merged = merge([tmp_path / "sweep"])
    assert list(merged.frame["N_tokens"]) == [256, 512] and set(merged.frame["config_hash"]) == {"hash2"}
    assert len(results(run)) == 3  # the run's own rows stay as they are
    text = (tmp_path / "sweep" / "cp_benchmark.md").read_text()
    assert "Left out, as measured under other settings in the same folder (another config hash): " in text
    assert "1 row(s) of `0_cp2`" in text and "| 64 |" not in text
