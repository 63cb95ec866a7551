"""`python -m cpbench`: one Hydra application. Under torchrun it is one rank; started plainly it
launches `topology.cp` local ranks itself; with `slurm.enabled=true` it submits them as one SLURM job.
In a multirun each job writes to its own folder and a failed job does not stop the sweep."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import os
import signal
import sys
import traceback
from collections.abc import Iterator
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.errors import InstantiationException
from hydra.types import RunMode
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from torch.distributed.elastic.multiprocessing.api import SignalException

from cpbench.callbacks import CheckOutputDir
from cpbench.checks.accuracy import MISMATCH
from cpbench.checks.repeat import repeat_spread
from cpbench.core import ConfigError, DoesNotFit, Topology
from cpbench.experiment.runner import run_plan
from cpbench.launch import slurm
from cpbench.launch.baseline import attach_baseline, refusal
from cpbench.launch.local import RankFailure, launch_local
from cpbench.launch.outcome import close_failed
from cpbench.plan.changes import load_job, what_changed
from cpbench.plan.footprint import Snapshot
from cpbench.probe import predict
from cpbench.probe.predict import Prediction
from cpbench.probe.state import ProbeState
from cpbench.rank import RunSpec, run_rank
from cpbench.report.markdown import what_changed_lines
from cpbench.report.single import write_report
from cpbench.results.folder import FolderLocked, RunFolder
from cpbench.runtime.rank import pick_backend
from cpbench.runtime.seed import deterministic
from cpbench.settings.identity import config_hash
from cpbench.settings.schema import BenchConfig, Mode, Workflow, register
from cpbench.settings.validate import to_settings, validate
from cpbench.workloads.adapter import WorkloadError
from cpbench.workloads.base import Workload

register()


def _under_torchrun() -> bool:
    return "TORCHELASTIC_RUN_ID" in os.environ or ("RANK" in os.environ and "WORLD_SIZE" in os.environ)


def _check_environment(settings: BenchConfig, cp: int) -> None:
    if _under_torchrun():
        world = int(os.environ["WORLD_SIZE"])
        if world != cp:
            raise ConfigError(
                f"topology.cp={cp}: torchrun started {world} rank(s); give them the same number"
            )
        local = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    else:
        local = cp
    if pick_backend(settings.dist.backend) == "nccl":
        import torch

        visible = torch.cuda.device_count()
        if local > visible:
            raise ConfigError(
                f"topology.cp={cp}: needs {local} GPUs on this node, {visible} visible (one rank per GPU)"
            )


def _check_runs_of_its_own(settings: BenchConfig) -> None:
    """mode=accuracy and repeat_check start runs of their own (the cp=1 reference, the repeats), which
    only the process that launches the ranks can."""
    asked = [
        name
        for name, on in (
            ("mode=accuracy", settings.mode is Mode.accuracy),
            ("repeat_check", settings.repeat_check),
        )
        if on
    ]
    where = "slurm.enabled=true" if settings.slurm.enabled else "torchrun" if _under_torchrun() else None
    if asked and where:
        raise ConfigError(
            f"{asked[0]}: it launches runs of its own (cp=1, repeats); "
            f"run it with `python -m cpbench`, not {where}"
        )


def _check_unused_overrides(settings: BenchConfig) -> None:
    """A setting the user gave that this workflow never reads is refused, not ignored in silence:
    workflow=convergence runs its steps at shape.*, with no walltime points and no probe."""
    if settings.workflow is not Workflow.convergence or not HydraConfig.initialized():
        return
    for override in HydraConfig.get().overrides.task:
        if override.lstrip("+~").startswith(("sweep.", "probe.")):
            raise ConfigError(
                f"{override}: workflow=convergence runs its steps at shape.* (e.g. shape.n_tokens=64), "
                "with no sweep points and no probe; drop it"
            )


def _in_submitit_job() -> bool:
    return "SUBMITIT_EXECUTOR" in os.environ


def _job_tasks_as_ranks(cp: int) -> None:
    """Under a submitit Hydra launcher every task of a job runs the whole job. One task launches the
    job's own cp ranks (so one executor config fits every cp of a sweep); exactly cp tasks are the
    ranks themselves, taking their torch.distributed environment from the job."""
    if not _in_submitit_job() or _under_torchrun():
        return
    import submitit

    tasks = submitit.JobEnvironment().num_tasks
    if tasks == 1:
        return
    if tasks != cp:
        raise ConfigError(
            f"topology.cp={cp}: this submitit job has {tasks} tasks; give each job one task "
            "(hydra.launcher.tasks_per_node=1, nodes=1: it launches its own ranks) or exactly cp tasks"
        )
    submitit.helpers.TorchDistributedEnvironment().export(set_cuda_visible_devices=False, overwrite=True)


def _build_workload(settings: BenchConfig) -> Workload:
    """Built here first so that a bad workload fails before any rank starts."""
    try:
        return instantiate(settings.workload)
    except InstantiationException as err:
        cause = err.__cause__
        if isinstance(cause, WorkloadError):
            raise ConfigError(str(cause)) from None
        raise ConfigError(
            f"workload: cannot be built from {settings.workload} ({str(err).splitlines()[0]})"
        ) from None


def _checked(cfg: DictConfig) -> tuple[BenchConfig, Topology, Workload]:
    """The run's typed settings, topology and workload, or a ConfigError naming what is wrong."""
    settings = to_settings(cfg)
    topology = validate(settings)
    if settings.slurm.enabled:
        slurm.layout(topology.cp, settings.slurm)
    else:
        _job_tasks_as_ranks(topology.cp)
        if not settings.probe.predict_only:  # the estimate alone needs no devices
            _check_environment(settings, topology.cp)
    _check_runs_of_its_own(settings)
    _check_unused_overrides(settings)
    workload = _build_workload(settings)
    if settings.workflow is Workflow.convergence and getattr(workload, "contract", "native") != "native":
        raise ConfigError("workflow=convergence: needs a workload of the native contract (cpbench steps)")
    check_topology = getattr(workload, "check_topology", None)
    if callable(check_topology):
        check_topology(topology)
    return settings, topology, workload


