"""`python -m cpbench`: one Hydra application. Under torchrun it is one rank; started plainly it
launches `topology.cp` local ranks itself; with `slurm.enabled=true` it submits them as one SLURM job.
In a multirun each job writes to its own folder and a failed job does not stop the sweep."""

from __future__ import annotations

import os
import sys
import traceback
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.errors import InstantiationException
from hydra.types import RunMode
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from cpbench.bench import RunSpec, run_rank
from cpbench.config.schema import register
from cpbench.config.validate import ConfigError, validate
from cpbench.launch import slurm
from cpbench.launch.local import RankFailure, launch_local
from cpbench.launch.outcome import clear_failure, record_failure
from cpbench.report.markdown import write_report
from cpbench.runtime.rank import pick_backend
from cpbench.sweep import InFlight
from cpbench.workloads.adapter import WorkloadError

register()


def _under_torchrun() -> bool:
    return "TORCHELASTIC_RUN_ID" in os.environ or ("RANK" in os.environ and "WORLD_SIZE" in os.environ)


def _check_environment(cfg: DictConfig, cp: int) -> None:
    if _under_torchrun():
        world = int(os.environ["WORLD_SIZE"])
        if world != cp:
            raise ConfigError(
                f"topology.cp={cp}: torchrun started {world} rank(s); give them the same number"
            )
        local = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    else:
        local = cp
    if pick_backend(cfg.dist.backend) == "nccl":
        import torch

        visible = torch.cuda.device_count()
        if local > visible:
            raise ConfigError(
                f"topology.cp={cp}: needs {local} GPUs on this node, {visible} visible (one rank per GPU)"
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


def _check_workload(cfg: DictConfig) -> None:
    try:
        instantiate(cfg.workload)
    except InstantiationException as err:
        cause = err.__cause__
        if isinstance(cause, WorkloadError):
            raise ConfigError(str(cause)) from None
        raise ConfigError(
            f"workload: cannot be built from {OmegaConf.to_container(cfg.workload)} "
            f"({str(err).splitlines()[0]})"
        ) from None


def run(cfg: DictConfig, in_sweep: bool = False) -> int:
    """Validate, then run as one rank (torchrun, or cp=1), launch the ranks, or submit them to SLURM.
    Returns the exit code. In a sweep (`in_sweep`) every failure is recorded in failure.json and even
    cp=1 runs in its own process, so that one job leaves nothing behind in the next."""
    output_dir = Path(cfg.output_dir).resolve()
    to_slurm = cfg.slurm.enabled
    try:
        topology = validate(cfg)
        if to_slurm:
            slurm.layout(topology.cp, cfg.slurm)
        else:
            _job_tasks_as_ranks(topology.cp)
            _check_environment(cfg, topology.cp)
        _check_workload(cfg)
    except ConfigError as err:
        print(f"cpbench: error: {err}", file=sys.stderr)
        if in_sweep:
            record_failure(output_dir, 2, str(err))
        elif output_dir.is_dir() and not any(output_dir.iterdir()):
            output_dir.rmdir()  # Hydra made it for this run; a rejected run leaves nothing
        return 2
    clear_failure(output_dir)
    spec = RunSpec(
        cfg=OmegaConf.to_container(cfg, resolve=True, enum_to_str=True), output_dir=str(output_dir)
    )
    if to_slurm:
        return _submit(spec, cfg, topology.cp, in_sweep)
    if _under_torchrun() or (topology.cp == 1 and not in_sweep):
        run_rank(spec)
        return 0
    try:
        launch_local(spec, topology.cp, cfg.launch.max_restarts)
    except RankFailure as failure:
        InFlight(output_dir).close("crashed" if failure.crashed else "error", str(failure))
        write_report(output_dir)
        record_failure(output_dir, 1, str(failure), failure.traceback)
        print(f"cpbench: {failure}", file=sys.stderr)
        if failure.traceback:
            print(failure.traceback, file=sys.stderr)
        print(f"cpbench: rows measured so far are in {output_dir / 'results.csv'}", file=sys.stderr)
        return 1
    return 0


def _submit(spec: RunSpec, cfg: DictConfig, cp: int, in_sweep: bool) -> int:
    """One SLURM job of cp tasks through submitit; wait for it unless told not to. A multirun under
    Hydra's basic launcher leaves the waiting to the end of the sweep, so its jobs run side by side."""
    output_dir = Path(spec.output_dir)
    if cfg.slurm.dry_run:
        path = slurm.write_script(cfg, output_dir, cp)
        print(path.read_text())
        print(f"cpbench: sbatch script written, nothing submitted: {path}", file=sys.stderr)
        return 0
    job = slurm.submit(spec, cfg, cp)
    print(
        f"cpbench: submitted {cfg.slurm.cluster} job {job.job_id} "
        f"({slurm.layout(cp, cfg.slurm)}) -> {output_dir}",
        file=sys.stderr,
    )
    if not cfg.slurm.wait:
        return 0
    if in_sweep and not _in_submitit_job():
        slurm.defer(job, output_dir)
        return 0
    return slurm.finish(job, output_dir)


def _sweep_job_dir() -> Path | None:
    """In a multirun, the job's own folder under the sweep dir; None for a single run."""
    hydra_cfg = HydraConfig.get()
    return Path(hydra_cfg.runtime.output_dir) if hydra_cfg.mode == RunMode.MULTIRUN else None


@hydra.main(version_base="1.3", config_path="pkg://cpbench.configs", config_name="config")
def app(cfg: DictConfig) -> None:
    job_dir = _sweep_job_dir()
    if job_dir is None:
        code = run(cfg)
        if code:
            raise SystemExit(code)
        return
    # A multirun: this job writes to its own folder, and its failure is recorded there instead of
    # ending the sweep; the end of the sweep lists it (cpbench.callbacks.MergeSweep).
    cfg.output_dir = str(job_dir)
    try:
        run(cfg, in_sweep=True)
    except Exception as err:  # a rank of this process raised: record it like any failed job
        error = f"{type(err).__name__}: {err}".strip().splitlines()[0]
        if os.environ.get("RANK", "0") == "0":
            InFlight(job_dir).close("error", error)
            write_report(job_dir)
        record_failure(job_dir, 1, error, traceback.format_exc(limit=-4), first=True)
        print(f"cpbench: job failed: {error}", file=sys.stderr)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
