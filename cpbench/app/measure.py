"""`python -m cpbench`'s command: the run's points and probe on its ranks, beside its cp=1 baseline
(and led by the fake-tensor estimate when asked), then who holds the peak at each edge, and
repeat_check's and mode=accuracy's verdicts; the exit code."""

from __future__ import annotations

import copy
import dataclasses
import sys

from cpbench.app.baseline import attach_baseline, refusal
from cpbench.app.interrupt import signals_end_the_run
from cpbench.app.invocation import Invocation
from cpbench.app.outcome import close_failed
from cpbench.app.peak_holders import record_peak_holders
from cpbench.app.ranks import start, tell
from cpbench.app.traces import estimate_for
from cpbench.checks.accuracy import MISMATCH
from cpbench.checks.repeat import repeat_spread
from cpbench.launch.base import Launcher
from cpbench.rank import RunSpec
from cpbench.record import run_record
from cpbench.report.single import write_report
from cpbench.results.folder import RunFolder
from cpbench.settings.cp1 import budget_left
from cpbench.settings.identity import config_hash
from cpbench.settings.schema import Mode


def measure(call: Invocation) -> int:
    """The estimate (probe.predict), the cp=1 baseline where this process starts runs, then the ranks
    and what follows them."""
    settings, launcher, folder = call.run.settings, call.run.launcher, call.folder
    spec = RunSpec(settings=settings, output_dir=str(folder.root), what_changed=call.changes)
    if settings.probe.predict:
        spec.prediction = estimate_for(call)
    if launcher.leads and launcher.starts_runs:
        baseline = attach_baseline(folder, settings, call.baseline_root, tell)
        base = baseline.folder
        if baseline.seconds:  # one budget for the command: the CP run plans for what the baseline left
            spec.settings = budget_left(settings, baseline.seconds)
        if base is not None and (refused := refusal(base)):
            print(f"cpbench: the cp=1 baseline: {refused} (baseline=false runs without it)",
                  file=sys.stderr)  # fmt: skip
            return 2
        if settings.mode is Mode.accuracy and base is None:
            return _no_reference(folder, call.run.topology.cp)
        # mode=accuracy checks every point against it; a convergence curve is compared with it
        # when no published curve is found.
        spec.reference_dir = str(base.root) if base is not None else None
    with signals_end_the_run():
        code = start(launcher, spec, call.run.workload)
        if code == 0 and launcher.leads and launcher.starts_runs and settings.probe.enabled:
            record_peak_holders(folder, settings, call.run.topology, call.run.workload)
            write_report(folder.root)
        if code == 0 and launcher.starts_runs and settings.repeat_check:
            code = _repeat_check(spec, launcher)
        if code == 0 and launcher.starts_runs and settings.mode is Mode.accuracy:
            code = _accuracy_outcome(folder, config_hash(settings))
    return code


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
        code = start(launcher, dataclasses.replace(spec, settings=again, output_dir=str(run.root)), None)
        if code:
            return code
        folders.append(run)
    check = repeat_spread([f.read_results() for f in folders], config_hash(settings))
    run_record.update(folder, repeat_check=check)
    write_report(folder.root)
    figures = ", ".join(f"{name} {value:.3g}" for name, value in check.tolerance.items())
    print(
        f"cpbench: repeat_check: largest relative spread over {check.runs} runs: {figures}", file=sys.stderr
    )
    return 0


def _accuracy_outcome(folder: RunFolder, config_hash: str) -> int:
    """1 when a point disagrees with the cp=1 run, each named with both values."""
    frame = folder.read_results()
    failed = frame[(frame["status"] == MISMATCH) & (frame["config_hash"] == config_hash)]
    for row in failed.itertuples():
        print(f"cpbench: N={row.N_tokens} differs from cp=1: {row.error}", file=sys.stderr)
    return 1 if len(failed) else 0


def _no_reference(folder: RunFolder, cp: int) -> int:
    """mode=accuracy without its cp=1 reference (it failed, or the ranks run elsewhere): no check."""
    error = "mode=accuracy: the cp=1 reference run did not finish (see baseline/ in output_dir)"
    close_failed(folder, cp, "error", error)
    print(f"cpbench: error: {error}", file=sys.stderr)
    return 1