def run(cfg: DictConfig, in_sweep: bool = False, baseline_root: Path | None = None) -> int:
    """Validate, then run as one rank (torchrun, or cp=1), launch the ranks, or submit them to SLURM.
    Returns the exit code. In a sweep (`in_sweep`) every failure is recorded in failure.json and even
    cp=1 runs in its own process, so that one job leaves nothing behind in the next. A CP run launched
    here first measures (or finds in the cache under `baseline_root`, default output_dir itself) its
    cp=1 baseline."""
    folder = RunFolder(Path(cfg.output_dir).resolve())
    try:
        settings, topology, workload = _checked(cfg)
        deterministic(settings.mode is Mode.accuracy)  # before anything starts CUDA in this process
        changes = _what_changed(settings, workload)
    except ConfigError as err:
        print(f"cpbench: error: {err}", file=sys.stderr)
        if in_sweep:
            cp = cfg.topology.cp
            folder.record_failure(2, str(err), cp=cp if isinstance(cp, int) else None)
        elif folder.root.is_dir() and not any(folder.root.iterdir()):
            folder.root.rmdir()  # Hydra made it for this run; a rejected run leaves nothing
        return 2
    # One run per folder: the process that launches the ranks (or, under torchrun, rank 0) holds it.
    holds_lock = os.environ.get("RANK", "0") == "0"
    # In a sweep the other jobs' folders (and the merged report) are the sweep's own writes.
    before = None
    if holds_lock and not settings.slurm.enabled:
        before = Snapshot.take(Path.cwd(), (folder.root, folder.root.parent) if in_sweep else (folder.root,))
    try:
        with folder.lock() if holds_lock else contextlib.nullcontext():
            folder.clear_failure()
            if holds_lock:  # once the folder is this run's: a refused run says only why
                print("cpbench: what differs from the real job (docs/budget.md):", file=sys.stderr)
                print("\n".join(what_changed_lines(changes)), file=sys.stderr)
            spec = RunSpec(settings=settings, output_dir=str(folder.root), what_changed=changes)
            if settings.probe.predict or settings.probe.predict_only:
                spec.prediction = _predict(settings, workload, topology, folder if holds_lock else None)
                if settings.probe.predict_only:
                    return 0 if spec.prediction else 1
            if holds_lock and not _under_torchrun():
                base = attach_baseline(folder, settings, baseline_root or folder.root)
                if base is not None and (refused := refusal(base)):
                    print(f"cpbench: the cp=1 baseline: {refused} (baseline=false runs without it)",
                          file=sys.stderr)  # fmt: skip
                    return 2
                if settings.mode is Mode.accuracy and base is None:
                    return _no_reference(folder, topology.cp)
                # mode=accuracy checks every point against it; a convergence curve is compared with it
                # when no published curve is found.
                spec.reference_dir = str(base.root) if base is not None else None
            with _signals_end_the_run():
                code = _run(spec, workload, topology.cp, in_sweep)
        if before is not None:
            _check_footprint(folder, before)
        refused = refusal(folder) if holds_lock else None
        if code == 0 and refused:
            print(f"cpbench: {refused}", file=sys.stderr)
            return 2
        return code
    except FolderLocked as err:
        print(f"cpbench: error: {err}", file=sys.stderr)
        return 2
    except (KeyboardInterrupt, Interrupted, SignalException) as stop:
        return _interrupted(folder, topology.cp, stop)


