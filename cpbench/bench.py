"""The top-level loop of one rank: runtime, workload, the measured points, rank 0's records."""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from torch.distributed.elastic.multiprocessing.errors import ErrorHandler

from cpbench.config.validate import topology_of
from cpbench.inputs import load_features
from cpbench.measure.budget import apply_budget
from cpbench.measure.fault import Fault
from cpbench.measure.point import Budget, PointResult, measure_point
from cpbench.measure.step import StepRunner
from cpbench.probe.runner import max_fit_row, run_probe, search_config
from cpbench.probe.state import ProbeState
from cpbench.report import metadata
from cpbench.report.markdown import write_report
from cpbench.results.store import COMM_OPS_CSV, RESULTS_CSV, append_rows, read_results
from cpbench.runtime import logs
from cpbench.runtime.logs import CONSOLE, LOG
from cpbench.runtime.rank import pick_backend, rank_runtime
from cpbench.sweep import InFlight, done_keys, point_key, resolve_shape, sweep_points
from cpbench.workloads.base import RankContext, Shape, Topology


@dataclass
class RunSpec:
    """What a rank process receives: the resolved config as plain data, and where to write."""

    cfg: dict[str, Any]
    output_dir: str


def run_rank(spec: RunSpec) -> None:
    cfg = OmegaConf.create(spec.cfg)
    topology = topology_of(cfg)
    dtype = getattr(torch, cfg.dtype)
    with rank_runtime(topology, cfg.dist.backend, cfg.dist.timeout_s, dtype, cfg.seed) as ctx:
        ctx.data_path = cfg.data.path
        # Agreement and result reductions run on their own CPU group, apart from the workload's.
        control = dist.new_group(backend="gloo", timeout=timedelta(seconds=cfg.dist.timeout_s))
        output_dir = Path(_broadcast(spec.output_dir, control))  # rank 0 decides, the others follow
        logs.setup(ctx.rank, cfg.log.all_ranks, output_dir)
        try:
            Bench(cfg, ctx, control, output_dir).run()
        except Exception as err:
            # Record the root cause before teardown: once this rank leaves, its peers fail too, and
            # the launcher must be able to tell which rank failed first and why.
            ErrorHandler().record_exception(err)
            raise


def _broadcast(value: Any, group: dist.ProcessGroup) -> Any:
    box = [value]
    dist.broadcast_object_list(box, src=0, group=group)
    return box[0]


def hashed_config(cfg: DictConfig) -> str:
    """The settings that decide each point's numbers: not which points (a point's row names its own
    shape), nor where they are written or how loudly. Rows of an equal hash are resumable."""
    container = OmegaConf.to_container(cfg, resolve=True)
    for key in ("output_dir", "log", "sweep", "probe", "shape", "slurm", "launch"):
        container.pop(key, None)
    return metadata.config_hash(OmegaConf.to_yaml(OmegaConf.create(container)))


