"""The walltime points phase and the one place a point or probe step is measured: the model and
step runner it runs on, each row's identity, rank 0's records of every measured point."""

from __future__ import annotations

import dataclasses
import time

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from cpbench.checks import accuracy
from cpbench.core import Shape
from cpbench.inputs import input_columns
from cpbench.measure.budget import budget_gib, cap_lifted
from cpbench.measure.flops import Counted, count_over_ranks, with_efficiency
from cpbench.measure.memory import release
from cpbench.measure.point import OutOfMemoryAlone, PointResult, PointSettings, measure_point
from cpbench.measure.step import StepRunner
from cpbench.probe.in_flight import WorkInFlight
from cpbench.probe.predict import Prediction
from cpbench.rank.session import RankSession
from cpbench.record.metadata import device_model, workload_labels
from cpbench.record.mllog import POINT
from cpbench.results.folder import RunFolder
from cpbench.results.row import ResultRow
from cpbench.runtime.logs import CONSOLE, LOG
from cpbench.runtime.seed import seed_all
from cpbench.settings.cp1 import cp1_settings
from cpbench.settings.identity import config_hash
from cpbench.settings.schema import Mode
from cpbench.workloads.base import traits


class Measurer:
    """Measures points and probe steps on this rank's model. In training every one starts from the
    seed's weights (the model built again), so that its checksum depends on the seed and the shape
    alone, not on the steps before it; after running out of memory it is built again too (a step that
    failed midway can leave the model's own communication state mid-flight)."""

    def __init__(self, session: RankSession, baseline: RunFolder | None = None):
        self.session = session
        self.runner = self._build_runner()
        # rank 0, mode=accuracy: the cp=1 rows each point is checked against
        self.reference = None
        if baseline is not None and session.settings.mode is Mode.accuracy:
            self.reference = accuracy.reference_rows(baseline, config_hash(cp1_settings(session.settings)))
        self.done: set[str] = set()  # the row keys of this configuration measured, by any run
        self.largest: tuple[Shape, PointResult] | None = None  # the largest point measured, ok
        self.counted: dict[Shape, Counted] = {}  # model FLOPs by shape (measure.count_flops)
        self.labels = row_labels(session)  # the same in every row of the run

    def _build_runner(self) -> StepRunner:
        s = self.session
        seed_all(s.settings.seed)
        model = s.workload.build_model(s.ctx)
        optim = s.settings.optim
        return StepRunner(
            s.workload, model, s.train, s.ctx, optim.lr, optim.weight_decay, s.settings.mode is Mode.accuracy
        )

    def _rebuild_runner(self) -> None:
        self.runner = None  # the old model is freed before the new one is built
        release(self.session.ctx.device)
        self.runner = self._build_runner()

    def step(self, shape: Shape, settings: PointSettings) -> PointResult:
        """One point's or probe step's steps, agreed on every rank."""
        s = self.session
        if self.runner.moved:
            self._rebuild_runner()
        try:
            result = measure_point(self.runner, shape, s.ctx, s.control, settings)
        except OutOfMemoryAlone as err:
            # Only this rank knows the job ends for out of memory (its peers wait in a collective, rank 0
            # among them, writing nothing): record the point or N in flight as not fitting first.
            WorkInFlight(s.folder).close_oom(f"rank {s.ctx.rank}: {err}")
            raise OutOfMemoryAlone(f"N={shape.n_tokens} does not fit: {err}") from err
        if result.status == "oom":
            self._rebuild_runner()
        return result

    def count(self, shape: Shape) -> Counted | None:
        """The step's model FLOPs at this shape over all ranks (measure.count_flops), counted on fake
        tensors once per shape; a training trace leaves fake gradients, so the model is built again."""
        s = self.session
        if not s.settings.measure.count_flops:
            return None
        if shape not in self.counted:
            start, model, seed = time.perf_counter(), self.runner.model, s.settings.seed
            with cap_lifted(s.ctx.device):
                counted = count_over_ranks(s.workload, model, shape, s.ctx, s.train, seed, s.control)
            self.counted[shape] = counted
            if s.train:
                self._rebuild_runner()
            if s.lead and counted.error:
                LOG.warning("N=%d: FLOPs not counted (%s)", shape.n_tokens, counted.error)
            elif s.lead:
                LOG.info("N=%d: %.6g model TFLOP per step, counted in %.2f s (fake tensors, untimed)",
                         shape.n_tokens, counted.flops / 1e12, time.perf_counter() - start)  # fmt: skip
        return self.counted[shape]

    def row(self, shape: Shape, kind: str, repeats: int, prediction: Prediction | None) -> ResultRow:
        """The identity of a point's row: what it is and how it is measured."""
        s = self.session
        settings, topology, budget = s.settings, s.ctx.topology, s.budget
        columns = traits(s.workload).columns
        return ResultRow(
            workload=s.workload_name, workflow=settings.workflow.value, topology=topology.kind.value,
            cp=topology.cp, grid=topology.grid_label, N_tokens=shape.n_tokens, N_atoms=shape.n_atoms,
            MSA_depth=shape.msa_depth, dtype=settings.dtype.value, kind=kind,
            warmup=settings.timing.warmup, repeats=repeats, seed=settings.seed,
            config_hash=s.config_hash, extra=dict(columns(s.train)) if columns is not None else {},
            budget_gib=budget.gib if budget else None, baseline_gib=budget.baseline_gib if budget else None,
            predicted_peak_gib=predicted_gib(prediction, shape.n_tokens, s),
            **input_columns(settings.data.path, settings.seed), **self.labels,
        )  # fmt: skip

    def measure(
        self, shape: Shape, settings: PointSettings, prediction: Prediction | None, warmed: bool = False
    ) -> PointResult:
        """A walltime point, recorded; `warmed`: its first two warm-up steps already ran (the budget's)."""
        s = self.session
        timing = settings.timing
        row = self.row(shape, "point", timing.repeats, prediction)
        if s.lead:
            s.folder.in_flight.start(row.as_dict())
        s.heartbeat.now(f"N={shape.n_tokens}: {timing.warmup} warm-up and {timing.repeats} timed step(s)")
        result = self.step(
            shape, settings.with_steps(warmup=max(0, timing.warmup - 2)) if warmed else settings
        )
        # After the steps, so that what the count leaves resident (about 1 MiB a shape on CPU) is not
        # in this point's peak, as it is in no probe step's: fake tensors, untimed, once per shape.
        counted = self.count(shape) if result.status == "ok" else None
        result = with_efficiency(result, counted, s.ctx.world_size, s.peak.tflops)
        self.done.add(row.key)  # the probe's answer at a point's N reuses its row
        if result.status == "ok" and (self.largest is None or shape.n_tokens >= self.largest[0].n_tokens):
            self.largest = (shape, result)
        if s.lead:
            self._record(shape, row, result)
        return result

    def _record(self, shape: Shape, row: ResultRow, result: PointResult) -> None:
        s = self.session
        if result.comm_ops:
            s.folder.append_comm_ops([{**row.as_dict(), **op} for op in result.comm_ops])
        tokens_per_s = shape.n_tokens / (result.walltime_ms / 1e3) if result.walltime_ms else None
        measured = dataclasses.replace(row, **result.as_row(), tokens_per_s=tokens_per_s)
        if self.reference is not None and measured.status == "ok":
            rtol = accuracy.tolerance(s.settings)
            status, error = accuracy.check_point(measured.as_dict(), self.reference.get(row.key), rtol)
            measured = dataclasses.replace(measured, status=status, error=error)
            if error:
                LOG.warning("N=%d: %s", shape.n_tokens, error)
        s.folder.in_flight.finish(measured.as_dict())
        s.mllog.event(POINT, measured.walltime_ms, metadata=measured.as_dict())
        LOG.info("N=%d atoms=%d S=%d: %s", shape.n_tokens, shape.n_atoms, shape.msa_depth, _summary(result))


