"""Memory accounting on a GPU, as far as a machine without one can check it: the cap is the card less
what the rank holds after start-up, the peak's GPU figures, the allocator's settings set before CUDA
starts (and recorded by every run: tests/e2e/test_gpu_memory_runs.py)."""

from __future__ import annotations

import os

import pytest
import torch
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

from cpbench.core import ConfigError
from cpbench.measure import memory
from cpbench.measure.cap import gpu_cap
from cpbench.measure.memory import GIB
from cpbench.record import nvml
from cpbench.record.run_record import MemoryCap, RunMetadata
from cpbench.report.sections.run_metadata import run_lines
from cpbench.settings.schema import register
from cpbench.settings.validate import validate

# An "80 GB" H100 as torch.cuda.mem_get_info gives it: 79.19 GiB in all, 0.52 GiB held after start-up
# (the CUDA context and NCCL's buffers), 64 MiB of tensors.
TOTAL = 85_029_158_912
HELD = int(0.52 * GIB)
ALLOCATED = 64 * 2**20


def test_a_null_budget_is_the_card_less_what_the_rank_holds():
    gib, fraction = gpu_cap(None, TOTAL - HELD, TOTAL, ALLOCATED)
    assert gib == pytest.approx((TOTAL - HELD) / GIB) and 78.6 < gib < 78.7
    # The allocator may add the budget to its tensors, and no more: the context fits beside it.
    assert fraction * TOTAL == pytest.approx(ALLOCATED + gib * GIB)
    assert fraction * TOTAL + HELD - ALLOCATED == pytest.approx(TOTAL)


def test_a_budget_the_card_cannot_hold_is_what_it_can():
    """memory.budget_gib=80 on an "80 GB" card: 80 GiB was never there (docs/fold.md's row)."""
    assert gpu_cap(80.0, TOTAL - HELD, TOTAL, ALLOCATED)[0] == pytest.approx((TOTAL - HELD) / GIB)
    gib, fraction = gpu_cap(20.0, TOTAL - HELD, TOTAL, ALLOCATED)
    assert gib == 20.0 and fraction * TOTAL == pytest.approx(ALLOCATED + 20 * GIB)
    assert gpu_cap(None, TOTAL, TOTAL, TOTAL)[1] == 1.0  # never a fraction over the card


def test_the_peaks_of_a_cpu_rank_have_no_gpu_figures():
    peaks = memory.read_peaks(torch.device("cpu"))
    assert 0 < peaks.gib <= memory.read_peak_gib(torch.device("cpu"))  # the process high-water mark
    assert peaks.reserved_gib is None and peaks.device_used_gib is None


def test_nvml_used_memory_is_none_for_a_device_it_cannot_read():
    """No driver here; where there is one, no GPU has this UUID: no figure, never a guess."""
    assert nvml.used_gib("00000000-0000-0000-0000-000000000000") is None


def test_alloc_conf_sets_both_names_and_null_leaves_the_environment(clean_alloc_env):
    memory.set_alloc_conf(None)
    assert memory.alloc_conf() == "default" and not set(memory.ALLOC_CONF_VARS) & set(os.environ)
    memory.set_alloc_conf("expandable_segments:True")
    assert [os.environ[name] for name in memory.ALLOC_CONF_VARS] == ["expandable_segments:True"] * 2
    assert memory.alloc_conf() == "expandable_segments:True"
    clean_alloc_env.setenv("PYTORCH_ALLOC_CONF", "max_split_size_mb:128")
    assert memory.alloc_conf() == (
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, PYTORCH_ALLOC_CONF=max_split_size_mb:128"
    )


def test_alloc_conf_after_cuda_started_is_refused(clean_alloc_env):
    """The allocator reads its settings once: a process whose CUDA started cannot take new ones."""
    clean_alloc_env.setattr(torch.cuda, "is_initialized", lambda: True)
    with pytest.raises(RuntimeError, match="CUDA already started in this process with default"):
        memory.set_alloc_conf("expandable_segments:True")
    assert "PYTORCH_CUDA_ALLOC_CONF" not in os.environ


def _settings(*overrides: str):
    register()
    with initialize_config_module("cpbench.configs", version_base="1.3"):
        return OmegaConf.to_object(compose("config", ["output_dir=out", *overrides]))


@pytest.mark.parametrize("conf", ["expandable_segments=True", "", "True"])
def test_an_alloc_conf_torch_would_not_read_is_refused_before_the_run(conf):
    with pytest.raises(ConfigError, match="memory.alloc_conf"):
        validate(_settings(f"memory.alloc_conf='{conf}'"))
    validate(_settings("memory.alloc_conf='expandable_segments:True,max_split_size_mb:128'"))


def test_the_gpu_figures_are_recorded_and_read_back():
    meta = RunMetadata(device="NVIDIA H100 80GB HBM3", memory=MemoryCap(78.67, 0.06, 0.52),
                       alloc_conf="expandable_segments:True")  # fmt: skip
    raw = meta.to_json()
    assert (raw["held_gib"], raw["alloc_conf"]) == (0.52, "expandable_segments:True")
    assert RunMetadata.from_json(raw) == meta
    lines = "\n".join(run_lines(meta))
    assert "| GPU memory held after start-up GiB (rank 0's device) | 0.52 |" in lines
    assert "| CUDA allocator settings (PYTORCH_CUDA_ALLOC_CONF) | expandable_segments:True |" in lines
    assert "held_gib" not in RunMetadata(memory=MemoryCap(0.5, 0.27)).to_json()  # a CPU run has none
