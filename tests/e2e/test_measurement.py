"""The numbers of a results row pinned on real ranks: every rank's figures reduced through the pure
functions (tests/unit/test_measurement_reduce.py), each point's own peak, and the cross-rank agreement
on "does not fit"."""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import subprocess
import sys

import pandas as pd
import pytest
import torch.distributed as dist
from support.processes import FAST, TIMING, cpbench, ok, rank_processes, results
from support.rank_timings import EXPECTED, MS, RANKS

from cpbench.measure.point import RankSteps, _summarise, agree_fits


def _summarise_on_rank(rank: int, store: str, out: mp.Queue) -> None:
    dist.init_process_group("gloo", init_method=store, rank=rank, world_size=2)
    try:
        ops = [
            {"op": "a2a", "calls": 4, "fwd_bytes": 2**20 * (rank + 1), "bwd_bytes": 0, "seconds": 0.1 * rank}
        ]
        first = [30.0, 40.0][rank] * MS
        timed = RankSteps(RANKS[rank], 1.5 * (rank + 1), 2**20 * [4, 6][rank], ops, 0.0, first, 1, None)
        result = _summarise(timed, peak=0.5, control=dist.group.WORLD)
        # The agreement: a point fits only when it fit on every rank (rank 1 did not, then both did).
        agreed = (agree_fits(rank == 0, dist.group.WORLD), agree_fits(True, dist.group.WORLD, wait_s=30))
        out.put((rank, (result, agreed)))
    finally:
        dist.destroy_process_group()


def test_summarise_reduces_every_rank_through_the_pure_functions(tmp_path):
    """The same timings through `_summarise` in a real two-rank gloo group give the same figures; and
    `agree_fits` there says no when one rank did not fit."""
    ranks = rank_processes()
    out = ranks.Queue()
    store = f"file://{tmp_path / 'store'}"
    procs = [ranks.Process(target=_summarise_on_rank, args=(r, store, out)) for r in range(2)]
    for p in procs:
        p.start()
    try:
        got = dict(out.get(timeout=60) for _ in procs)
    except queue.Empty:
        pytest.fail("the two ranks did not report within 60 s")
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    for result, agreed in got.values():  # every rank reports the same row and the same agreement
        assert agreed == (False, True)
        assert result.status == "ok"
        for name, value in vars(EXPECTED).items():
            assert getattr(result, name) == pytest.approx(value), name
        assert result.comm_mib_per_step == pytest.approx(6)
        assert [float(v) for v in result.repeats_ms.split()] == pytest.approx([2, 2, 10])
        assert result.checksum == pytest.approx(4.5)
        assert result.repeats == 3 and result.warmup_steps == 1
        assert result.first_step_ms == pytest.approx(40)  # the slowest rank's first step
        assert result.comm_ops == [
            pytest.approx(
                {"op": "a2a", "calls": 4 / 3, "fwd_bytes": 2 * 2**20 / 3, "bwd_bytes": 0, "seconds": 0.1 / 3}
            )
        ]


def test_each_point_has_its_own_peak(tmp_path):
    """A large N then a small one in one run: the small one does not inherit the large one's peak."""
    out = tmp_path / "out"
    ok(cpbench("topology.cp=1", "sweep.n_tokens=[768,64]", *FAST, f"output_dir={out}", cwd=tmp_path))
    peak = results(out).set_index("N_tokens")["peak_mem_gib"]
    assert peak[768] - peak[64] > 0.2  # measured 0.70 and 0.28 GiB


AT_N = 64
ONE_RANK = [
    "topology.cp=2",
    "sweep.n_tokens=[32,64]",
    "fault.rank=1",
    f"fault.at_n={AT_N}",
    "fault.where=step",
]


def test_budget_overrun_on_one_rank_is_does_not_fit_for_all(tmp_path):
    """Rank 1 alone goes over its budget with every allocation served: both ranks agree it does not
    fit, in process (no restart), and the row names the rank and the reason."""
    out = tmp_path / "out"
    args = [*ONE_RANK, "fault.kind=overrun", "memory.cpu_budget_gib=0.5", *FAST, f"output_dir={out}"]
    proc = ok(cpbench(*args, cwd=tmp_path, timeout=120))
    rows = results(out).set_index("N_tokens")
    assert rows.loc[32, "status"] == "ok" and rows.loc[32, "walltime_ms"] > 0
    assert rows.loc[AT_N, "status"] == "oom"
    assert rows.loc[AT_N, "error"].startswith("rank 1: BudgetExceeded")
    assert rows.loc[AT_N, "peak_mem_gib"] > 1  # the largest over ranks: rank 1's
    assert "relaunching" not in proc.stderr


def test_budget_overrun_on_one_rank_bounds_the_probe(tmp_path):
    out = tmp_path / "out"
    probe = ["sweep.n_tokens=[16]", "probe.enabled=true", "probe.start=64", "probe.granularity=64"]
    fault = ["fault.rank=1", "fault.at_n=256", "fault.where=step", "fault.kind=overrun"]
    args = ["topology.cp=2", *probe, "probe.measure_at_max=false", "memory.cpu_budget_gib=0.5", *fault]
    args += [*TIMING, f"output_dir={out}"]
    proc = ok(cpbench(*args, cwd=tmp_path, timeout=180))
    frame = results(out)
    row = frame[frame["kind"] == "max-fit"].iloc[0]
    assert (row["N_tokens"], row["oom_at"]) == (192, 256)
    assert "relaunching" not in proc.stderr


def test_oom_inside_the_step_on_one_rank_is_does_not_fit_for_all(tmp_path):
    """Rank 1 runs out of memory between two collectives: its peer is stuck in the next one, so the
    job ends and resumes, and the point is recorded as not fitting (the rank's note), never as measured."""
    out = tmp_path / "out"
    args = [*ONE_RANK, "fault.kind=oom", "dist.agree_timeout_s=2", *FAST, f"output_dir={out}"]
    proc = ok(cpbench(*args, cwd=tmp_path, timeout=180))
    rows = results(out).set_index("N_tokens")
    assert rows.loc[32, "status"] == "ok"
    assert rows.loc[AT_N, "status"] == "oom" and pd.isna(rows.loc[AT_N, "walltime_ms"])
    assert f"rank 1: N={AT_N} does not fit: out of memory alone" in proc.stderr
    assert "crashed" not in proc.stderr  # running out of memory is a finding, not a crash


def _flight_recorder_in_rank(env: dict) -> str:
    code = (
        "import os, torch; from cpbench.core import Topology; from cpbench.runtime.rank import rank_runtime\n"
        "with rank_runtime(Topology('1d', 1, (1, 1)), 'gloo', 60, torch.float32, 0):\n"
        "    print(os.environ.get('TORCH_FR_BUFFER_SIZE'))"
    )
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    return run.stdout.strip()


def test_a_cpu_rank_keeps_no_flight_record_unless_the_environment_asks():
    """torch's flight recorder holds its last collectives in the rank's memory, which a CPU cap counts
    (7.0 MiB of peak over 30 cp=2 steps with it, 1.8 MiB without): off on CPU ranks, kept where set."""
    env = {k: v for k, v in os.environ.items() if k != "TORCH_FR_BUFFER_SIZE"}
    assert _flight_recorder_in_rank(env) == "0"
    assert _flight_recorder_in_rank({**env, "TORCH_FR_BUFFER_SIZE": "2000"}) == "2000"
