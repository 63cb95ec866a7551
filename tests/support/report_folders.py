"""Run folders written with the store's own writers, with numbers chosen so that every figure of the
merged report's readout is known (`write_sweep`: a cp=1,2,4 sweep, a bfloat16 run, a failed job and a
killed one)."""

from __future__ import annotations

from pathlib import Path

from cpbench.results.folder import RunFolder
from cpbench.results.store import append_row

# Max N that fits: 1000 at cp=1, 1400 at cp=2 (1.40x), 1900 at cp=4 (1.90x; ideal 2.00x: 95%).
MAX_N = {1: 1000, 2: 1400, 4: 1900}
# Walltime (ms) and time in collectives (ms) at N=256 and N=512.
TIMES = {1: {256: (40.0, 0.0), 512: (160.0, 0.0)}, 2: {256: (25.0, 2.5), 512: (90.0, 9.0)},
         4: {256: (20.0, 12.0), 512: (50.0, 30.0)}}  # fmt: skip


def run_meta(cp: int) -> dict:
    return {
        "date": "2026-01-01 00:00:00 UTC", "host": "box", "device": "x86_64", "device_count": 1,
        "cpu_cores": 2, "backend": "gloo", "torch": "2.13.0+cpu", "cuda": "none", "topology": "1d",
        "cp": cp, "grid": f"{cp}x1", "world_size": cp, "clocks_locked": "n/a (CPU)",
        "devices_shared": "no", "config_hash": f"hash{cp}", "commit": "abc1234",
    }  # fmt: skip


def run_row(cp: int, n: int, kind: str = "point", dtype: str = "float32", **values) -> dict:
    return {
        "workload": "axial_mix", "workflow": "inference", "topology": "1d", "cp": cp, "grid": f"{cp}x1",
        "N_tokens": n, "N_atoms": 9 * n, "MSA_depth": 16, "dtype": dtype, "status": "ok",
        "peak_mem_gib": 1.0, "kind": kind, "config_hash": f"hash{cp}", **values,
    }  # fmt: skip


def write_run(folder: Path, cp: int, rows: list[dict]) -> Path:
    folder.mkdir(parents=True)
    RunFolder(folder).write_json(folder / "run.json", run_meta(cp))
    for row in rows:
        append_row(folder / "results.csv", row)
    return folder


def point_rows(cp: int, dtype: str = "float32") -> list[dict]:
    return [
        run_row(cp, n, dtype=dtype, walltime_ms=wall, walltime_iqr_ms=wall / 10, comm_ms=comm)
        for n, (wall, comm) in TIMES[cp].items()
    ]


def write_sweep(root: Path) -> Path:
    """The run folders of a sweep under `root`. Jobs 0-2: a cp=1,2,4 sweep in float32; 3: a bfloat16
    run (not comparable with them); 4: a job that failed before measuring; 5: a job killed in the middle
    of a point."""
    for job, cp in enumerate((1, 2, 4)):
        fit = run_row(cp, MAX_N[cp], kind="max-fit", oom_at=MAX_N[cp] + 64)
        write_run(root / f"{job}_cp{cp}", cp, [*point_rows(cp), fit])
    write_run(
        root / "3_cp2",
        2,
        [run_row(2, 256, dtype="bfloat16", walltime_ms=7.0, walltime_iqr_ms=0.5, comm_ms=1.0)],
    )
    (root / "4_cp8").mkdir()
    RunFolder(root / "4_cp8").record_failure(1, "rank 3 failed: RuntimeError: NCCL error", cp=8)
    killed = write_run(
        root / "5_cp4", 4, [run_row(4, 128, walltime_ms=9.0, walltime_iqr_ms=1.0, comm_ms=5.0)]
    )
    RunFolder(killed).point_in_flight.start(run_row(4, 256))
    return root
