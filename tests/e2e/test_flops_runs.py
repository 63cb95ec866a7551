"""Model FLOPs through `python -m cpbench` for the Pairformer and fold workloads, in one Hydra multirun
of both at cp=2: each rank's count summed, the merged report's efficiency section and MFU plot.
(axial_mix's exact counts are checked in the path matrix's cells, the DTensor adapter's in
tests/e2e/test_adapters.py.)"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from support.flops_expected import builtin, count_in_process, counted
from support.processes import cpbench, ok, results

from cpbench.sweep import resolve_shape

N = 16
WORKLOADS = {"pairformer": "pairformer_small", "fold": "fold_small"}  # the row's name: the preset


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    root = tmp_path_factory.mktemp("flops")
    out = root / "sweep"
    (root / "tmp").mkdir()  # its own temporary folder, to see what the runs leave there
    steps = ["timing.warmup=1", "timing.repeats=1", "timing.warmup_max=1", "timing.repeats_max=1"]
    # A new interpreter: the counter's first import of torch._dynamo is the run's own, under its TMPDIR.
    ok(cpbench("-m", f"workload={','.join(WORKLOADS.values())}", "topology.cp=2", f"sweep.n_tokens=[{N}]",
               "probe.enabled=false", "log.progress=false", *steps, f"output_dir={out}", cwd=root,
               timeout=400, env={"TMPDIR": str(root / "tmp")}, fresh=True))  # fmt: skip
    return results(out), (out / "cp_benchmark.md").read_text(), out


@pytest.mark.parametrize("name", WORKLOADS)
def test_the_run_counts_the_sum_of_its_ranks_shares(sweep, name):
    """The run's model_tflop is its two ranks' fake-tensor counts added, traced here one by one; the
    cp=2 total exceeds the one-rank count only by the work each rank repeats (the token-level tracks:
    at N=16, 1.3% in the Pairformer, 12.6% in fold, whose diffusion transformer runs on tokens), far
    below the 2x of a second copy of the model."""
    frame, _, _ = sweep
    workload, shape_cfg = builtin(WORKLOADS[name])
    shape = resolve_shape(shape_cfg, n_tokens=N)
    [flops] = counted(frame[frame["workload"] == name])
    assert flops == count_in_process(workload, shape, cp=2)
    assert 1.0 <= flops / count_in_process(workload, shape, cp=1) < 1.5


def test_the_merged_report_has_the_efficiency_section_and_mfu_plot(sweep):
    frame, report, out = sweep
    assert frame["mfu"].gt(0).all() and frame["tflops_per_rank"].gt(0).all()
    assert report.count("### Hardware efficiency") == 2
    assert re.search(r"\(measured: a 512\^3 float32 GEMM on \d+ thread\(s\), not a datasheet\)", report)
    assert "speed-up vs cp=1 (shared cores)" in report
    assert "![MFU vs N_tokens per cp](cp_benchmark_mfu.png)" in report
    assert (out / "cp_benchmark_mfu.png").stat().st_size > 0


def test_counting_leaves_no_compile_cache_folder_and_keeps_the_users(sweep, tmp_path):
    """torch._dynamo's first import (the counter's) makes torchinductor_<user> in the temporary folder;
    a run leaves none there, while a cache folder the user named (TORCHINDUCTOR_CACHE_DIR) is used as
    named."""
    *_, out = sweep
    assert not list((out.parent / "tmp").iterdir())
    cache = tmp_path / "cache"  # the user's, not there yet: torch makes it where they said
    load = "from cpbench.measure import flops; flops.load_counter()"
    env = {**os.environ, "TMPDIR": str(tmp_path), "TORCHINDUCTOR_CACHE_DIR": str(cache)}
    subprocess.run([sys.executable, "-c", load], env=env, check=True, timeout=120)
    assert cache.is_dir() and [p.name for p in tmp_path.iterdir()] == ["cache"]
