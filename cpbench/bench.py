"""The top-level loop of one rank: runtime, workload, the measured points, rank 0's records."""

from __future__ import annotations

import dataclasses
import itertools
import logging
import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from hydra.utils import instantiate
from omegaconf import OmegaConf
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from torch.distributed.elastic.multiprocessing.errors import ErrorHandler

from cpbench.core import RankContext, Shape, Topology
from cpbench.inputs import load_features
from cpbench.measure.budget import apply_budget
from cpbench.measure.convergence import ConvergenceSettings, compare, run_convergence
from cpbench.measure.fault import Fault
from cpbench.measure.memory import release
from cpbench.measure.point import (
    Budget,
    OutOfMemoryAlone,
    PointResult,
    PointSettings,
    comm_timing,
    measure_point,
)
from cpbench.measure.step import StepRunner
from cpbench.probe.runner import max_fit_row, run_probe, search_config
from cpbench.probe.search import Trial
from cpbench.probe.state import ProbeState
from cpbench.report import metadata, plots, reference
from cpbench.report.markdown import write_report
from cpbench.report.mllog import MAX_FIT, POINT, TRAIN_LOSS, RunLog, constants
from cpbench.results.folder import RunFolder
from cpbench.results.row import ResultRow
from cpbench.runtime import logs
from cpbench.runtime.logs import CONSOLE, LOG
from cpbench.runtime.rank import pick_backend, rank_runtime
from cpbench.runtime.seed import seed_all
from cpbench.settings.schema import BenchConfig, Workflow
from cpbench.sweep import resolve_shape, sweep_points
from cpbench.workloads.base import Workload


@dataclass
class RunSpec:
    """What a rank process receives: the validated settings and where to write."""

    settings: BenchConfig
    output_dir: str

    @property
    def topology(self) -> Topology:
        t = self.settings.topology
        return Topology.from_config(t.kind, t.cp, t.grid)


def run_rank(spec: RunSpec, workload: Workload | None = None) -> None:
    """One rank. `workload` is the one the launching process already built, when it is this rank."""
    settings = spec.settings
    dtype = getattr(torch, settings.dtype.value)
    dist_cfg = settings.dist
    with rank_runtime(spec.topology, dist_cfg.backend, dist_cfg.timeout_s, dtype, settings.seed) as ctx:
        ctx.data_path = settings.data.path
        # Agreement and result reductions run on their own CPU group, apart from the workload's.
        control = dist.new_group(backend="gloo", timeout=timedelta(seconds=dist_cfg.timeout_s))
        folder = RunFolder(_broadcast(spec.output_dir, control))  # rank 0 decides, the others follow
        logs.setup(ctx.rank, settings.log.all_ranks, folder.rank_log(ctx.rank))
        try:
            Bench(settings, ctx, control, folder, workload or instantiate(settings.workload)).run()
        except Exception as err:
            # Record the root cause before teardown: once this rank leaves, its peers fail too, and
            # the launcher must be able to tell which rank failed first and why.
            ErrorHandler().record_exception(err)
            if isinstance(err, OutOfMemoryAlone) and ctx.world_size > 1:
                # Its peers are stuck in a collective it will never join, and tearing down the process
                # group would wait for them: leave at once, and the launcher ends them too.
                logging.shutdown()
                os._exit(1)
            raise


def _broadcast(value: Any, group: dist.ProcessGroup) -> Any:
    box = [value]
    dist.broadcast_object_list(box, src=0, group=group)
    return box[0]


def hashed_config(settings: BenchConfig) -> str:
    """The settings that decide each point's numbers: not which points (a point's row names its own
    shape), nor where they are written or how loudly. Rows of an equal hash are resumable."""
    container = OmegaConf.to_container(OmegaConf.structured(settings), resolve=True, enum_to_str=True)
    for key in ("output_dir", "log", "sweep", "probe", "shape", "slurm", "launch", "checkpoint"):
        container.pop(key, None)
    return metadata.config_hash(OmegaConf.to_yaml(OmegaConf.create(container)))


