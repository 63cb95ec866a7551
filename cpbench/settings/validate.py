"""From Hydra's config to typed settings, and the checks no type can express: each failure names
the setting and what is allowed."""

from __future__ import annotations

import re

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from cpbench.core import ConfigError, Topology
from cpbench.settings.schema import BenchConfig, Command, Workflow
from cpbench.settings.workload_config import workload_settings

__all__ = ["ConfigError", "to_settings", "validate"]

MATMUL_PRECISIONS = ("highest", "high", "medium")  # torch.set_float32_matmul_precision


def to_settings(cfg: DictConfig) -> BenchConfig:
    """The run's settings as typed objects, made once; everything below reads these. The workload's
    preset is Hydra's choice for the group (`workload=fold_small`), which the ranks cannot look up; a
    `_target_` given alone takes only its own keys, and its class names it (settings/workload_config.py)."""
    settings = OmegaConf.to_object(cfg)
    overrides = HydraConfig.get().overrides.task if HydraConfig.initialized() else []
    settings.workload, label = workload_settings(settings.workload, overrides)
    if not settings.workload_preset and HydraConfig.initialized():
        settings.workload_preset = label or HydraConfig.get().runtime.choices.get("workload") or ""
    return settings


SAMPLES_BY_WORKFLOW = (
    "workload.diffusion_samples={counts}: the samples are set per workflow, e.g. "
    "workload.diffusion_samples.inference={counts} (or .training)"
)


def workload_samples(settings: BenchConfig) -> int | None:
    """The workload's own diffusion samples per trunk pass in the run's workflow (its
    `diffusion_samples`); None for a workload without a diffusion batch."""
    counts = settings.workload.get("diffusion_samples") if isinstance(settings.workload, dict) else None
    if counts is None:
        return None
    if not isinstance(counts, dict):
        raise ConfigError(SAMPLES_BY_WORKFLOW.format(counts=counts))
    training = settings.workflow in (Workflow.training, Workflow.convergence)
    return counts.get("training" if training else "inference")


def _positive(name: str, value, allow_null: bool = False) -> None:
    if value is None and allow_null:
        return
    if value is None or value <= 0:
        raise ConfigError(f"{name}={value}: must be > 0")


def _check_forecast(settings: BenchConfig) -> None:
    """The time model's settings (docs/predict.md): sizes that are sizes, and a calibration run
    where its ranks start from this process."""
    f = settings.forecast
    for key in ("n_tokens", "cp", "plan_n_tokens"):
        for value in getattr(f, key) or []:
            _positive(f"forecast.{key}", value)
    _positive("forecast.ranks_per_node", f.ranks_per_node, allow_null=True)
    _positive("forecast.plan_max_cp", f.plan_max_cp)
    calibrating = settings.command is Command.calibrate
    if f.pool and not calibrating:
        raise ConfigError("forecast.pool: the runs a calibration pools, python -m cpbench.calibrate's "
                          "(a forecast's forecast.against takes a glob pattern itself)")  # fmt: skip
    if calibrating and settings.slurm.enabled:
        raise ConfigError("python -m cpbench.calibrate times ops in this process: slurm.enabled=false")


def _check_alloc_conf(conf: str | None) -> None:
    """The form PYTORCH_CUDA_ALLOC_CONF takes, `option:value[,option:value...]`: a rank would otherwise
    fail only when CUDA starts, or run with the setting silently ignored."""
    if conf is not None and not re.fullmatch(r"\s*\w+\s*:.*\S.*", conf):
        raise ConfigError(
            f"memory.alloc_conf={conf!r}: must be option:value[,option:value...] as "
            "PYTORCH_CUDA_ALLOC_CONF takes it, e.g. expandable_segments:True"
        )


def _check_socket_ifname(names: str | None) -> None:
    """Exact interface names, as gloo takes them (whether this machine has them is the rank's check:
    a SLURM job's nodes are not the login node, runtime/rank.py `check_socket_ifname`)."""
    if names is not None and not all(re.fullmatch(r"[^\s,/:^=]{1,15}", name) for name in names.split(",")):
        raise ConfigError(
            f"dist.socket_ifname={names!r}: network interface names, comma-separated and exact "
            "(e.g. eth0 or ib0,ib1), not prefixes or NCCL's ^/= patterns"
        )