def measure_points(
    measurer: Measurer, todo: list[Shape], settings: PointSettings, prediction: Prediction | None,
    warmed: Shape | None,
) -> None:  # fmt: skip
    """The walltime points phase, with a progress bar on rank 0; `warmed`: the point whose first two
    warm-up steps ran (the budget's timed step)."""
    s = measurer.session
    LOG.info(
        "%s %s on %s cp=%d: %d point(s) to measure -> %s", s.workload_name, s.settings.workflow.value,
        s.ctx.topology.label, s.ctx.topology.cp, len(todo), s.folder.root,
    )  # fmt: skip
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    shown = s.lead and s.settings.log.progress
    with Progress(*columns, console=CONSOLE, disable=not shown, transient=True) as bar:
        task = bar.add_task("points", total=len(todo))
        for shape in todo:
            measurer.measure(shape, settings, prediction, warmed=shape == warmed)
            bar.advance(task)


def row_labels(session: RankSession) -> dict[str, str]:
    """What tells this run's rows from another experiment's in a merge: the workload's preset and a
    hash of its settings, the device model and the memory cap as set (budget_gib, on a GPU left to
    the device, is what the card had free, which differs from run to run)."""
    settings, device = session.settings, session.ctx.device
    preset, sizes_hash = workload_labels(settings, session.workload_name)
    cap = budget_gib(settings.memory, device.type)
    budget = f"{cap:g} GiB" if cap is not None else "device memory" if device.type == "cuda" else "none"
    labels = {"preset": preset, "sizes_hash": sizes_hash, "memory_budget": budget}
    return {**labels, "device": device_model(device)}


def predicted_gib(prediction: Prediction | None, n_tokens: int, session: RankSession) -> float | None:
    """The estimate at N as the measured peak counts it: over rank 0's start-up baseline."""
    estimate = prediction.at(n_tokens) if prediction else None
    if estimate is None:
        return None
    return estimate + (session.budget.baseline_gib if session.budget else 0.0)


def _summary(result: PointResult) -> str:
    if result.status != "ok":
        return f"{result.status} ({result.error}), peak {result.peak_mem_gib:.3f} GiB"
    comm = "not seen" if result.comm_ms is None else f"{result.comm_ms:.2f} ms"
    checksum = "none" if result.checksum is None else f"{result.checksum:.9e}"
    return (
        f"{result.walltime_ms:.2f} ms (IQR {result.walltime_iqr_ms:.2f}), comm {comm}, "
        f"peak {result.peak_mem_gib:.3f} GiB, checksum {checksum}"
    )
