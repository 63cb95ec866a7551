"""The cp=1 baseline beside a CP run (cpbench/app/baseline.py): measured once per configuration in the
cache inside output_dir, its rows in the run's results.csv and readout (its plan and its cache key:
tests/unit/test_baseline_plan.py)."""

from __future__ import annotations

import re
import shutil

import pytest
from support.processes import TIMING, cpbench, ok, results

from cpbench.results.folder import RunFolder
from cpbench.results.row import BASELINE

# A small probe bounded by max_tokens, so both CP sizes end at a known N without filling the machine.
RUN = ["baseline=true", "sweep.n_tokens=[16,32]", "probe.enabled=true", "probe.start=32",
       "probe.granularity=16", "probe.max_tokens=64", "probe.measure_at_max=false", *TIMING]  # fmt: skip


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """One cp=2 run with its baseline, then a cp=4 run into the same folder that finds the baseline
    cached; the cp=2 run's results and report are kept as they were before the second run."""
    root = tmp_path_factory.mktemp("baseline")
    out = root / "run"
    first = ok(cpbench("topology.cp=2", *RUN, f"output_dir={out}", cwd=root, timeout=300))
    cache = next((out / RunFolder.BASELINE).iterdir())
    stamp = (cache / "results.csv").stat().st_mtime_ns
    shutil.copytree(out, root / "cp2", ignore=shutil.ignore_patterns(RunFolder.BASELINE))
    second = ok(cpbench("topology.cp=4", *RUN, f"output_dir={out}", cwd=root, timeout=300))
    return root, cache, stamp, first, second


def test_a_cp_run_writes_its_rows_and_the_baseline_rows(runs):
    root, cache, _, first, _ = runs
    assert "measuring the cp=1 baseline first" in first.stderr
    frame = results(root / "cp2")
    base = frame[frame["source"] == BASELINE]
    mine = frame[frame["source"] != BASELINE]
    assert set(base["cp"]) == {1} and set(mine["cp"]) == {2}
    for rows in (base, mine):
        assert sorted(rows.loc[rows["kind"] == "point", "N_tokens"]) == [16, 32]
        assert (rows.loc[rows["kind"] == "max-fit", "N_tokens"] == 64).all()
        assert (rows["status"] == "ok").all()
    # The baseline's rows are the cache's own measurements, carried under this run's config hash.
    cached = results(cache)
    assert base["walltime_ms"].reset_index(drop=True).equals(cached["walltime_ms"])
    assert base["config_hash"].nunique() == 1 and set(base["config_hash"]) == set(mine["config_hash"])


def test_the_readout_compares_max_n_and_walltime_against_cp1(runs):
    text = (runs[0] / "cp2" / "cp_benchmark.md").read_text()
    assert "The cp=1 rows are this run's baseline" in text
    assert "64 at cp=1; 64 at cp=2 (1.00x cp=1; ideal sqrt(cp) = 1.41x)." in text
    assert re.search(r"At every N_tokens measured at both, cp=2 against cp=1: N=16 [\d.]+x \w+, N=32", text)


def test_the_report_links_plots_that_exist(runs):
    out = runs[0] / "cp2"
    links = re.findall(r"!\[[^]]+\]\(([^)]+)\)", (out / "cp_benchmark.md").read_text())
    assert set(links) == {"cp_benchmark_max_n.png", "cp_benchmark_walltime.png", "cp_benchmark_mfu.png"}
    for link in links:
        assert (out / link).read_bytes().startswith(b"\x89PNG")


def test_a_later_run_at_another_cp_reuses_the_cached_baseline(runs):
    root, cache, stamp, _, second = runs
    assert f"cp=1 baseline from the cache: {cache}" in second.stderr
    assert (cache / "results.csv").stat().st_mtime_ns == stamp  # not measured again
    frame = results(root / "run")
    assert set(frame.loc[frame["source"] == BASELINE, "cp"]) == {1}
    assert "1.00x cp=1; ideal sqrt(cp) = 2.00x" in (root / "run" / "cp_benchmark.md").read_text()


def test_a_cp_sweep_measures_one_baseline_inside_its_folder(tmp_path):
    out = tmp_path / "sweep"
    # No FLOP count (its MFU plot: the runs above): nothing here reads it.
    proc = ok(cpbench("-m", "topology.cp=2,4", *RUN, "measure.count_flops=false", f"output_dir={out}",
                      cwd=tmp_path, timeout=400))  # fmt: skip
    assert proc.stderr.count("measuring the cp=1 baseline first") == 1
    assert proc.stderr.count("cp=1 baseline from the cache") == 1
    (cache,) = (out / RunFolder.BASELINE).iterdir()  # in the sweep folder, nothing beside it
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sweep"]
    merged = results(out)
    base = merged[merged["source"] == BASELINE]
    assert set(base["cp"]) == {1} and sorted(base.loc[base["kind"] == "point", "N_tokens"]) == [16, 32]
    assert set(merged.loc[merged["source"] != BASELINE, "cp"]) == {2, 4}