def validate(settings: BenchConfig) -> Topology:
    """Validate the run's settings and return its topology."""
    t = settings.topology
    topology = Topology.from_config(t.kind, t.cp, t.grid)
    shape, sweep = settings.shape, settings.sweep
    for key in ("n_tokens", "atoms_per_token", "msa_depth"):
        _positive(f"shape.{key}", getattr(shape, key))
    _positive("shape.n_atoms", shape.n_atoms, allow_null=True)
    _positive("dist.cpu_threads", settings.dist.cpu_threads, allow_null=True)
    _check_forecast(settings)
    if workload_samples(settings) is None and any(v is not None for v in sweep.diffusion_samples):
        raise ConfigError(
            f"sweep.diffusion_samples={list(sweep.diffusion_samples)}: this workload has no diffusion "
            "batch (no `workload.diffusion_samples`; workload=fold has one)"
        )
    for key in ("n_tokens", "n_atoms", "msa_depth", "diffusion_samples"):
        values = list(getattr(sweep, key))
        if not values and (key != "n_tokens" or not settings.probe.enabled):
            # No N_tokens at all is the probe alone; without it the run would measure nothing.
            alone = "" if key != "n_tokens" else ", or probe.enabled=true for the probe alone"
            raise ConfigError(f"sweep.{key}=[]: give at least one value (null takes shape.*{alone})")
        for value in values:
            if value is not None and (not isinstance(value, int) or value <= 0):
                raise ConfigError(f"sweep.{key}={values}: entries must be integers > 0 or null")
    for n in sweep.n_tokens:
        if n is not None and not topology.accepts(n):
            raise ConfigError(
                f"sweep.n_tokens={list(sweep.n_tokens)}: {n} does not tile the "
                f"{topology.grid_label} grid of topology.kind={topology.kind}"
            )
    timing = settings.timing
    if timing.repeats < 1:
        raise ConfigError(f"timing.repeats={timing.repeats}: must be >= 1")
    if timing.warmup < 1:
        raise ConfigError(f"timing.warmup={timing.warmup}: must be >= 1 (the first steps are not timed)")
    _positive("measure.peak_tflops", settings.measure.peak_tflops, allow_null=True)
    b = settings.budget
    _positive("budget.minutes", b.minutes, allow_null=True)
    _positive("budget.cuda_minutes", b.cuda_minutes, allow_null=True)
    if b.min_repeats < 1:
        raise ConfigError(f"budget.min_repeats={b.min_repeats}: must be >= 1")
    for key in ("warmup_max", "repeats_max"):
        if getattr(timing, key) < 1:
            raise ConfigError(
                f"timing.{key}={getattr(timing, key)}: must be >= 1 (below its floor it fixes the count)"
            )
    _positive("timing.settle_pct", timing.settle_pct)
    _positive("timing.iqr_pct", timing.iqr_pct)
    if settings.repeat_check == 1 or settings.repeat_check < 0:
        raise ConfigError(f"repeat_check={settings.repeat_check}: must be 0 (off) or >= 2 (runs in all)")
    _positive("accuracy.rtol", settings.accuracy.rtol, allow_null=True)
    p = settings.probe
    _positive("probe.start", p.start)
    _positive("probe.granularity", p.granularity)
    _positive("probe.max_tokens", p.max_tokens, allow_null=True)
    if p.factor <= 1:
        raise ConfigError(f"probe.factor={p.factor}: must be > 1")
    if p.warmup < 0:
        raise ConfigError(f"probe.warmup={p.warmup}: must be >= 0")
    predict_alone = settings.command is Command.predict
    if p.predict and not p.enabled and not predict_alone:
        raise ConfigError(
            "probe.predict=true: it leads the probe; set probe.enabled=true, "
            "or run python -m cpbench.predict for the estimate alone"
        )
    memory = settings.memory
    if (p.predict or predict_alone) and memory.budget_gib is None and memory.cpu_budget_gib is None:
        raise ConfigError("probe.predict: needs a per-rank budget: set memory.budget_gib")
    _positive("memory.budget_gib", settings.memory.budget_gib, allow_null=True)
    _positive("memory.cpu_budget_gib", settings.memory.cpu_budget_gib, allow_null=True)
    _check_alloc_conf(settings.memory.alloc_conf)
    if settings.launch.max_restarts < 0:
        raise ConfigError(f"launch.max_restarts={settings.launch.max_restarts}: must be >= 0")
    _check_fault(settings, topology.cp)
    _check_convergence(settings, topology)
    _positive("dist.timeout_s", settings.dist.timeout_s)
    _positive("dist.agree_timeout_s", settings.dist.agree_timeout_s)
    if settings.dist.backend not in (None, "gloo", "nccl"):
        raise ConfigError(f"dist.backend={settings.dist.backend}: allowed values are null (auto), gloo, nccl")
    _check_socket_ifname(settings.dist.socket_ifname)
    if settings.matmul_precision not in MATMUL_PRECISIONS:
        raise ConfigError(
            f"matmul_precision={settings.matmul_precision}: allowed values are {', '.join(MATMUL_PRECISIONS)}"
        )
    if settings.data.path is not None:
        _check_data(settings)
    return topology


