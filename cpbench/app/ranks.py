"""The ranks of one run, started by its launcher (cpbench/launch/), and what they ended with: told in
one line each and turned into an exit code; a submitted job waited for now or at the end of a sweep,
and its run closed. Only the app prints for the user: launchers raise typed errors and tell what
happens through `tell`."""

from __future__ import annotations

import sys
from itertools import groupby

from cpbench.app.interrupt import in_flight
from cpbench.app.outcome import close_failed
from cpbench.app.process import this_call
from cpbench.launch.base import (
    Finished,
    Launcher,
    Notice,
    RankFailure,
    ScriptWritten,
    ShapeDoesNotFit,
    Submitted,
    Waiting,
)
from cpbench.rank import RunSpec
from cpbench.results.folder import RunFolder
from cpbench.workloads.base import Workload


def start(launcher: Launcher, spec: RunSpec, workload: Workload | None) -> int:
    """The ranks of one run, started by `launcher`; what it ended with, told, as an exit code."""
    folder, cp = RunFolder(spec.output_dir), spec.settings.topology.cp
    try:
        outcome = launcher.start(spec, workload, tell)
    except ShapeDoesNotFit as err:
        return _does_not_fit(folder, cp, str(err))
    except RankFailure as failure:
        return _rank_failed(folder, cp, failure)
    if isinstance(outcome, Finished):
        return 0
    if isinstance(outcome, ScriptWritten):
        print(outcome.path.read_text())
        print(f"cpbench: sbatch script written, nothing submitted: {outcome.path}", file=sys.stderr)
        return 0
    print(f"cpbench: submitted {outcome.what} -> {folder.root}", file=sys.stderr)
    if outcome.waiting is Waiting.sweep_end:
        this_call().deferred.append((launcher, outcome))
        return 0
    return _finish(launcher, [outcome]) if outcome.waiting is Waiting.now else 0


def _rank_failed(folder: RunFolder, cp: int, failure: RankFailure) -> int:
    status = "crashed" if failure.crashed else "error"
    close_failed(folder, cp, status, str(failure), 1, failure.traceback)
    print(f"cpbench: {failure}", file=sys.stderr)
    if failure.traceback:
        print(failure.traceback, file=sys.stderr)
    if failure.crashed and (where := in_flight(folder)):
        print(f"cpbench: {where} was in flight: the next run tries it again", file=sys.stderr)
    print(f"cpbench: rows measured so far are in {folder.results}", file=sys.stderr)
    return 1


def _finish(launcher: Launcher, jobs: list[Submitted]) -> int:
    """Wait for submitted jobs, then close each run: a rank that raised records its point in flight as
    `error`; a job the scheduler stopped leaves it in flight for the next run of the same command.
    1 if any failed."""
    failed = False
    for job, failure in zip(jobs, launcher.wait(jobs, tell), strict=True):
        folder = RunFolder(job.output_dir)
        if failure is None:
            print(f"cpbench: job {job.job_id} done: {folder.root}", file=sys.stderr)
            continue
        failed, line = True, failure.line
        if failure.status != "error":
            where = f"at {where}" if (where := in_flight(folder)) else None
            line += f" ({'; '.join(filter(None, [where, 'run the same command to resume']))})"
        close_failed(folder, job.cp, failure.status, line, 1, f"task logs: {failure.logs}")
        print(f"cpbench: {line}; task logs are in {failure.logs}", file=sys.stderr)
    return 1 if failed else 0


def finish_deferred() -> int:
    """At the end of a multirun: wait for every job it left running, and close their runs; 1 if any
    failed."""
    call = this_call()
    pending, call.deferred = call.deferred, []
    codes = [
        _finish(group[0][0], [job for _, job in group])
        for _, group in ((kind, list(jobs)) for kind, jobs in groupby(pending, key=lambda p: type(p[0])))
    ]
    return max(codes, default=0)


def _does_not_fit(folder: RunFolder, cp: int, error: str) -> int:
    """A run of one fixed shape that ran out of memory: its one line, and the setting to change."""
    close_failed(folder, cp, "oom", error, 2)
    print(f"cpbench: error: {error}", file=sys.stderr)
    return 2


def tell(notice: Notice) -> None:
    """What a launcher tells while it works (a job's state changed, the ranks restart, a caution),
    one line."""
    print(f"cpbench: {notice}", file=sys.stderr)
