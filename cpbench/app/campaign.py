"""One call as the user made it: validated, locked, its what-changed table, then its command
(app/commands.py), and nothing left behind; the exit code. Only the app prints to the console for
the user and chooses exit codes."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

from omegaconf import DictConfig, OmegaConf
from torch.distributed.elastic.multiprocessing.api import SignalException

from cpbench.app.baseline import refusal
from cpbench.app.commands import COMMANDS
from cpbench.app.interrupt import Interrupted, close_interrupted
from cpbench.app.invocation import CheckedRun, Invocation
from cpbench.app.preflight import checked_run
from cpbench.checks.footprint import Snapshot
from cpbench.core import ConfigError
from cpbench.preview.changes import load_job, what_changed
from cpbench.record import run_record
from cpbench.record.run_record import Change
from cpbench.report.sections.what_changed import what_changed_lines
from cpbench.report.single import write_report
from cpbench.results import lock
from cpbench.results.folder import RunFolder
from cpbench.results.lock import FolderLocked
from cpbench.runtime.seed import deterministic
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
        with lock.hold(folder) if launcher.leads else contextlib.nullcontext():
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
    """Inside the run's folder: the what-changed table, then the command."""
    folder.clear_failure()
    if checked.launcher.leads:  # once the folder is this run's: a refused run says only why
        print("cpbench: what differs from the real job (docs/budget.md):", file=sys.stderr)
        print("\n".join(what_changed_lines(changes)), file=sys.stderr)
    call = Invocation(checked, folder, changes, baseline_root)
    return COMMANDS[checked.settings.command].run(call)


def _what_changed(settings: BenchConfig, workload: Workload) -> list[Change]:
    """The what-changed table's rows, against the workload's real job or the user's `job=` file."""
    job = load_job(settings.job) if settings.job else None
    config = OmegaConf.to_container(OmegaConf.structured(settings), resolve=True, enum_to_str=True)
    return what_changed(config, traits(workload).real_job, job)


def _check_footprint(folder: RunFolder, before: Snapshot) -> None:
    """Nothing left behind, checked after the run; the finding goes into run.json and the report."""
    found = before.compare()
    if found.left:
        print(f"cpbench: {found.line}", file=sys.stderr)
    if folder.run_json.exists():
        run_record.update(folder, footprint=found)
        if folder.report.exists():  # the footprint line is new, the rows are those the run drew
            write_report(folder.root, redraw=False)