def _check_fault(settings: BenchConfig, cp: int) -> None:
    f = settings.fault
    if f.kind not in ("oom", "kill", "overrun", "perturb", "kernel"):
        raise ConfigError(f"fault.kind={f.kind}: allowed values are oom, kill, overrun, perturb, kernel")
    if f.kind == "perturb" and f.where != "step":
        raise ConfigError(
            f"fault.where={f.where}: fault.kind=perturb changes the step's outputs; use where=step"
        )
    if f.where not in ("batch", "step"):
        raise ConfigError(f"fault.where={f.where}: allowed values are batch, step")
    if f.rank is not None and not 0 <= f.rank < cp:
        raise ConfigError(f"fault.rank={f.rank}: must be a rank of topology.cp={cp} (0 to {cp - 1}) or null")
    _positive("fault.at_n", f.at_n, allow_null=True)
    if f.at_step is not None and f.at_step < 0:
        raise ConfigError(f"fault.at_step={f.at_step}: must be >= 0 or null")


def _check_convergence(settings: BenchConfig, topology: Topology) -> None:
    c = settings.convergence
    _positive("convergence.steps", c.steps)
    for key in ("rtol", "atol"):
        if getattr(c, key) < 0:
            raise ConfigError(f"convergence.{key}={getattr(c, key)}: must be >= 0")
    if settings.checkpoint.every < 0:
        raise ConfigError(f"checkpoint.every={settings.checkpoint.every}: must be >= 0 (0: no checkpoints)")
    if settings.workflow is not Workflow.convergence:
        return
    if settings.data.path is not None:
        path = settings.data.path
        raise ConfigError(f"data.path={path}: workflow=convergence draws a batch per step; unset it")
    if not topology.accepts(settings.shape.n_tokens):
        raise ConfigError(
            f"shape.n_tokens={settings.shape.n_tokens}: does not tile the {topology.grid_label} grid of "
            f"topology.kind={topology.kind} (workflow=convergence runs at shape.*)"
        )


def _check_data(settings: BenchConfig) -> None:
    from cpbench.inputs import FeatureError, load_features

    path = settings.data.path
    if settings.probe.enabled or settings.command is Command.predict:
        raise ConfigError(
            "probe.enabled=true: a feature file (data.path) has one N_tokens; "
            "set probe.enabled=false to measure it"
        )
    _positive("data.msa_depth", settings.data.msa_depth, allow_null=True)
    try:
        load_features(path, seed=settings.seed)
    except (FeatureError, OSError) as err:
        message = str(err).removeprefix(f"{path}: ")
        raise ConfigError(
            message if message.startswith("data.path=") else f"data.path={path}: {message}"
        ) from None
