"""What tells one experiment's rows from another's: every row names its workload preset, a hash of the
preset's sizes, the device model and the memory cap as set, and a merge never puts rows that differ in
any of them in one table, readout or plot. A real fold_small run is measured once; the GPU run and the
oversubscribed run beside it are copies of it with run.json and the rows edited as a GPU run and an
oversubscribed run write them."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import matplotlib.image
import pytest
from hydra import compose, initialize_config_module
from support.processes import FAST, cpbench, ok, results

from cpbench.record.metadata import workload_labels
from cpbench.report.analysis import like_for_like
from cpbench.report.merge import merge
from cpbench.results.folder import RunFolder
from cpbench.results.row import COLUMNS
from cpbench.results.store import read_results
from cpbench.settings.identity import config_hash
from cpbench.settings.schema import BenchConfig, register
from cpbench.settings.validate import to_settings

GPU = "NVIDIA H100 80GB HBM3"


def _settings(*overrides: str) -> BenchConfig:
    register()
    with initialize_config_module("cpbench.configs", version_base=None):
        return to_settings(compose("config", [*overrides, "output_dir=unused"]))


@pytest.fixture(scope="module")
def fold_small(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("labels")
    out = root / "cpu"
    ok(cpbench("workload=fold_small", "topology.cp=1", "sweep.n_tokens=[16]", *FAST, f"output_dir={out}",
               cwd=root, timeout=240))  # fmt: skip
    return out


def _copy(run: Path, to: Path, meta: dict, rows: dict) -> Path:
    """The run copied, with run.json's figures and the rows' columns replaced."""
    shutil.copytree(run, to)
    folder = RunFolder(to)
    folder.write_json(folder.run_json, {**folder.read_json(folder.run_json), **meta})
    folder.write_text(folder.results, read_results(folder.results).assign(**rows).to_csv(index=False))
    return to


def _panels(png: Path) -> int:
    """How many panels a plot has: each is about 6 inches (660 pixels) wide."""
    return round(matplotlib.image.imread(png).shape[1] / 660)


def test_a_fold_small_run_says_fold_small(fold_small):
    frame = results(fold_small)
    meta = json.loads((fold_small / "run.json").read_text())
    assert set(frame["workload"]) == {"fold"} and set(frame["preset"]) == {"fold_small"}
    assert set(frame["device"]) == {meta["device"]} and set(frame["memory_budget"]) == {"0.5 GiB"}
    [sizes] = set(frame["sizes_hash"])
    # The hash of the preset's resolved settings: fold (AF3's sizes) differs, one size changed differs.
    assert sizes == workload_labels(_settings("workload=fold_small"), "fold")[1]
    assert re.fullmatch("[0-9a-f]{8}", sizes)
    others = {workload_labels(_settings(*o), "fold")[1] for o in (["workload=fold"],
              ["workload=fold_small", "workload.n_blocks=3"])}  # fmt: skip
    assert sizes not in others and len(others) == 2
    assert "| kind | workload | preset | workflow |" in (fold_small / "cp_benchmark.md").read_text()


def test_the_labels_leave_a_rows_identity_alone(fold_small):
    """The preset is a label: the config hash (resume, caching, comparison) is the same without it, and
    a results.csv written before the label columns reads, resumes and merges as before."""
    labelled = _settings("workload=fold_small", "workload_preset=mine")
    assert config_hash(labelled) == config_hash(_settings("workload=fold_small"))
    folder = RunFolder(fold_small)
    old = read_results(folder.results).drop(columns=["preset", "sizes_hash", "device", "memory_budget"])
    [current] = set(old["config_hash"])
    tmp = RunFolder(fold_small.parent / "old")
    tmp.write_text(tmp.results, old.to_csv(index=False))
    assert tmp.done_keys(current) == folder.done_keys(current) != set()
    tmp.append_results([{**old.iloc[0].to_dict(), "N_tokens": 32, "preset": "fold_small"}])
    assert list(tmp.read_results().columns[: len(COLUMNS)]) == COLUMNS


def test_cpu_and_gpu_runs_never_share_a_table_or_a_plot(fold_small, tmp_path):
    gpu = _copy(fold_small, tmp_path / "gpu", {"device": GPU, "backend": "nccl", "cuda": "12.8"},
                {"device": GPU, "memory_budget": "device memory"})  # fmt: skip
    twin = _copy(fold_small, tmp_path / "twin", {}, {})
    merged = merge([fold_small, gpu, twin], tmp_path / "merged")
    groups = like_for_like(merged.frame)
    assert [len(group) for _, group in groups] == [2, 1]  # the CPU run and its twin; the GPU run
    text = merged.report.read_text()
    sizes = merged.frame["sizes_hash"].iloc[0]
    cpu = json.loads((fold_small / "run.json").read_text())["device"]
    heading = f"## fold_small [sizes {sizes}], sdpa kernels, inference, float32, 2 diffusion sample(s)"
    assert f"{heading}, cap 0.5 GiB/rank on {cpu}\n" in text
    assert f"{heading}, cap: device memory on {GPU}\n" in text
    assert _panels(tmp_path / "merged" / RunFolder.WALLTIME_PLOT) == 2
    # The same two runs without the GPU copy: one group, one panel.
    alone = merge([fold_small, twin], tmp_path / "alone")
    assert len(like_for_like(alone.frame)) == 1
    assert _panels(tmp_path / "alone" / RunFolder.WALLTIME_PLOT) == 1


def test_an_oversubscribed_run_carries_the_caveat_in_a_merge(fold_small, tmp_path):
    meta = {"oversubscribed": "yes (4 ranks on 2 CPU core(s))"}
    crowded = _copy(fold_small, tmp_path / "crowded", meta, {})
    merged = merge([fold_small, crowded], tmp_path / "merged")
    readout = merged.report.read_text().split("### Readout")[1]
    assert (
        "Oversubscribed: `crowded` (4 ranks on 2 CPU core(s)): walltimes and the share of time in "
        "collectives are not meaningful." in readout.split("###")[0]
    )
    marked = results(tmp_path / "merged").set_index("run")["oversubscribed"]
    assert marked["crowded"].startswith("yes") and marked[fold_small.name] == "no"
    alone = merge([fold_small], tmp_path / "alone").report.read_text()
    assert "Oversubscribed" not in alone
