"""How a run that did not finish is closed, the same after every launcher (local, torchrun, SLURM):
its point in flight recorded, the report written from the rows so far, failure.json kept."""

from __future__ import annotations

from cpbench.measure.oom import classify
from cpbench.report.single import write_report
from cpbench.results.folder import RunFolder
from cpbench.results.row import OOM


def close_failed(
    folder: RunFolder, cp: int, status: str, error: str, code: int = 1, detail: str = "", first: bool = False
) -> None:
    """`status` error: a rank raised, the point in flight is recorded so, with its failure class read
    from `error` (failure.json keeps it too). crashed (a kill, a lost peer) or interrupted: it stays in
    flight and the next run measures it again."""
    failure = OOM if status == "oom" else "" if status == "interrupted" else classify(error)
    if status == "error":
        folder.point_in_flight.close(status, error, failure)
    # No plots here: this is the launching process, and in a sweep it forks the next job's ranks,
    # which hang after matplotlib has drawn in their parent (tests/e2e/test_sweeps.py, a failed job first).
    write_report(folder.root, plots=False)
    folder.record_failure(code, error, detail, first=first, cp=cp, failure=failure)