def _what_changed(settings: BenchConfig, workload: Workload) -> list[dict]:
    """The what-changed table's rows, against the workload's real job or the user's `job=` file."""
    job = load_job(settings.job) if settings.job else None
    config = OmegaConf.to_container(OmegaConf.structured(settings), resolve=True, enum_to_str=True)
    return [row.as_dict() for row in what_changed(config, getattr(workload, "real_job", ()), job)]


def _check_footprint(folder: RunFolder, before: Snapshot) -> None:
    """Nothing left behind, checked after the run; the finding goes into run.json and the report."""
    found = before.compare()
    if found["left"]:
        print(f"cpbench: {found['line']}", file=sys.stderr)
    if folder.run_json.exists():
        folder.write_metadata({**folder.read_metadata(), "footprint": found})
        if folder.report.exists():
            write_report(folder.root)


def _predict(
    settings: BenchConfig, workload: Workload, topology: Topology, folder: RunFolder | None
) -> Prediction | None:
    """The fake-tensor estimate, made here before any process group starts (under torchrun, by each
    rank before it joins); the lock holder records it in prediction.json and prints it when alone."""
    try:
        prediction = predict.for_run(settings, workload, topology)
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


def _run(spec: RunSpec, workload: Workload, cp: int, in_sweep: bool) -> int:
    settings = spec.settings
    if settings.slurm.enabled:
        return _submit(spec, cp, in_sweep)
    if _under_torchrun():
        run_rank(spec, workload)
        return 0
    code = _run_local(spec, workload, cp, in_sweep)
    if code == 0 and settings.repeat_check:
        code = _repeat_check(spec, cp, in_sweep)
    if code == 0 and settings.mode is Mode.accuracy:
        code = _accuracy_outcome(RunFolder(spec.output_dir), config_hash(settings))
    return code


def _no_reference(folder: RunFolder, cp: int) -> int:
    """mode=accuracy without its cp=1 reference (it failed, or the ranks run elsewhere): no check."""
    error = "mode=accuracy: the cp=1 reference run did not finish (see baseline/ in output_dir)"
    close_failed(folder, cp, "error", error)
    print(f"cpbench: error: {error}", file=sys.stderr)
    return 1


