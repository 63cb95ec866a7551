"""One run as the user asked for it: validated, locked, its what-changed table, the estimate, its cp=1
baseline, the ranks started by its launcher (cpbench/launch/), then accuracy's and repeat_check's
verdicts; the exit code. Only the app prints to the console for the user and chooses exit codes: the
launcher raises typed errors and tells what happens through `tell`."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import sys
from itertools import groupby
from pathlib import Path

from omegaconf import DictConfig, OmegaConf
from torch.distributed.elastic.multiprocessing.api import SignalException

from cpbench.app.baseline import attach_baseline, refusal
from cpbench.app.forecast import calibrate, forecast
from cpbench.app.interrupt import Interrupted, close_interrupted, in_flight, signals_end_the_run
from cpbench.app.outcome import close_failed
from cpbench.app.peak_holders import record_peak_holders
from cpbench.app.preflight import CheckedRun, checked_run
from cpbench.app.process import this_call
from cpbench.app.traces import estimate
from cpbench.checks.accuracy import MISMATCH
from cpbench.checks.footprint import Snapshot
from cpbench.checks.repeat import repeat_spread
from cpbench.core import ConfigError, Topology
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
from cpbench.preview.changes import load_job, what_changed
from cpbench.probe import predict
from cpbench.probe.predict import Prediction
from cpbench.rank import RunSpec
from cpbench.record import run_record
from cpbench.record.run_record import Change, Footprint, RepeatCheck
from cpbench.report.sections.what_changed import what_changed_lines
from cpbench.report.single import write_report
from cpbench.results.folder import FolderLocked, RunFolder
from cpbench.runtime.seed import deterministic
from cpbench.settings.identity import config_hash
from cpbench.settings.schema import BenchConfig, Mode
from cpbench.workloads.base import Workload, traits


def run(cfg: DictConfig, in_sweep: bool = False, baseline_root: Path | None = None) -> int:
    """Validate, then start the run's ranks through its launcher (here, as local processes, as this
    rank of torchrun's world, or as a SLURM job). Returns the exit code. In a sweep (`in_sweep`) every
    failure is recorded in failure.json and even cp=1 runs in its own process, so that one job leaves
    nothing behind in the next. A CP run launched here first measures (or finds in the cache under
    `baseline_root`, default output_dir itself) its cp=1 baseline."""
    folder = RunFolder(Path(cfg.output_dir).resolve())
    try:
        checked = checked_run(cfg, in_sweep)
        deterministic(checked.settings.mode is Mode.accuracy)  # before anything starts CUDA in this process
        changes = _what_changed(checked.settings, checked.workload)
    except ConfigError as err:
        return _refused(folder, cfg, err, in_sweep)
    launcher = checked.launcher
    # One run per folder: the launching process (under torchrun, rank 0) holds it. In a sweep the other
    # jobs' folders (and the merged report) are the sweep's own writes.
    before = None
    if launcher.leads and launcher.runs_here:
        before = Snapshot.take(Path.cwd(), (folder.root, folder.root.parent) if in_sweep else (folder.root,))
    try:
        with folder.lock() if launcher.leads else contextlib.nullcontext():
            code = _campaign(folder, checked, changes, baseline_root or folder.root)
        if before is not None:
            _check_footprint(folder, before)
        refused = refusal(folder) if launcher.leads else None
        if code == 0 and refused:
            print(f"cpbench: {refused}", file=sys.stderr)
            return 2
        return code
    except FolderLocked as err:
        print(f"cpbench: error: {err}", file=sys.stderr)
        return 2
    except (KeyboardInterrupt, Interrupted, SignalException) as stop:
        return close_interrupted(folder, checked.topology.cp, stop, launcher.leads)


def _refused(folder: RunFolder, cfg: DictConfig, err: ConfigError, in_sweep: bool) -> int:
    """A bad input: one line, exit 2; a sweep's job records it, a single run leaves nothing behind."""
    print(f"cpbench: error: {err}", file=sys.stderr)
    if in_sweep:
        cp = cfg.topology.cp
        folder.record_failure(2, str(err), cp=cp if isinstance(cp, int) else None)
    elif folder.root.is_dir() and not any(folder.root.iterdir()):
        folder.root.rmdir()  # Hydra made it for this run; a rejected run leaves nothing
    return 2


def _campaign(folder: RunFolder, checked: CheckedRun, changes: list[Change], baseline_root: Path) -> int:
    """Inside the run's folder: the what-changed table, the estimate, the baseline, then the ranks."""
    settings, launcher = checked.settings, checked.launcher
    folder.clear_failure()
    if launcher.leads:  # once the folder is this run's: a refused run says only why
        print("cpbench: what differs from the real job (docs/budget.md):", file=sys.stderr)
        print("\n".join(what_changed_lines(changes)), file=sys.stderr)
    spec = RunSpec(settings=settings, output_dir=str(folder.root), what_changed=changes)
    if settings.forecast.enabled:  # python -m cpbench.forecast: no rank starts
        return forecast(folder, settings, checked.workload, changes)
    if settings.probe.predict or settings.probe.predict_only:
        lead = folder if launcher.leads else None
        spec.prediction = fake_tensor_estimate(settings, checked.workload, checked.topology, lead)
        if settings.probe.predict_only:
            return 0 if spec.prediction else 1
    if launcher.leads and launcher.starts_runs:
        base = attach_baseline(folder, settings, baseline_root, tell)
        if base is not None and (refused := refusal(base)):
            print(f"cpbench: the cp=1 baseline: {refused} (baseline=false runs without it)",
                  file=sys.stderr)  # fmt: skip
            return 2
        if settings.mode is Mode.accuracy and base is None:
            return _no_reference(folder, checked.topology.cp)
        # mode=accuracy checks every point against it; a convergence curve is compared with it
        # when no published curve is found.
        spec.reference_dir = str(base.root) if base is not None else None
    with signals_end_the_run():
        code = _start(launcher, spec, checked.workload)
        if code == 0 and launcher.leads and launcher.starts_runs and settings.probe.enabled:
            record_peak_holders(folder, settings, checked.topology, checked.workload)
            write_report(folder.root)
        if code == 0 and settings.forecast.calibrate:
            code = calibrate(folder, settings) if launcher.starts_runs else _not_here()
        if code == 0 and launcher.starts_runs and settings.repeat_check:
            code = _repeat_check(spec, launcher)
        if code == 0 and launcher.starts_runs and settings.mode is Mode.accuracy:
            code = _accuracy_outcome(folder, config_hash(settings))
    return code


