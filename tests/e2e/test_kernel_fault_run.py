"""A kernel fault through the real entry point: two gloo ranks, rank 1 raising torch's own exception for
an illegal memory access (`fault.kind=kernel`) in every step at N >= 256. The fault is recorded as
`kernel` at its N, the ranks restart as for a finding (none of launch.max_restarts is spent: none is
allowed), no N from the fault up is tried again, and the report says "kernel fault at N", never out of
memory. Its classification, face by face, is tests/unit/test_failure_classes.py's."""

from __future__ import annotations

import pandas as pd
from support.processes import TIMING, cpbench, ok, results

from cpbench.torch_compat import ACCELERATOR_ERRORS

CUDA_ERROR = ACCELERATOR_ERRORS[0] if ACCELERATOR_ERRORS else RuntimeError  # what torch raises, by version

PROBE = ["topology.cp=2", "sweep.n_tokens=[]", "probe.enabled=true", "probe.start=64",
         "probe.granularity=64", "probe.measure_at_max=false", "memory.cpu_budget_gib=1",
         "launch.max_restarts=0", *TIMING]  # fmt: skip
KERNEL_FAULT = ["fault.kind=kernel", "fault.rank=1", "fault.at_n=256", "fault.where=step"]


def test_a_kernel_fault_is_recorded_restarts_outside_max_restarts_and_bounds_the_probe(tmp_path):
    out = tmp_path / "out"
    proc = ok(cpbench(*PROBE, *KERNEL_FAULT, f"output_dir={out}", cwd=tmp_path, timeout=240))
    # One restart: a second would mean an N at or above 256 was stepped again (the fault strikes there).
    restart = (
        f"cpbench: rank 1: N=256: {CUDA_ERROR.__name__}: CUDA error: an illegal memory access was "
        "encountered; recorded as a kernel fault, the ranks restart to go on (kernel-fault restart "
        "1, not counted against launch.max_restarts)"
    )
    assert restart in proc.stderr, proc.stderr
    assert proc.stderr.count("kernel-fault restart") == 1
    assert "relaunching" not in proc.stderr and "out of memory" not in proc.stderr
    trials = pd.read_csv(out / "probe.csv").set_index("N_tokens")
    assert trials.loc[256, ["fits", "status", "failure"]].tolist() == [False, "error", "kernel"]
    assert sorted(trials.index) == [64, 128, 192, 256] and trials.drop(256)["fits"].all()
    row = results(out).query("kind == 'max-fit'").iloc[0]
    assert (row["N_tokens"], row["kernel_fault_at"], row["status"]) == (192, 256, "ok")
    assert pd.isna(row["oom_at"])
    report = (out / "cp_benchmark.md").read_text()
    readout = next(line for line in report.splitlines() if line.startswith("Largest N_tokens that fits"))
    assert "The probe stopped at a kernel fault, not at the memory's edge: kernel fault at N=256" in readout
    assert not any(words in readout for words in ("out of memory", "does not fit", "OOM"))
    assert "OOM@" not in report