class Bench:
    def __init__(
        self,
        settings: BenchConfig,
        ctx: RankContext,
        control: dist.ProcessGroup,
        folder: RunFolder,
        workload: Workload,
    ):
        self.settings, self.ctx, self.control, self.folder = settings, ctx, control, folder
        self.lead = ctx.rank == 0
        self.train = settings.workflow in (Workflow.training, Workflow.convergence)
        self.config_hash = hashed_config(settings)
        self.workload = workload
        self.workload_name = getattr(workload, "name", type(workload).__name__)
        f = settings.fault
        self.heartbeat = logs.Heartbeat(settings.log.heartbeat_s if self.lead else None)
        self.point_settings = PointSettings(
            warmup=settings.timing.warmup,
            repeats=settings.timing.repeats,
            budget=_apply_budget(settings, ctx),
            fault=Fault(f.rank, f.at_n, f.where, f.kind, f.at_step),
            agree_wait_s=settings.dist.agree_timeout_s,
            seed=settings.seed,
            counts_comm=getattr(workload, "counts_comm", False),
            profile_comm=settings.measure.profile_comm,
            progress=self.heartbeat.step,
        )
        self.runner: StepRunner | None = None
        self.done: set[str] = set()
        self.mllog = RunLog(folder.mllog if self.lead else None)

    def run(self) -> None:
        with self.heartbeat, self.mllog:
            self._run()

    def _run(self) -> None:
        settings, ctx = self.settings, self.ctx
        self.mllog.start(constants.INIT_START)
        if self.lead:
            if again := self.folder.in_flight.resume(settings.launch.max_restarts):
                LOG.warning("N=%s was in flight when the last run stopped: measured again", again["N_tokens"])
            meta = metadata.collect(
                ctx.device,
                pick_backend(settings.dist.backend),
                ctx.topology,
                ctx.world_size,
                int(os.environ.get("LOCAL_WORLD_SIZE", ctx.world_size)),
                self.config_hash,
            )
            budget = self.point_settings.budget
            meta.update(seed=settings.seed, budget_gib=budget and budget.gib)
            meta.update(baseline_gib=budget and budget.baseline_gib)
            meta.update(comm_timing=comm_timing(ctx.device, self.point_settings))
            self.folder.write_metadata(meta)
            workflow = settings.workflow.value
            self.mllog.submission(meta, self.workload_name, workflow, ctx.topology.cp, settings.seed)
            if meta["ranks_per_device"] > 1:
                LOG.warning(
                    "oversubscribed: %s; walltimes and the comm share are not meaningful",
                    meta["oversubscribed"].removeprefix("yes (").removesuffix(")"),
                )
        self.runner = self._build_runner()
        self.mllog.end(constants.INIT_STOP)
        self.mllog.start(constants.RUN_START)
        if settings.workflow is Workflow.convergence:
            self.converge()
            return
        self.done = _broadcast(self.folder.done_keys(self.config_hash) if self.lead else None, self.control)
        if settings.data.path:
            points = [load_features(settings.data.path).shape]
        else:
            points = sweep_points(settings.shape, settings.sweep)
        todo = [s for s in points if self.row(s, "point").key not in self.done]
        LOG.info(
            "%s %s on %s cp=%d: %d point(s) to measure -> %s",
            self.workload_name,
            settings.workflow.value,
            ctx.topology.label,
            ctx.topology.cp,
            len(todo),
            self.folder.root,
        )
        with Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=CONSOLE,
            disable=not (self.lead and settings.log.progress),
            transient=True,
        ) as bar:
            task = bar.add_task("points", total=len(todo))
            for shape in todo:
                self.measure(shape)
                bar.advance(task)
        if settings.probe.enabled:
            self.probe()
        if self.lead:
            # When it ended, so that a merge can tell runs that overlapped on one host.
            self.folder.write_metadata({**self.folder.read_metadata(), "finished": metadata.now()})
            LOG.info("report: %s", write_report(self.folder.root))

    def converge(self) -> None:
        """workflow=convergence: the curve at shape.*, then (rank 0) its comparison with the reference."""
        settings, shape = self.settings, resolve_shape(self.settings.shape)
        LOG.info(
            "%s convergence on %s cp=%d: %d step(s) at N=%d -> %s", self.workload_name,
            self.ctx.topology.label, self.ctx.topology.cp, settings.convergence.steps, shape.n_tokens,
            self.folder.root,
        )  # fmt: skip
        every = settings.checkpoint.every
        key = reference.curve_key(settings)
        how = ConvergenceSettings(
            settings.convergence.steps, every, settings.seed, self.point_settings.fault, key
        )
        say = self.heartbeat.step
        curve = run_convergence(
            self.runner, shape, self.ctx, self.control, self.folder, how, say, self._logged
        )
        if not self.lead:
            return
        meta = self.folder.read_metadata()
        found = reference.lookup(settings, self.folder)
        summary: dict[str, Any] = {"curve_key": key, "steps": len(curve)}
        curves = {f"{self.ctx.topology.label} cp={self.ctx.topology.cp}": curve}
        if found is not None:
            path, ref = found
            c = settings.convergence
            comparison = compare(curve, ref, c.rtol, c.atol)
            summary.update(reference=str(path), **comparison.as_dict())
            curves[f"reference ({path.name})"] = ref
            say = LOG.info if comparison.match else LOG.warning
            say("convergence vs %s: %s", path, comparison.line())
        else:
            LOG.info("convergence: no reference curve for this configuration (key %s)", summary["curve_key"])
        plots.convergence_png(curves, self.folder.convergence_plot)
        last = curve.iloc[-1]
        LOG.info("convergence: step %d loss %.9g grad norm %.9g", last.step, last.loss, last.grad_norm)
        self.folder.write_metadata({**meta, "convergence": summary, "finished": metadata.now()})

    def _logged(self, row: dict[str, Any]) -> None:
        """A convergence step into mllog.txt."""
        extra = {"step_num": row["step"], "grad_norm": row["grad_norm"], "step_ms": row["step_ms"]}
        self.mllog.event(TRAIN_LOSS, row["loss"], metadata=extra)

    def _build_runner(self) -> StepRunner:
        """The model (its weights from the seed) and the step around it."""
        seed_all(self.settings.seed)
        model = self.workload.build_model(self.ctx)
        optim = self.settings.optim
        return StepRunner(self.workload, model, self.train, self.ctx, optim.lr, optim.weight_decay)

    def _measure(self, shape: Shape, settings: PointSettings) -> PointResult:
        """One point or probe step. After running out of memory the model is built afresh: a step
        that failed midway can leave the model's own communication state mid-flight."""
        try:
            result = measure_point(self.runner, shape, self.ctx, self.control, settings)
        except OutOfMemoryAlone as err:
            # Only this rank knows the job ends for out of memory (its peers wait in a collective, rank 0
            # among them, writing nothing): record the point or N in flight as not fitting first.
            self.folder.in_flight.close("oom", f"rank {self.ctx.rank}: {err}")
            ProbeState(self.folder).close_oom()
            raise
        if result.status == "oom":
            self.runner = None
            release(self.ctx.device)
            self.runner = self._build_runner()
        return result

    def probe(self) -> None:
        """The largest N that fits (a max-fit row), then its full walltime measurement. If that
        measurement runs out of memory, the N does not fit after all and the search goes on below it."""
        state = ProbeState(self.folder, self.config_hash) if self.lead else None
        if state is not None and (n := state.resume_in_flight(self.settings.launch.max_restarts)) is not None:
            LOG.warning("probe: N=%d was in flight when the last run stopped: trying it again", n)
        trials = list(_broadcast(state.trials if state else None, self.control))
        # Peaks are absolute (the CPU baseline included): the model's limit is the cap itself.
        budget = self.point_settings.budget
        limit = _broadcast(budget.gib + budget.baseline_gib, self.control) if budget else None
        search = search_config(self.settings.probe, self.ctx.topology, limit)
        one_step = self.point_settings.single_step()

        steps = itertools.count(len(trials) + 1)

        def step_at(shape: Shape) -> PointResult:
            self.heartbeat.now(f"probe step {next(steps)}: N={shape.n_tokens}")
            return self._measure(shape, one_step)

        while True:
            best, fail = run_probe(search, state, trials, self._probe_shape, step_at)
            shape = self._probe_shape(best.n if best else fail.n)
            if not (best and self.settings.probe.measure_at_max):
                break
            point = self.row(shape, "point")
            result = self.measure(shape) if point.key not in self.done else None
            if result is None or result.status != "oom":
                break
            LOG.warning("probe: the full measurement at N=%d ran out of memory: searching below it", best.n)
            trial = Trial(n=best.n, fits=False, status="oom", peak_gib=result.peak_mem_gib)
            trials.append(trial)
            if state is not None:
                state.finish(trial)
        row = self.row(shape, "max-fit")
        if self.lead and row.key not in self.done:
            answer = dataclasses.replace(row, **max_fit_row(best, fail)).as_dict()
            self.folder.in_flight.finish(answer)
            self.mllog.event(MAX_FIT, answer["N_tokens"], metadata=answer)

    def _probe_shape(self, n_tokens: int) -> Shape:
        return resolve_shape(self.settings.shape, n_tokens=n_tokens)

    def measure(self, shape: Shape) -> PointResult:
        row = self.row(shape, "point")
        if self.lead:
            self.folder.in_flight.start(row.as_dict())
        ps = self.point_settings
        self.heartbeat.now(f"N={shape.n_tokens}: {ps.warmup} warm-up and {ps.repeats} timed step(s)")
        result = self._measure(shape, ps)
        if self.lead:
            if result.comm_ops:
                self.folder.append_comm_ops([{**row.as_dict(), **op} for op in result.comm_ops])
            tokens_per_s = shape.n_tokens / (result.walltime_ms / 1e3) if result.walltime_ms else None
            measured = dataclasses.replace(row, **result.as_row(), tokens_per_s=tokens_per_s)
            self.folder.in_flight.finish(measured.as_dict())
            self.mllog.event(POINT, measured.walltime_ms, metadata=measured.as_dict())
            LOG.info(
                "N=%d atoms=%d S=%d: %s", shape.n_tokens, shape.n_atoms, shape.msa_depth, _summary(result)
            )
        return result

    def row(self, shape: Shape, kind: str) -> ResultRow:
        """The identity of a point's row: what it is and how it is measured."""
        settings, topology = self.settings, self.ctx.topology
        columns = getattr(self.workload, "columns", None)  # the optional fourth hook
        return ResultRow(
            workload=self.workload_name, workflow=settings.workflow.value, topology=topology.kind.value,
            cp=topology.cp, grid=topology.grid_label, N_tokens=shape.n_tokens, N_atoms=shape.n_atoms,
            MSA_depth=shape.msa_depth, dtype=settings.dtype.value, kind=kind,
            warmup=settings.timing.warmup, repeats=settings.timing.repeats, seed=settings.seed,
            config_hash=self.config_hash, extra=dict(columns(self.train)) if callable(columns) else {},
            budget_gib=budget.gib if (budget := self.point_settings.budget) else None,
            baseline_gib=budget.baseline_gib if budget else None,
        )  # fmt: skip


def _apply_budget(settings: BenchConfig, ctx: RankContext) -> Budget | None:
    """The per-rank cap: memory.budget_gib, or on CPU memory.cpu_budget_gib when that is null."""
    gib = settings.memory.budget_gib
    if gib is None and ctx.device.type == "cpu":
        gib = settings.memory.cpu_budget_gib
    return None if gib is None else Budget(gib, apply_budget(gib, ctx.device))


def _summary(result: PointResult) -> str:
    if result.status != "ok":
        return f"{result.status} ({result.error}), peak {result.peak_mem_gib:.3f} GiB"
    comm = "not seen" if result.comm_ms is None else f"{result.comm_ms:.2f} ms"
    checksum = "none" if result.checksum is None else f"{result.checksum:.9e}"
    return (
        f"{result.walltime_ms:.2f} ms (IQR {result.walltime_iqr_ms:.2f}), comm {comm}, "
        f"peak {result.peak_mem_gib:.3f} GiB, checksum {checksum}"
    )
