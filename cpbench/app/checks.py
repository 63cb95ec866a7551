"""What the app checks before any rank starts: the settings against this environment (torchrun's
world, a submitit job's tasks, the visible GPUs), and the workload built once, so that a bad input is
one line and exit 2 with nothing started."""

from __future__ import annotations

import os

from hydra.core.hydra_config import HydraConfig
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import DictConfig

from cpbench.core import ConfigError, Topology
from cpbench.launch import slurm
from cpbench.runtime.rank import pick_backend
from cpbench.settings.schema import BenchConfig, Mode, Workflow
from cpbench.settings.validate import to_settings, validate
from cpbench.workloads.adapter import WorkloadError
from cpbench.workloads.base import Workload


def under_torchrun() -> bool:
    return "TORCHELASTIC_RUN_ID" in os.environ or ("RANK" in os.environ and "WORLD_SIZE" in os.environ)


def _check_environment(settings: BenchConfig, cp: int) -> None:
    if under_torchrun():
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


def check_runs_of_its_own(settings: BenchConfig) -> None:
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
    where = "slurm.enabled=true" if settings.slurm.enabled else "torchrun" if under_torchrun() else None
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


def in_submitit_job() -> bool:
    return "SUBMITIT_EXECUTOR" in os.environ


def _job_tasks_as_ranks(cp: int) -> None:
    """Under a submitit Hydra launcher every task of a job runs the whole job. One task launches the
    job's own cp ranks (so one executor config fits every cp of a sweep); exactly cp tasks are the
    ranks themselves, taking their torch.distributed environment from the job."""
    if not in_submitit_job() or under_torchrun():
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


def checked(cfg: DictConfig) -> tuple[BenchConfig, Topology, Workload]:
    """The run's typed settings, topology and workload, or a ConfigError naming what is wrong."""
    settings = to_settings(cfg)
    topology = validate(settings)
    if settings.slurm.enabled:
        slurm.layout(topology.cp, settings.slurm)
    else:
        _job_tasks_as_ranks(topology.cp)
        if not settings.probe.predict_only:  # the estimate alone needs no devices
            _check_environment(settings, topology.cp)
    check_runs_of_its_own(settings)
    _check_unused_overrides(settings)
    workload = _build_workload(settings)
    if settings.workflow is Workflow.convergence and getattr(workload, "contract", "native") != "native":
        raise ConfigError("workflow=convergence: needs a workload of the native contract (cpbench steps)")
    check_topology = getattr(workload, "check_topology", None)
    if callable(check_topology):
        check_topology(topology)
    return settings, topology, workload
