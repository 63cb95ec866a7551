"""The top-level loop of one rank: runtime, workload, the measured points, rank 0's records."""

from __future__ import annotations

import dataclasses
import itertools
import logging
import os
import time
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Any

import pandas as pd
import torch
import torch.distributed as dist
from hydra.utils import instantiate
from omegaconf import OmegaConf
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from torch.distributed.elastic.multiprocessing.errors import ErrorHandler

from cpbench.checks import accuracy
from cpbench.core import RankContext, Shape, Topology
from cpbench.inputs import input_columns, input_point
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
from cpbench.plan.budget import Plan, Step, Verdict, duration, estimate, fit_budget
from cpbench.plan.changes import budget_rows
from cpbench.probe.predict import Prediction
from cpbench.probe.runner import max_fit_row, run_probe, search_config
from cpbench.probe.search import SearchConfig, Trial
from cpbench.probe.state import ProbeState
from cpbench.report import metadata, plots, reference
from cpbench.report.mllog import MAX_FIT, POINT, TRAIN_LOSS, RunLog, constants
from cpbench.report.single import write_report
from cpbench.results.folder import RunFolder
from cpbench.results.row import BASELINE, ResultRow
from cpbench.runtime import logs
from cpbench.runtime.logs import CONSOLE, LOG
from cpbench.runtime.rank import pick_backend, rank_runtime
from cpbench.runtime.seed import deterministic, seed_all
from cpbench.settings.cp1 import cp1_settings
from cpbench.settings.schema import BenchConfig, Mode, Workflow
from cpbench.sweep import resolve_shape, sweep_points
from cpbench.workloads.base import Workload


@dataclass
class RunSpec:
    """What a rank process receives: the validated settings and where to write."""

    settings: BenchConfig
    output_dir: str
    # The what-changed table (`cpbench.plan.changes`), made before launch; rank 0 records it in run.json.
    what_changed: list[dict[str, Any]] = field(default_factory=list)
    reference_dir: str | None = None  # mode=accuracy: the cp=1 run each point is checked against
    prediction: Prediction | None = None  # probe.predict: made before the ranks started

    @property
    def topology(self) -> Topology:
        t = self.settings.topology
        return Topology.from_config(t.kind, t.cp, t.grid)


def run_rank(spec: RunSpec, workload: Workload | None = None) -> None:
    """One rank. `workload` is the one the launching process already built, when it is this rank."""
    settings = spec.settings
    dtype = getattr(torch, settings.dtype.value)
    torch.set_float32_matmul_precision(settings.matmul_precision)  # set every run: a process may run many
    dist_cfg = settings.dist
    deterministic(settings.mode is Mode.accuracy)  # before CUDA starts: it sets the cuBLAS workspace
    with rank_runtime(spec.topology, dist_cfg.backend, dist_cfg.timeout_s, dtype, settings.seed) as ctx:
        ctx.data_path = settings.data.path
        # Agreement and result reductions run on their own CPU group, apart from the workload's.
        control = dist.new_group(backend="gloo", timeout=timedelta(seconds=dist_cfg.timeout_s))
        folder = RunFolder(_broadcast(spec.output_dir, control))  # rank 0 decides, the others follow
        logs.setup(ctx.rank, settings.log.all_ranks, folder.rank_log(ctx.rank))
        try:
            workload = workload or instantiate(settings.workload)
            bench = Bench(settings, ctx, control, folder, workload, spec.what_changed, spec.prediction)
            if spec.reference_dir and bench.lead:
                bench.check_against(RunFolder(spec.reference_dir))
            bench.run()
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
    skipped = (
        "output_dir",
        "log",
        "sweep",
        "probe",
        "shape",
        "slurm",
        "launch",
        "baseline",
        "budget",
        "job",
        "repeat_check",
        "experiment",
        "checkpoint",
    )
    for key in skipped:
        container.pop(key, None)
    return metadata.config_hash(OmegaConf.to_yaml(OmegaConf.create(container)))


def walltime_points(settings: BenchConfig) -> list[Shape]:
    """The points a run measures: the feature file's one shape, else the product of the sweep lists."""
    if settings.data.path:
        return [input_point(settings.data.path, settings.seed, settings.data.msa_depth)]
    return sweep_points(settings.shape, settings.sweep)


