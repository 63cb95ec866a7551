"""Run a module written for the fold-cp benchmark driver unchanged (`foldcp` contract), or a module
with the same signatures and cpbench's own step semantics (`native`). See docs/adapters.md.

Beyond the fold-cp signatures, a hook may name keyword parameters the original driver never passed:
`options` (the model's own settings, `workload.options`), `ctx` (the rank context: rank, device, mesh,
dtype, seed) and, in build_batch, `features` (the input's feature dict, docs/inputs.md; None when the
inputs are synthesized). A module that names none runs as it ran under the fold-cp driver."""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch
from omegaconf import OmegaConf

from cpbench.core import ConfigError, RankContext, Shape, Topology, TopologyKind
from cpbench.inputs import SPECS, read_input
from cpbench.workloads.base import Contract, Limitation, RealSetting

HOOKS = ("build_model", "build_batch", "run_step")
# The keywords each hook may name, beyond the fold-cp driver's arguments.
EXTRAS = {"build_model": ("options", "ctx"), "build_batch": ("options", "ctx", "features"),
          "run_step": ("options", "ctx")}  # fmt: skip


class WorkloadError(ValueError):
    """A workload that cannot be used as configured."""


class FoldCPAdapter:
    def __init__(
        self,
        module: str,
        contract: str = "foldcp",
        options: dict[str, Any] | None = None,
        options_file: str | None = None,
        autocast: bool = True,
    ):
        try:
            self.contract = Contract(contract)
        except ValueError:
            allowed = ", ".join(c.value for c in Contract)
            raise WorkloadError(f"workload.contract={contract}: allowed values are {allowed}") from None
        try:
            self.module = importlib.import_module(module)
        except ImportError as err:
            raise WorkloadError(f"workload.module={module}: cannot be imported ({err})") from err
        missing = [hook for hook in HOOKS if not callable(getattr(self.module, hook, None))]
        if missing:
            raise WorkloadError(
                f"workload.module={module}: lacks hook(s) {', '.join(missing)}; "
                "an adapter module defines build_model, build_batch and run_step"
            )
        self.name = module
        # Plain containers: Hydra hands nested settings over as DictConfig.
        self.options = OmegaConf.to_container(OmegaConf.create(options or {}), resolve=True)
        self.options_file = options_file  # read into `options` by the settings; recorded as given
        self.autocast = autocast
        self._named = {hook: _named(getattr(self.module, hook), EXTRAS[hook]) for hook in HOOKS}
        if self.options and not any("options" in named for named in self._named.values()):
            raise WorkloadError(
                f"workload.options: no hook of {module} takes an `options` keyword, so they would reach "
                "nothing; add `*, options` to its build_model signature (docs/adapters.md)"
            )
        # data.path is refused up front for a module whose build_batch cannot take the features.
        self.takes_inputs = "features" in self._named["build_batch"]
        self.real_job = _real_job(self.module) + (() if autocast else (_OWN_PRECISION,))
        self._ctx: RankContext | None = None

    def check_topology(self, topology: Topology) -> None:
        """The fold-cp driver hands its hooks a square 2d mesh named (cp0, cp1); nothing else."""
        rows, cols = topology.grid
        if self.contract is Contract.foldcp and (rows != cols or topology.kind is TopologyKind.one_d):
            raise ConfigError(
                f"topology.kind={topology.kind} topology.cp={topology.cp}: workload.contract=foldcp needs "
                "the fold-cp driver's square 2d mesh (cp0, cp1); set topology.kind=2d with cp a square "
                "(4, 9, 16, ...), or workload.contract=native"
            )

    def build_model(self, ctx: RankContext) -> torch.nn.Module:
        self._ctx = ctx
        return self.module.build_model(ctx.mesh, ctx.device, **self._extras("build_model", ctx))

    def build_batch(self, shape: Shape, ctx: RankContext) -> Any:
        extras = self._extras("build_batch", ctx, lambda: input_features(shape, ctx))
        return self.module.build_batch(
            shape.n_tokens, shape.n_atoms, shape.msa_depth, ctx.mesh, ctx.device, **extras
        )

    def run_step(self, model: torch.nn.Module, batch: Any, train: bool) -> Any:
        ctx = self._ctx
        assert ctx is not None, "build_model runs before run_step"
        with self._precision(ctx):
            return self.module.run_step(model, batch, train, **self._extras("run_step", ctx))

    def _extras(
        self, hook: str, ctx: RankContext, features: Callable[[], Any] | None = None
    ) -> dict[str, Any]:
        values = {"options": lambda: self.options, "ctx": lambda: ctx, "features": features}
        return {name: values[name]() for name in self._named[hook]}

    def _precision(self, ctx: RankContext) -> AbstractContextManager[Any]:
        """The run's dtype as autocast over the step (forward, and under foldcp the module's backward
        and optimizer step too), without the weight cache as the built-in workloads run bfloat16 (a
        cached copy of every weight would live to the step's end); float32 runs as written."""
        if not self.autocast or ctx.dtype == torch.float32:
            return nullcontext()
        return torch.autocast(ctx.device.type, dtype=ctx.dtype, cache_enabled=False)