class Bench:
    def __init__(self, cfg: DictConfig, ctx: RankContext, control: dist.ProcessGroup, output_dir: Path):
        self.cfg, self.ctx, self.control, self.output_dir = cfg, ctx, control, output_dir
        self.lead = ctx.rank == 0
        self.config_hash = hashed_config(cfg)
        self.in_flight = InFlight(output_dir)
        self.workload = instantiate(cfg.workload)
        self.workload_name = getattr(self.workload, "name", type(self.workload).__name__)
        self.budget = _apply_budget(cfg, ctx)
        self.fault = Fault(cfg.fault.rank, cfg.fault.at_n, cfg.fault.where, cfg.fault.kind)
        self.done: set[str] = set()

    def run(self) -> None:
        cfg, ctx = self.cfg, self.ctx
        if self.lead:
            crashed = self.in_flight.close("crashed", "the run died while measuring this point")
            if crashed:
                LOG.warning(
                    "recorded N=%s as crashed: the previous run died measuring it", crashed["N_tokens"]
                )
            metadata.write(
                self.output_dir,
                metadata.collect(
                    ctx.device,
                    pick_backend(cfg.dist.backend),
                    ctx.topology,
                    ctx.world_size,
                    int(os.environ.get("LOCAL_WORLD_SIZE", ctx.world_size)),
                    self.config_hash,
                ),
            )
        model = self.workload.build_model(ctx)
        runner = StepRunner(
            self.workload, model, cfg.workflow == "training", ctx, cfg.optim.lr, cfg.optim.weight_decay
        )
        done = done_keys(read_results(self.output_dir / RESULTS_CSV), self.config_hash) if self.lead else None
        self.done = _broadcast(done, self.control)
        points = [load_features(cfg.data.path).shape] if cfg.data.path else sweep_points(cfg)
        todo = [s for s in points if point_key("point", s) not in self.done]
        LOG.info(
            "%s %s on %s cp=%d: %d point(s) to measure -> %s",
            self.workload_name,
            cfg.workflow,
            ctx.topology.label,
            ctx.topology.cp,
            len(todo),
            self.output_dir,
        )
        with Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=CONSOLE,
            disable=not (self.lead and cfg.log.progress),
            transient=True,
        ) as bar:
            task = bar.add_task("points", total=len(todo))
            for shape in todo:
                self.measure(shape, runner, kind="point")
                bar.advance(task)
        if cfg.probe.enabled:
            self.probe(runner)
        if self.lead:
            LOG.info("report: %s", write_report(self.output_dir))

    def probe(self, runner: StepRunner) -> None:
        """The largest N that fits (a max-fit row), then its full walltime measurement."""
        state = ProbeState(self.output_dir, self.config_hash) if self.lead else None
        if state is not None and (n := state.close_in_flight()) is not None:
            LOG.warning("probe: N=%d was in flight when the job died: recorded as crashed (does not fit)", n)
        trials = list(_broadcast(state.trials if state else None, self.control))
        # Peaks are absolute (the CPU baseline included): the model's limit is the cap itself.
        limit = _broadcast(self.budget.gib + self.budget.baseline_gib, self.control) if self.budget else None
        search = search_config(self.cfg, self.ctx.topology, limit)

        def step_at(shape: Shape) -> PointResult:
            return measure_point(
                runner,
                shape,
                self.ctx,
                self.control,
                0,
                1,
                self.budget,
                self.fault,
                self.cfg.dist.agree_timeout_s,
            )

        best, fail = run_probe(search, state, trials, self._probe_shape, step_at)
        shape = self._probe_shape(best.n if best else fail.n)
        if self.lead and point_key("max-fit", shape) not in self.done:
            self.in_flight.finish({**self.row_identity(shape, "max-fit"), **max_fit_row(best, fail)})
        if best and self.cfg.probe.measure_at_max and point_key("point", shape) not in self.done:
            self.measure(shape, runner, kind="point")

    def _probe_shape(self, n_tokens: int) -> Shape:
        return resolve_shape(self.cfg, n_tokens=n_tokens)

    def measure(self, shape: Shape, runner: StepRunner, kind: str) -> PointResult:
        row = self.row_identity(shape, kind)
        if self.lead:
            self.in_flight.start(row)
        timing = self.cfg.timing
        result = measure_point(
            runner,
            shape,
            self.ctx,
            self.control,
            timing.warmup,
            timing.repeats,
            self.budget,
            self.fault,
            self.cfg.dist.agree_timeout_s,
        )
        if self.lead:
            if result.comm_ops:
                append_rows(self.output_dir / COMM_OPS_CSV, [{**row, **op} for op in result.comm_ops], [])
            self.in_flight.finish({**row, **result.as_row(), "tokens_per_s": _tokens_per_s(shape, result)})
            LOG.info(
                "N=%d atoms=%d S=%d: %s", shape.n_tokens, shape.n_atoms, shape.msa_depth, _summary(result)
            )
        return result

    def row_identity(self, shape: Shape, kind: str) -> dict[str, Any]:
        cfg, topology = self.cfg, self.ctx.topology
        return {
            "workload": self.workload_name, "workflow": cfg.workflow, "topology": topology.kind,
            "cp": topology.cp, "grid": _grid(topology), "N_tokens": shape.n_tokens,
            "N_atoms": shape.n_atoms, "MSA_depth": shape.msa_depth, "dtype": cfg.dtype, "kind": kind,
            "warmup": cfg.timing.warmup, "repeats": cfg.timing.repeats, "seed": cfg.seed,
            "config_hash": self.config_hash,
            **_workload_columns(self.workload, cfg.workflow == "training"),
        }  # fmt: skip


def _apply_budget(cfg: DictConfig, ctx: RankContext) -> Budget | None:
    """The per-rank cap: memory.budget_gib, or on CPU memory.cpu_budget_gib when that is null."""
    gib = cfg.memory.budget_gib
    if gib is None and ctx.device.type == "cpu":
        gib = cfg.memory.cpu_budget_gib
    return None if gib is None else Budget(gib, apply_budget(gib, ctx.device))


def _workload_columns(workload: Any, train: bool) -> dict[str, Any]:
    """The optional fourth hook: settings a workload records in each of its rows."""
    columns = getattr(workload, "columns", None)
    return dict(columns(train)) if callable(columns) else {}


def _grid(topology: Topology) -> str:
    return f"{topology.grid[0]}x{topology.grid[1]}"


def _tokens_per_s(shape: Shape, result: PointResult) -> float | None:
    return shape.n_tokens / (result.walltime_ms / 1e3) if result.walltime_ms else None


def _summary(result: PointResult) -> str:
    if result.status != "ok":
        return f"{result.status} ({result.error}), peak {result.peak_mem_gib:.3f} GiB"
    return (
        f"{result.walltime_ms:.2f} ms (IQR {result.walltime_iqr_ms:.2f}), comm {result.comm_ms:.2f} ms, "
        f"peak {result.peak_mem_gib:.3f} GiB, checksum {result.checksum:.9e}"
    )