def _repeat_check(spec: RunSpec, cp: int, in_sweep: bool) -> int:
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
        code = _run_local(
            dataclasses.replace(spec, settings=again, output_dir=str(run.root)), None, cp, in_sweep
        )
        if code:
            return code
        folders.append(run)
    spread = repeat_spread([f.read_results() for f in folders], config_hash(settings))
    folder.write_metadata({**folder.read_metadata(), "repeat_check": spread})
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


def _run_local(spec: RunSpec, workload: Workload | None, cp: int, in_sweep: bool) -> int:
    """The ranks of one run on this machine: in this process (cp=1 outside a sweep), or launched."""
    folder = RunFolder(spec.output_dir)
    try:
        if cp == 1 and not in_sweep:
            run_rank(spec, workload)
        else:
            launch_local(spec, cp, spec.settings.launch.max_restarts)
    except DoesNotFit as err:  # in this process
        return _does_not_fit(folder, cp, str(err))
    except RankFailure as failure:
        if failure.error_type == DoesNotFit.__name__:
            return _does_not_fit(folder, cp, failure.message)
        status = "crashed" if failure.crashed else "error"
        close_failed(folder, cp, status, str(failure), 1, failure.traceback)
        print(f"cpbench: {failure}", file=sys.stderr)
        if failure.traceback:
            print(failure.traceback, file=sys.stderr)
        if failure.crashed and (where := _in_flight(folder)):
            print(f"cpbench: {where} was in flight: the next run tries it again", file=sys.stderr)
        print(f"cpbench: rows measured so far are in {folder.results}", file=sys.stderr)
        return 1
    return 0


def _does_not_fit(folder: RunFolder, cp: int, error: str) -> int:
    """A run of one fixed shape that ran out of memory: its one line, and the setting to change."""
    close_failed(folder, cp, "oom", error, 2)
    print(f"cpbench: error: {error}", file=sys.stderr)
    return 2