def input_features(shape: Shape, ctx: RankContext) -> dict[str, torch.Tensor] | None:
    """The whole input of `data.path` as the feature dict of docs/inputs.md (index form, padding
    stripped, on the CPU, the same on every rank), its MSA cut to the point's rows (data.msa_depth);
    None when the inputs are synthesized."""
    if not ctx.data_path:
        return None
    arrays = read_input(ctx.data_path, ctx.seed).arrays
    return {
        name: torch.from_numpy(array[: shape.msa_depth] if SPECS[name].dims[0] == "S" else array)
        for name, array in arrays.items()
    }


def _named(hook: Callable[..., Any], extras: tuple[str, ...]) -> tuple[str, ...]:
    """The extra keywords `hook` takes: those it names, or all of them where it takes **kwargs."""
    params = inspect.signature(hook).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return extras
    keywords = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    return tuple(name for name in extras if name in keywords)


_OWN_PRECISION = Limitation(
    "precision", "the module's own (workload.autocast=false)", "dtype as set",
    "the driver applies no autocast; the module applies ctx.dtype itself, or runs as written",
)  # fmt: skip


def _real_job(module: Any) -> tuple[Limitation | RealSetting, ...]:
    """The module's `REAL_JOB` (docs/adapters.md): what its real job runs that this benchmark does not.
    An entry that names an `option` is a setting (`workload.options.<option>`, compared with what the
    run sets); any other is a limitation (an edit to the module changes it), and none declared is one."""
    declared = getattr(module, "REAL_JOB", None)
    if declared is None:
        return (
            Limitation(
                "the module's own settings (loop counts, sizes, inputs)", "as the module sets them",
                "not declared", "the module declares no REAL_JOB, so cpbench cannot tell how they differ",
            ),
        )  # fmt: skip
    name = module.__name__
    entries = declared.values() if isinstance(declared, dict) else [None]
    if not all(isinstance(v, dict) and "real" in v for v in entries):
        raise WorkloadError(
            f"workload.module={name}: REAL_JOB must map each setting to a dict with `real` "
            "(and optionally `benchmark`, `why`)"
        )
    return tuple(_real_entry(name, what, entry) for what, entry in declared.items())


def _real_entry(module: str, what: str, entry: dict[str, Any]) -> Limitation | RealSetting:
    if "option" in entry:
        why = entry.get("why", f"an option of {module}: workload.options changes it")
        return RealSetting({f"options.{entry['option']}": entry["real"]}, what, why)
    why = entry.get("why", f"set in {module}: changing it needs an edit to the module")
    return Limitation(what, entry.get("benchmark", "as the module runs it"), entry["real"], why)
