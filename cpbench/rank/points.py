"""The walltime points phase, and what every phase measures a point with: the model runner, the rows'
identity and rank 0's recorder."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from cpbench.core import Shape
from cpbench.inputs import input_columns
from cpbench.measure.cap import cap_gib
from cpbench.measure.flops import with_efficiency
from cpbench.measure.point import PointResult, PointSettings
from cpbench.probe.predict import Prediction
from cpbench.rank.model import ModelRunner
from cpbench.rank.recorder import Recorder
from cpbench.rank.session import RankSession
from cpbench.record.metadata import device_model, workload_labels
from cpbench.results.folder import RunFolder
from cpbench.results.row import ResultRow, RowIdentity, shape_key
from cpbench.runtime.logs import CONSOLE, LOG
from cpbench.workloads.base import traits


@dataclass(frozen=True)
class Measurer:
    """What a phase measures with. Every row's identity is made once; the model runner alone decides
    when the model is built again, and the recorder alone writes what rank 0 records."""

    session: RankSession
    model: ModelRunner
    rows: RowIdentity
    recorder: Recorder

    @classmethod
    def open(cls, session: RankSession, baseline: RunFolder | None = None) -> Measurer:
        return cls(session, ModelRunner(session), row_identity(session), Recorder(session, baseline))

    def row(self, shape: Shape, kind: str, repeats: int, prediction: Prediction | None) -> ResultRow:
        return self.rows.row(shape, kind, repeats, predicted_gib(prediction, shape.n_tokens, self.session))

    def measure(
        self, shape: Shape, settings: PointSettings, prediction: Prediction | None, warmed: bool = False
    ) -> PointResult:
        """A walltime point, recorded; `warmed`: its first two warm-up steps already ran (the budget's)."""
        s, timing = self.session, settings.timing
        row = self.row(shape, "point", timing.repeats, prediction)
        self.recorder.start(row)
        s.heartbeat.now(f"N={shape.n_tokens}: {timing.warmup} warm-up and {timing.repeats} timed step(s)")
        result = self.model.step(
            shape, settings.with_steps(warmup=max(0, timing.warmup - 2)) if warmed else settings
        )
        # After the steps, so that what the count leaves resident (about 1 MiB a shape on CPU) is not
        # in this point's peak, as it is in no probe step's: fake tensors, untimed, once per shape.
        counted = self.model.count(shape) if result.status == "ok" else None
        result = with_efficiency(result, counted, s.ctx.world_size, s.peak.tflops)
        self.recorder.point(shape, row, result)
        return result


@dataclass(frozen=True)
class PointsMeasured:
    """What the points phase leaves the phases after it."""

    done: frozenset[str]  # the row keys of this configuration measured, by any run (these points too)
    largest: tuple[Shape, PointResult] | None  # the largest point that fit


def measure_points(
    measurer: Measurer, todo: list[Shape], settings: PointSettings, prediction: Prediction | None,
    warmed: Shape | None, done: frozenset[str], spent: Callable[[], bool] = lambda: False,
) -> PointsMeasured:  # fmt: skip
    """The walltime points phase, with a progress bar on rank 0; `warmed`: the point whose first two
    warm-up steps ran (the budget's timed step); `done`: the keys measured before it; `spent`: asked
    before each point (after the first), true once the time budget is spent: the rest are not measured."""
    s = measurer.session
    LOG.info(
        "%s %s on %s cp=%d: %d point(s) to measure -> %s", s.workload_name, s.settings.workflow.value,
        s.ctx.topology.label, s.ctx.topology.cp, len(todo), s.folder.root,
    )  # fmt: skip
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    shown = s.lead and s.settings.log.progress
    largest = None
    with Progress(*columns, console=CONSOLE, disable=not shown, transient=True) as bar:
        task = bar.add_task("points", total=len(todo))
        for i, shape in enumerate(todo):
            if i and spent():
                LOG.warning("budget: spent before N=%d: %d point(s) not measured", shape.n_tokens,
                            len(todo) - i)  # fmt: skip
                todo = todo[:i]
                break
            result = measurer.measure(shape, settings, prediction, warmed=shape == warmed)
            if result.status == "ok" and (largest is None or shape.n_tokens >= largest[0].n_tokens):
                largest = (shape, result)
            bar.advance(task)
    return PointsMeasured(done | {shape_key("point", shape) for shape in todo}, largest)


def row_identity(session: RankSession) -> RowIdentity:
    """What every row of this run holds alike: what is measured, how, and under which labels."""
    settings, topology, cap = session.settings, session.ctx.topology, session.cap
    columns = traits(session.workload).columns
    return RowIdentity({
        "workload": session.workload_name, "workflow": settings.workflow.value,
        "topology": topology.kind.value, "cp": topology.cp, "grid": topology.grid_label,
        "dtype": settings.dtype.value,
        "warmup": settings.timing.warmup, "seed": settings.seed, "config_hash": session.config_hash,
        "extra": dict(columns(session.train)) if columns is not None else {},
        "budget_gib": cap.gib if cap else None, "baseline_gib": cap.baseline_gib if cap else None,
        **input_columns(settings.data.path, settings.seed), **row_labels(session),
    })  # fmt: skip


def row_labels(session: RankSession) -> dict[str, str]:
    """What tells this run's rows from another experiment's in a merge: the workload's preset and a
    hash of its settings, the device model and the memory cap as set (budget_gib, on a GPU left to
    the device, is what the card had free, which differs from run to run)."""
    settings, device = session.settings, session.ctx.device
    preset, sizes_hash = workload_labels(settings, session.workload_name)
    cap = cap_gib(settings.memory, device.type)
    budget = f"{cap:g} GiB" if cap is not None else "device memory" if device.type == "cuda" else "none"
    labels = {"preset": preset, "sizes_hash": sizes_hash, "memory_budget": budget}
    return {**labels, "device": device_model(device)}


def predicted_gib(prediction: Prediction | None, n_tokens: int, session: RankSession) -> float | None:
    """The estimate at N as the measured peak counts it: over rank 0's start-up baseline."""
    estimate = prediction.at(n_tokens) if prediction else None
    if estimate is None:
        return None
    return estimate + (session.cap.baseline_gib if session.cap else 0.0)
