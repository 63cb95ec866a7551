"""Every run records the allocator settings its ranks ran with."""

from __future__ import annotations

import json

from support.processes import FAST, cpbench, ok

from cpbench.results.folder import RunFolder


def test_every_run_records_the_allocator_settings_its_ranks_ran_with(tmp_path):
    out = tmp_path / "out"
    ok(cpbench("topology.cp=1", *FAST, "sweep.n_tokens=[16]", "memory.alloc_conf=expandable_segments:True",
               f"output_dir={out}", cwd=tmp_path))  # fmt: skip
    assert json.loads(RunFolder(out).run_json.read_text())["alloc_conf"] == "expandable_segments:True"
    assert (
        "| CUDA allocator settings (PYTORCH_CUDA_ALLOC_CONF) | expandable_segments:True |"
        in (out / "cp_benchmark.md").read_text()
    )