def _not_here() -> int:
    """A calibration times ops in the process that started the ranks: not under torchrun's."""
    print("cpbench: error: python -m cpbench.calibrate starts its own ranks: run it without torchrun",
          file=sys.stderr)  # fmt: skip
    return 2


def tell(notice: Notice) -> None:
    """What a launcher tells while it works (a job's state changed, the ranks restart, a caution),
    one line."""
    print(f"cpbench: {notice}", file=sys.stderr)


def _what_changed(settings: BenchConfig, workload: Workload) -> list[Change]:
    """The what-changed table's rows, against the workload's real job or the user's `job=` file."""
    job = load_job(settings.job) if settings.job else None
    config = OmegaConf.to_container(OmegaConf.structured(settings), resolve=True, enum_to_str=True)
    return what_changed(config, traits(workload).real_job, job)


def _check_footprint(folder: RunFolder, before: Snapshot) -> None:
    """Nothing left behind, checked after the run; the finding goes into run.json and the report."""
    found = before.compare()
    if found["left"]:
        print(f"cpbench: {found['line']}", file=sys.stderr)
    if folder.run_json.exists():
        run_record.update(folder, footprint=Footprint.from_json(found))
        if folder.report.exists():  # the footprint line is new, the rows are those the run drew
            write_report(folder.root, redraw=False)


def fake_tensor_estimate(
    settings: BenchConfig, workload: Workload, topology: Topology, folder: RunFolder | None
) -> Prediction | None:
    """The fake-tensor estimate, made here before any process group starts (under torchrun, by each
    rank before it joins); the lock holder records it in prediction.json and prints it when alone."""
    try:
        prediction = estimate(settings, workload, topology)
    except predict.CannotTrace as err:
        then = "no estimate" if settings.probe.predict_only else "the plain probe runs"
        print(f"cpbench: probe.predict: cannot run on fake tensors: {err}; {then}", file=sys.stderr)
        return None
    if folder is None:
        return prediction
    folder.write_json(folder.prediction, prediction.as_json())
    if settings.probe.predict_only:
        print("\n".join(predict.summary(prediction)))
    else:
        print(
            f"cpbench: probe.predict: max N_tokens {prediction.proposal or 'none'} predicted within "
            f"{prediction.budget_gib:g} GiB per rank; real steps confirm it",
            file=sys.stderr,
        )
    return prediction


def _no_reference(folder: RunFolder, cp: int) -> int:
    """mode=accuracy without its cp=1 reference (it failed, or the ranks run elsewhere): no check."""
    error = "mode=accuracy: the cp=1 reference run did not finish (see baseline/ in output_dir)"
    close_failed(folder, cp, "error", error)
    print(f"cpbench: error: {error}", file=sys.stderr)
    return 1


def _repeat_check(spec: RunSpec, launcher: Launcher) -> int:
    """Run the configuration's points again (repeat_check - 1 more runs, without the probe) and record
    each figure's spread over all the runs in run.json and the report."""
    folder, settings = RunFolder(spec.output_dir), spec.settings
    again = copy.deepcopy(settings)
    again.repeat_check, again.probe.enabled = 0, False
    folders = [folder]
    for number in range(2, settings.repeat_check + 1):
        run = folder.repeat_run(number)
        print(
            f"cpbench: repeat_check: run {number} of {settings.repeat_check} -> {run.root}", file=sys.stderr
        )
        code = _start(launcher, dataclasses.replace(spec, settings=again, output_dir=str(run.root)), None)
        if code:
            return code
        folders.append(run)
    spread = repeat_spread([f.read_results() for f in folders], config_hash(settings))
    run_record.update(folder, repeat_check=RepeatCheck.from_json(spread))
    write_report(folder.root)
    figures = ", ".join(f"{name} {value:.3g}" for name, value in spread["tolerance"].items())
    print(
        f"cpbench: repeat_check: largest relative spread over {spread['runs']} runs: {figures}",
        file=sys.stderr,
    )
    return 0


def _accuracy_outcome(folder: RunFolder, config_hash: str) -> int:
    """1 when a point disagrees with the cp=1 run, each named with both values."""
    frame = folder.read_results()
    failed = frame[(frame["status"] == MISMATCH) & (frame["config_hash"] == config_hash)]
    for row in failed.itertuples():
        print(f"cpbench: N={row.N_tokens} differs from cp=1: {row.error}", file=sys.stderr)
    return 1 if len(failed) else 0


def _start(launcher: Launcher, spec: RunSpec, workload: Workload | None) -> int:
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
