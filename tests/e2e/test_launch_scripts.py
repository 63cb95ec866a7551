"""The scripts in launch/, run as a user runs them: launch/torchrun.sh gives torchrun restarts, so a rank
killed mid-run is started again and the run resumes, and a rendezvous store of their own for each (with
the store shared, pytorch/pytorch#135712: cpbench says so in one line, which must not appear here)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from support.processes import BASE, FAST, ok, results, run_cmd

ROOT = Path(__file__).resolve().parents[2]


def test_torchrun_sh_restarts_a_killed_rank_with_a_store_of_its_own(tmp_path):
    # torchrun from this interpreter's environment, as a venv's activation puts it on PATH; the
    # fold-cp-style test adapter (tests/adapters, on PYTHONPATH) kills rank 1 once at N=32.
    env = {
        "PATH": os.pathsep.join((str(Path(sys.executable).parent), os.environ["PATH"])),
        "MAX_RESTARTS": "1",
        "CPBENCH_TEST_KILL_ONCE": f"1:32:{tmp_path / 'killed'}",
    }
    adapter = ["workload=adapter", "workload.module=adapters.fold_cp_style", "workload.contract=native"]
    args = [
        *BASE,
        *adapter,
        *FAST,
        "topology.cp=2",
        "sweep.n_tokens=[16,32]",
        f"output_dir={tmp_path / 'out'}",
    ]
    proc = ok(run_cmd(["bash", str(ROOT / "launch" / "torchrun.sh"), "2", *args], tmp_path, 240, env))
    assert (tmp_path / "killed").exists()
    assert "pytorch/pytorch#135712" not in proc.stdout + proc.stderr
    rows = results(tmp_path / "out")
    assert list(zip(rows["N_tokens"], rows["status"], strict=True)) == [(16, "ok"), (32, "ok")]