class Interrupted(BaseException):
    """SIGTERM, raised in the main thread like SIGINT's KeyboardInterrupt, so the run can close."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def _raise_interrupted(signum: int, frame: object) -> None:
    raise Interrupted(signum)


@contextlib.contextmanager
def _signals_end_the_run() -> Iterator[None]:
    """SIGTERM (a scheduler's preemption, `kill`) ends the run as Ctrl-C does. While ranks run,
    torch's elastic agent has its own handlers (SignalException); it stops the ranks first."""
    previous = signal.signal(signal.SIGTERM, _raise_interrupted)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _in_flight(folder: RunFolder) -> str | None:
    """The point or probe N being measured, as a person reads it."""
    if row := folder.in_flight.row():
        return f"N={row['N_tokens']}"
    if (n := ProbeState(folder).in_flight) is not None:
        return f"probe N={n}"
    return None


def _interrupted(folder: RunFolder, cp: int, stop: BaseException) -> int:
    """Close an interrupted run: its point in flight marked `interrupted` (measured again on resume,
    not counted as a crash), the report written from the rows so far, failure.json; one line."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C does not cut the closing short
    signum = getattr(stop, "signum", None) or getattr(stop, "sigval", None) or signal.SIGINT
    if os.environ.get("RANK", "0") != "0":  # under torchrun: rank 0 closes the run
        return 128 + signum
    where = _in_flight(folder)
    folder.in_flight.interrupt()
    ProbeState(folder).interrupt()
    where = f"at {where}" if where else ("between points" if folder.results.exists() else "at start-up")
    line = f"interrupted {where}; run the same command to resume"
    close_failed(folder, cp, "interrupted", line, 128 + signum)
    print(f"cpbench: {line}", file=sys.stderr)
    return 128 + signum


def _submit(spec: RunSpec, cp: int, in_sweep: bool) -> int:
    """One SLURM job of cp tasks through submitit; wait for it unless told not to. A multirun under
    Hydra's basic launcher leaves the waiting to the end of the sweep, so its jobs run side by side."""
    folder, settings = RunFolder(spec.output_dir), spec.settings
    if settings.slurm.dry_run:
        path = slurm.write_script(settings, folder, cp)
        print(path.read_text())
        print(f"cpbench: sbatch script written, nothing submitted: {path}", file=sys.stderr)
        return 0
    job = slurm.submit(spec, cp)
    print(
        f"cpbench: submitted {settings.slurm.cluster} job {job.job_id} "
        f"({slurm.layout(cp, settings.slurm)}) -> {folder.root}",
        file=sys.stderr,
    )
    if not settings.slurm.wait:
        return 0
    if in_sweep and not _in_submitit_job():
        slurm.defer(job, folder, cp)
        return 0
    return slurm.finish(job, folder, cp)


def _sweep_job_dir() -> Path | None:
    """In a multirun, the job's own folder under the sweep dir; None for a single run."""
    hydra_cfg = HydraConfig.get()
    return Path(hydra_cfg.runtime.output_dir) if hydra_cfg.mode == RunMode.MULTIRUN else None


def _plan_run(cfg: DictConfig) -> int:
    """One run of an experiment plan, in this process; a run that raised is a failed run (exit 1)."""
    cfg.baseline = False  # a plan compares its runs with its own reference, not with cp=1
    try:
        return run(cfg)
    except Exception as err:
        print(f"cpbench: {type(err).__name__}: {err}".splitlines()[0], file=sys.stderr)
        return 1


@hydra.main(version_base="1.3", config_path="pkg://cpbench.configs", config_name="config")
def app(cfg: DictConfig) -> None:
    job_dir = _sweep_job_dir()
    if cfg.experiment is not None:
        if job_dir is not None:
            print("cpbench: error: experiment: a plan runs its own runs, not in a multirun", file=sys.stderr)
            raise SystemExit(2)
        overrides = HydraConfig.get().overrides.task
        code = run_plan(cfg, overrides, _checked, _plan_run)
        if code:
            raise SystemExit(code)
        return
    if job_dir is None:
        code = run(cfg)
        if code:
            raise SystemExit(code)
        return
    # A multirun: this job writes to its own folder, and its failure is recorded there instead of
    # ending the sweep; the end of the sweep lists it (cpbench.callbacks.MergeSweep).
    # Every job of the sweep shares one cp=1 baseline, cached in the sweep folder (cfg.output_dir).
    baseline_root = Path(cfg.output_dir).resolve()
    cfg.output_dir = str(job_dir)
    try:
        with _local_turn(job_dir):
            code = run(cfg, in_sweep=True, baseline_root=baseline_root)
        if code >= 128:  # interrupted: the sweep stops too
            raise SystemExit(code)
    except Exception as err:  # a rank of this process raised: record it like any failed job
        error = f"{type(err).__name__}: {err}".strip().splitlines()[0]
        folder, detail, cp = RunFolder(job_dir), traceback.format_exc(limit=-4), cfg.topology.cp
        if os.environ.get("RANK", "0") == "0":
            close_failed(folder, cp, "error", error, 1, detail, first=True)
        else:
            folder.record_failure(1, error, detail, first=True, cp=cp)
        print(f"cpbench: job failed: {error}", file=sys.stderr)


def _local_turn(job_dir: Path) -> contextlib.AbstractContextManager:
    """submitit_local starts every job of a sweep at once, on the same cores: each job (its first task:
    a job's tasks may be its ranks, which must start together) waits its turn on the sweep folder."""
    if os.environ.get("SUBMITIT_EXECUTOR") != "local":
        return contextlib.nullcontext()
    import submitit

    if submitit.JobEnvironment().global_rank != 0:
        return contextlib.nullcontext()
    return RunFolder(job_dir.parent).turn()


def main() -> None:
    try:
        app()
    except SystemExit as done:
        # Hydra exits 1 for its own config errors (an unknown key, a bad override): a bad input, as ours.
        if done.code == 1 and not CheckOutputDir.composed:
            raise SystemExit(2) from None
        raise


if __name__ == "__main__":
    main()