class Bench:
    def __init__(
        self,
        settings: BenchConfig,
        ctx: RankContext,
        control: dist.ProcessGroup,
        folder: RunFolder,
        workload: Workload,
        what_changed: list[dict[str, Any]] | None = None,
        prediction: Prediction | None = None,
    ):
        self.settings, self.ctx, self.control, self.folder = settings, ctx, control, folder
        self.prediction = prediction
        self.lead = ctx.rank == 0
        self.train = settings.workflow in (Workflow.training, Workflow.convergence)
        self.config_hash = hashed_config(settings)
        self.workload = workload
        self.workload_name = getattr(workload, "name", type(workload).__name__)
        f = settings.fault
        self.heartbeat = logs.Heartbeat(settings.log.heartbeat_s if self.lead else None)
        self.accuracy = settings.mode is Mode.accuracy
        timing = settings.timing
        self.point_settings = PointSettings(
            warmup=timing.warmup,
            repeats=timing.repeats,
            warmup_max=timing.warmup_max,
            repeats_max=timing.repeats_max,
            settle_pct=timing.settle_pct,
            iqr_pct=timing.iqr_pct,
            budget=_apply_budget(settings, ctx),
            fault=Fault(f.rank, f.at_n, f.where, f.kind, f.at_step),
            agree_wait_s=settings.dist.agree_timeout_s,
            seed=settings.seed,
            counts_comm=getattr(workload, "counts_comm", False),
            profile_comm=settings.measure.profile_comm,
            progress=self.heartbeat.step,
        )
        if self.accuracy:  # runs compared with each other take the same steps (training moves the weights)
            self.point_settings = self.point_settings.fixed()
        self.reference: dict[str, dict[str, Any]] | None = None  # rank 0, mode=accuracy: cp=1's rows
        self.runner: StepRunner | None = None
        self.done: set[str] = set()
        self.what_changed = what_changed or []  # rank 0 records it in run.json
        self.planned_at: float | None = None  # when the budget's timed step started
        self.largest: tuple[Shape, PointResult] | None = None  # the largest point measured, ok
        self.overhead_s = 0.0  # a measurement's time besides its steps, from the budget's timed one
        self.mllog = RunLog(folder.mllog if self.lead else None)

    def check_against(self, reference: RunFolder) -> None:
        """Check every point this rank records against the cp=1 run in `reference` (rank 0)."""
        config_hash = hashed_config(cp1_settings(self.settings))
        self.reference = accuracy.reference_rows(reference, config_hash)

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
            meta.update(baseline_gib=budget and budget.baseline_gib, what_changed=self.what_changed)
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
        points = walltime_points(settings)
        todo = [s for s in points if self.row(s, "point").key not in self.done]
        todo, warmed = self._fit_budget(todo)
        if todo is None:
            return
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
            for i, shape in enumerate(todo):
                self.measure(shape, warmed=i == 0 and warmed)
                bar.advance(task)
        if settings.probe.enabled:
            self._fit_probe()
            self.probe()
        if self.lead:
            # When it ended, so that a merge can tell runs that overlapped on one host.
            meta = {**self.folder.read_metadata(), "finished": metadata.now()}
            if meta.get("time_budget") and self.planned_at is not None:  # the estimate's error, shown
                meta["time_budget"]["took_s"] = time.perf_counter() - self.planned_at
            self.folder.write_metadata(meta)
            LOG.info("report: %s", write_report(self.folder.root))

    def _fit_budget(self, todo: list[Shape]) -> tuple[list[Shape] | None, bool]:
        """Time one step (the first point's second warm-up step: the first carries one-off costs),
        estimate the plan from it and trim the plan to budget.minutes (`cpbench.plan.budget`), before
        the long work. Returns the points to measure (None: refused, nothing runs) and whether the first
        point's first two warm-up steps are done."""
        settings, b = self.settings, self.settings.budget
        search = self._search() if settings.probe.enabled else None
        first = todo[0] if todo else (self._probe_shape(search.start) if search else None)
        if b.minutes is None or first is None:
            return todo, False
        self.heartbeat.now(f"budget: timing one step at N={first.n_tokens}")
        self.planned_at = time.perf_counter()
        if self.lead and todo:  # the first point's own warm-up: a crash in it is that point's
            self.folder.in_flight.start(self.row(first, "point").as_dict())
        result = self._measure(first, replace(self.point_settings, warmup=1, repeats=1))
        took = _broadcast(time.perf_counter() - self.planned_at, self.control)  # rank 0's, on every rank
        if result.status != "ok":
            LOG.warning("budget: the first step at N=%d did not fit: no estimate, the plan runs as set",
                        first.n_tokens)  # fmt: skip
            return todo, False
        budget = self.point_settings.budget
        baseline = budget.baseline_gib if budget else 0.0
        # A measurement's cost besides its steps (the first step's one-off costs counted in it too).
        self.overhead_s = max(0.0, took - 2 * result.walltime_ms / 1e3)
        step = Step(first.n_tokens, result.walltime_ms / 1e3, result.peak_mem_gib, baseline, self.overhead_s)
        plan = Plan(tuple(todo), self.point_settings.warmup, self.point_settings.repeats, search,
                    settings.probe.measure_at_max)  # fmt: skip
        verdict = fit_budget(plan, step, b.minutes, b.min_repeats) if self.lead else None
        verdict = _broadcast(verdict, self.control)
        if self.lead:
            line = Verdict(plan, *estimate(plan, step)).summary(b.minutes, step)  # the plan as set
            LOG.info("%s", line)
            cuts = [] if verdict.refusal else list(verdict.cuts)  # refused: nothing is cut, nothing runs
            for cut in cuts:
                LOG.warning("budget: cut %s", cut)
            if cuts:
                line += f"; trimmed to {verdict.summary(b.minutes, step).removeprefix('plan: ')}"
                LOG.info("trimmed %s", verdict.summary(b.minutes, step))
            record = {"line": line, "cuts": cuts, "refusal": verdict.refusal}
            meta = self.folder.read_metadata()
            meta["what_changed"] += [r.as_dict() for r in budget_rows(cuts)]
            self.folder.write_metadata({**meta, "time_budget": record})
        if verdict.refusal:
            if self.lead:  # nothing runs: no point was in flight
                self.folder.in_flight.abandon()
            return None, False
        trimmed = verdict.plan
        self.point_settings = replace(self.point_settings, repeats=trimmed.repeats)
        if trimmed.probe is not None:
            probe = replace(settings.probe, granularity=trimmed.probe.granularity)
            self.settings = replace(settings, probe=probe)
        # Shapes compare by value: every rank reaches the same answer from rank 0's broadcast verdict.
        return list(trimmed.points), bool(trimmed.points) and trimmed.points[0] == first

    def _fit_probe(self) -> None:
        """Before the probe, its estimate again from the largest point measured (its step and peak are
        nearer the probe's N than the first step's) against the budget left: a coarser granularity
        when that fits it; else a warning, and the probe runs as trimmed (the points are measured)."""
        if self.planned_at is None or self.largest is None:
            return
        b, ps = self.settings.budget, self.point_settings
        shape, result = self.largest
        left = b.minutes * 60 - (time.perf_counter() - self.planned_at)
        baseline = ps.budget.baseline_gib if ps.budget else 0.0
        step = Step(shape.n_tokens, result.walltime_ms / 1e3, result.peak_mem_gib, baseline, self.overhead_s)
        plan = Plan((), ps.warmup, ps.repeats, self._search(), self.settings.probe.measure_at_max)
        verdict = fit_budget(plan, step, max(left, 1.0) / 60, ps.repeats) if self.lead else None
        verdict = _broadcast(verdict, self.control)
        probe = replace(self.settings.probe, granularity=verdict.plan.probe.granularity)
        self.settings = replace(self.settings, probe=probe)
        if not self.lead:
            return
        line = (
            f"before the probe: ~{verdict.probe_steps} step(s) and its measurement at the largest fit "
            f"= ~{duration(verdict.seconds)} (x (N/{step.n})^2 from N={step.n}: {step.seconds:.2g} s a "
            f"step), {duration(max(left, 0.0))} of the budget left"
        )
        LOG.info("budget: %s", line)
        for cut in verdict.cuts:
            LOG.warning("budget: cut %s", cut)
        if verdict.refusal:
            line += "; over it even so: the probe runs as trimmed"
            LOG.warning("budget: the probe's estimate is over the budget left; it runs as trimmed")
        meta = self.folder.read_metadata()
        record = meta["time_budget"]
        record.update(probe_line=line, cuts=record["cuts"] + list(verdict.cuts))
        meta["what_changed"] += [r.as_dict() for r in budget_rows(verdict.cuts)]
        self.folder.write_metadata(meta)

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
        return StepRunner(
            self.workload, model, self.train, self.ctx, optim.lr, optim.weight_decay, self.accuracy
        )

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
        # The walltime points at the probe's own shapes are trials it need not step again: their
        # fits and peaks start the ramp and the memory model.
        if state is not None:
            tried = {t.n for t in state.trials}
            state.add_points([t for t in self._point_trials() if t.n not in tried])
        trials = list(_broadcast(state.trials if state else None, self.control))

        def search() -> SearchConfig:  # before each step: the estimate calibrated by the largest fit so far
            self._calibrate(trials)
            return self._search()

        one_step = self.point_settings.single_step()

        steps = itertools.count(len(trials) + 1)

        def step_at(shape: Shape) -> PointResult:
            self.heartbeat.now(f"probe step {next(steps)}: N={shape.n_tokens}")
            return self._measure(shape, one_step)

        while True:
            best, fail = run_probe(search, state, trials, self._probe_shape, step_at, self.predicted_gib)
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

    def _calibrate(self, trials: list[Trial]) -> None:
        """probe.predict: the largest step that fit at the probe's shape (a walltime point or a probe
        step) measured what the trace cannot see (the process, workspaces); every estimate adds it and
        the proposal moves with it, again whenever a larger step fits (docs/probe.md)."""
        fits = [t for t in trials if t.fits and t.peak_gib is not None]
        if self.prediction is None or not fits:
            return
        top = max(fits, key=lambda t: t.n)
        if top.n == self.prediction.calibrated_at:
            return
        budget = self.point_settings.budget
        over_baseline = top.peak_gib - (budget.baseline_gib if budget else 0.0)
        measured = _broadcast(over_baseline, self.control)  # rank 0's baseline, as the rows count it
        was = self.prediction.proposal
        self.prediction = self.prediction.calibrated(top.n, measured, self.ctx.topology.tiling.multiple)
        if self.lead:
            self.folder.write_json(self.folder.prediction, self.prediction.as_json())
            LOG.info(
                "probe.predict: at N=%d the real peak was %+.1f MiB beside the estimate (memory the trace "
                "does not see); every estimate adds it: proposal N=%s (was %s)",
                top.n, self.prediction.missed_gib * 1024, self.prediction.proposal, was,
            )  # fmt: skip

    def _point_trials(self) -> list[Trial]:
        """This configuration's walltime points that fit or ran out of memory, at the probe's shapes."""
        frame = self.folder.read_results()
        if frame.empty:
            return []
        points = frame[(frame["config_hash"] == self.config_hash) & (frame["kind"] == "point")]
        if "source" in points.columns:
            points = points[points["source"] != BASELINE]
        trials = {}
        for r in points[points["status"].isin(["ok", "oom"])].itertuples():
            if self._probe_shape(int(r.N_tokens)) == Shape(int(r.N_tokens), int(r.N_atoms), int(r.MSA_depth)):
                peak = None if pd.isna(r.peak_mem_gib) else float(r.peak_mem_gib)
                trials[int(r.N_tokens)] = Trial(n=int(r.N_tokens), fits=r.status == "ok", status=r.status,
                                                peak_gib=peak, point=True)  # fmt: skip
        return sorted(trials.values(), key=lambda t: t.n)

    def _search(self) -> SearchConfig:
        """The probe's search. Peaks are absolute (the CPU baseline included): its limit is the cap."""
        budget = self.point_settings.budget
        limit = _broadcast(budget.gib + budget.baseline_gib, self.control) if budget else None
        proposal = self.prediction.proposal if self.prediction else None
        return search_config(self.settings.probe, self.ctx.topology, limit, proposal)

    def _probe_shape(self, n_tokens: int) -> Shape:
        return resolve_shape(self.settings.shape, n_tokens=n_tokens)

    def measure(self, shape: Shape, warmed: bool = False) -> PointResult:
        """A walltime point; `warmed`: its first two warm-up steps already ran (the budget's)."""
        row = self.row(shape, "point")
        if self.lead:
            self.folder.in_flight.start(row.as_dict())
        ps = self.point_settings
        self.heartbeat.now(f"N={shape.n_tokens}: {ps.warmup} warm-up and {ps.repeats} timed step(s)")
        if warmed:
            ps = replace(ps, warmup=max(0, ps.warmup - 2))
        result = self._measure(shape, ps)
        self.done.add(row.key)  # the probe's answer at a point's N reuses its row
        if result.status == "ok" and (self.largest is None or shape.n_tokens >= self.largest[0].n_tokens):
            self.largest = (shape, result)
        if self.lead:
            if result.comm_ops:
                self.folder.append_comm_ops([{**row.as_dict(), **op} for op in result.comm_ops])
            tokens_per_s = shape.n_tokens / (result.walltime_ms / 1e3) if result.walltime_ms else None
            measured = dataclasses.replace(row, **result.as_row(), tokens_per_s=tokens_per_s)
            if self.reference is not None and measured.status == "ok":
                rtol = accuracy.tolerance(self.settings)
                status, error = accuracy.check_point(measured.as_dict(), self.reference.get(row.key), rtol)
                measured = dataclasses.replace(measured, status=status, error=error)
                if error:
                    LOG.warning("N=%d: %s", shape.n_tokens, error)
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
            warmup=settings.timing.warmup, repeats=self.point_settings.repeats, seed=settings.seed,
            config_hash=self.config_hash, extra=dict(columns(self.train)) if callable(columns) else {},
            budget_gib=budget.gib if (budget := self.point_settings.budget) else None,
            baseline_gib=budget.baseline_gib if budget else None,
            predicted_peak_gib=self.predicted_gib(shape.n_tokens),
            **input_columns(settings.data.path, settings.seed),
        )  # fmt: skip

    def predicted_gib(self, n_tokens: int) -> float | None:
        """The estimate at N as the measured peak counts it: over rank 0's start-up baseline."""
        estimate = self.prediction.at(n_tokens) if self.prediction else None
        if estimate is None:
            return None
        budget = self.point_settings.budget
        return estimate + (budget.baseline_gib if budget else 0.0)


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
