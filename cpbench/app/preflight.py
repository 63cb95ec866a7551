"""What the app checks before any rank starts: the settings, the launcher's own checks (torchrun's
world, a submitit job's tasks, the visible GPUs, a SLURM job's layout), and the workload built once,
so that a bad input is one line and exit 2 with nothing started."""

from __future__ import annotations

from hydra.core.hydra_config import HydraConfig
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import DictConfig

from cpbench.app.commands import COMMANDS
from cpbench.app.invocation import CheckedRun
from cpbench.core import ConfigError, Topology
from cpbench.launch.base import Launcher
from cpbench.launch.registry import launcher_for
from cpbench.results.pooled import run_folders
from cpbench.runtime.rank import check_socket_ifname, device_type, pick_backend
from cpbench.settings.schema import BenchConfig, Mode, Workflow
from cpbench.settings.validate import to_settings, validate
from cpbench.workloads.adapter import FoldCPAdapter, WorkloadError
from cpbench.workloads.base import Contract, Workload, traits


def check_runs_of_its_own(settings: BenchConfig, launcher: Launcher | None = None) -> None:
    """mode=accuracy and repeat_check start runs of their own (the cp=1 reference, the repeats), which
    only a launcher that starts runs from this process can."""
    asked = [
        name
        for name, on in (
            ("mode=accuracy", settings.mode is Mode.accuracy),
            ("repeat_check", settings.repeat_check),
        )
        if on
    ]
    launcher = launcher or launcher_for(settings)
    if asked and not launcher.starts_runs:
        raise ConfigError(
            f"{asked[0]}: it launches runs of its own (cp=1, repeats); "
            f"run it with `python -m cpbench`, not {launcher.named}"
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


def _build_workload(settings: BenchConfig) -> Workload:
    """Built here first so that a bad workload fails before any rank starts."""
    try:
        return instantiate(settings.workload)
    except InstantiationException as err:
        cause = err.__cause__
        if isinstance(cause, WorkloadError):
            raise ConfigError(str(cause)) from None
        if isinstance(cause, ValueError):  # a built-in workload's own check names its knob
            raise ConfigError(f"workload.{cause}") from None
        raise ConfigError(
            f"workload: cannot be built from {settings.workload} ({str(err).splitlines()[0]})"
        ) from None


def checked_run(cfg: DictConfig, in_sweep: bool = False) -> CheckedRun:
    """The run of `cfg` (`in_sweep`: a job of a multirun), or a ConfigError naming what is wrong."""
    settings = to_settings(cfg)
    topology = validate(settings)
    launcher = launcher_for(settings, in_sweep)
    ranks_run = COMMANDS[settings.command].starts_ranks
    launcher.validate(topology, ranks_run=ranks_run)
    if ranks_run and launcher.runs_here:  # a SLURM job's ranks check their own nodes' interfaces
        check_socket_ifname(settings.dist.socket_ifname)
    check_runs_of_its_own(settings, launcher)
    _check_unused_overrides(settings)
    workload = _build_workload(settings)
    declared = traits(workload)
    if ranks_run and launcher.runs_here and declared.check_device is not None:  # as the interfaces
        declared.check_device(device_type(pick_backend(settings.dist.backend)))
    if settings.workflow is Workflow.convergence and declared.contract is not Contract.native:
        raise ConfigError("workflow=convergence: needs a workload of the native contract (cpbench steps)")
    if declared.check_topology is not None:
        declared.check_topology(topology)
    _check_takes_inputs(settings, workload)
    f = settings.forecast
    for key, where in (("forecast.against", f.against), ("forecast.pool", f.pool)):
        if where:  # the runs a forecast or a calibration reads, there before anything is counted or run
            run_folders(key, where)
    return CheckedRun(settings, topology, workload, launcher)


def _check_takes_inputs(settings: BenchConfig, workload: Workload) -> None:
    """A feature file is read by the workload's build_batch or refused: never measured as if read."""
    declared = traits(workload)
    if settings.data.path is None or declared.takes_inputs:
        return
    name = declared.name
    how = (
        "add `*, features` to its build_batch signature (docs/adapters.md)"
        if isinstance(workload, FoldCPAdapter)
        else "its batch is synthesized (a class that reads the file declares takes_inputs = True); "
        "use workload=fold or pairformer, or unset data.path"
    )
    raise ConfigError(f"data.path={settings.data.path}: workload {name} cannot take a feature file; {how}")


def checked(cfg: DictConfig) -> tuple[BenchConfig, Topology, Workload]:
    """The run's typed settings, topology and workload, or a ConfigError naming what is wrong."""
    run = checked_run(cfg)
    return run.settings, run.topology, run.workload
