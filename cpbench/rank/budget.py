"""The time budget phase: one step timed, the plan estimated and trimmed to budget.minutes before the
long work (`cpbench.preview.budget`), and again before the probe from the largest point measured. It
returns the trimmed plan; the run's settings stay as they were given."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from cpbench.core import Shape
from cpbench.measure.point import PointResult, PointSettings
from cpbench.preview.budget import (
    BudgetVerdict,
    PilotStep,
    PlannedWork,
    StepGrowth,
    budget_minutes,
    duration,
    estimate,
    fit_budget,
    fixed_part,
)
from cpbench.preview.changes import budget_rows
from cpbench.probe.predict import Prediction
from cpbench.probe.search import Trial
from cpbench.rank.points import Measurer
from cpbench.rank.probe import pilot_probe_step, probe_seeds, probe_step_to_time, search_for
from cpbench.rank.session import RankSession
from cpbench.record import run_record
from cpbench.record.run_record import TimeBudget
from cpbench.runtime.logs import LOG
from cpbench.settings.schema import ProbeConfig


@dataclass(frozen=True)
class BudgetClock:
    """When the run's first timed step started (Unix time: a restart goes on from it), and a
    measurement's costs besides its steps."""

    planned_at: float
    overhead_s: float
    count_s: float = 0.0  # a point's FLOP count (preview/budget.py `PilotStep`)


@dataclass(frozen=True)
class Deadline:
    """When the run's time budget ends (Unix time, from the run's first plan: a restart keeps it), on
    rank 0's clock: the phases that must not overrun it decide there and broadcast."""

    at: float
    minutes: float

    def left_s(self) -> float:
        return self.at - time.time()


@dataclass(frozen=True)
class TrimmedPlan:
    """The plan the budget leaves: the points, how each is measured, the probe's settings."""

    points: list[Shape]
    point_settings: PointSettings
    probe: ProbeConfig
    warmed: Shape | None  # the point whose first two warm-up steps ran (the budget's timed step)
    clock: BudgetClock | None  # None: no budget, or no estimate
    deadline: Deadline | None = None  # None: no budget


def fit_work(
    measurer: Measurer, todo: list[Shape], settings: PointSettings, prediction: Prediction | None,
    restart: int = 0,
) -> TrimmedPlan | None:  # fmt: skip
    """Time one step (the largest point's second warm-up step: the first carries one-off costs; the
    largest, as its time and peak are the nearest to the probe's), estimate the plan from it and trim
    it to budget.minutes. None: refused, nothing runs.
    The budget is the run's: a restart (`restart` > 0) whose run recorded its first plan fits what is
    left to the budget left since that plan's timed step, and runs it trimmed to the least even when
    over it, as the probe does: the run has begun, and its report is owed what it can still measure."""
    s = measurer.session
    probe, budget = s.settings.probe, s.settings.budget
    search = search_for(s, probe, prediction) if probe.enabled else None
    largest = max(todo, key=lambda shape: shape.n_tokens) if todo else None
    minutes = _minutes(s)
    if minutes is None:
        return TrimmedPlan(todo, settings, probe, None, None)
    began = _first_planned_at(s) if restart else None
    planned_at = time.time()  # when, on the run's clock
    # With no estimate (no step to time, or it did not fit) the plan runs as set, bounded by the deadline.
    deadline = Deadline((began or planned_at) + minutes * 60, minutes)
    as_set = TrimmedPlan(todo, settings, probe, None, None, deadline)
    timed, in_flight = largest, False
    if timed is None and search is not None:
        timed, in_flight = probe_step_to_time(s, search)
    if timed is None:
        return as_set
    s.heartbeat.now(f"budget: timing one step at N={timed.n_tokens}")
    timer = time.perf_counter()  # how long (monotonic)
    if todo:  # the largest point's FLOP count, which it needs anyway (once per shape): each point pays one
        measurer.model.count(timed)
    count_s = s.broadcast(time.perf_counter() - timer)
    timer = time.perf_counter()
    one_step = settings.with_steps(warmup=1, repeats=1).fixed()
    if todo:  # the largest point's own warm-up: a crash in it is that point's
        measurer.recorder.start(measurer.row(timed, "point", settings.timing.repeats, prediction))
    if in_flight:  # the probe's start, as the probe's own N in flight
        result = pilot_probe_step(measurer, timed, one_step)
    else:
        result = measurer.model.step(timed, one_step)
    took = s.broadcast(time.perf_counter() - timer)  # rank 0's, on every rank
    if result.status != "ok":
        LOG.warning("budget: the timed step at N=%d did not fit: no estimate, the plan runs as set until "
                    "the budget is spent", timed.n_tokens)  # fmt: skip
        return as_set
    clock = BudgetClock(
        planned_at if began is None else began, max(0.0, took - 2 * result.walltime_ms / 1e3), count_s
    )
    fixed = _fixed_from_pilots(measurer, todo, timed, result, settings) if search else 0.0
    restart = 0 if began is None else restart  # no first plan recorded: this one is the first
    if restart:  # the budget left, in tenths of a minute as the plan line says it
        minutes = max(0.0, round(minutes - (planned_at - clock.planned_at) / 60, 1))
    seconds = result.walltime_ms / 1e3
    step = PilotStep(
        timed.n_tokens, seconds, result.peak_mem_gib, _baseline(s), clock.overhead_s, clock.count_s, fixed
    )
    seeds = probe_seeds(s, todo)
    work = PlannedWork(
        tuple(todo), settings.timing.warmup, settings.timing.repeats, search, probe.measure_at_max, seeds
    )
    verdict = s.broadcast(fit_budget(work, step, minutes, budget.min_repeats) if s.lead else None)
    if s.lead:
        _record_plan(s, work, step, verdict, minutes, clock, restart)
    if verdict.refusal and not restart:
        if s.lead:  # nothing runs: no point was in flight
            s.folder.point_in_flight.abandon()
        return None
    trimmed = verdict.work
    if trimmed.probe is not None:
        probe = trimmed.probe.config
    points = list(trimmed.points)
    # Shapes compare by value: every rank reaches the same answer from rank 0's broadcast verdict.
    warmed = timed if timed in points else None
    steps = settings.with_steps(repeats=trimmed.repeats)
    return TrimmedPlan(points, steps, probe, warmed, clock, deadline)


def budget_spent(session: RankSession, deadline: Deadline | None) -> bool:
    """Whether the time budget is spent (rank 0's clock, on every rank); never with no budget."""
    return deadline is not None and session.broadcast(deadline.left_s() <= 0 if session.lead else None)


def probe_step_over(
    session: RankSession, deadline: Deadline | None, warmup: int
) -> Callable[[int, list[Trial]], str | None]:
    """What the probe asks before each step: why its step at N, with its `warmup` steps, would end past
    the budget, priced by the growth of the steps measured so far (`StepGrowth`: the walltime points'
    median steps and the probe's steps that fit); None: it fits in what is left, or there is no budget.
    Rank 0 decides, for every rank."""

    def over(n: int, trials: list[Trial]) -> str | None:
        if deadline is None:
            return None
        why = None
        if session.lead:
            growth = StepGrowth.fit([(t.n, t.seconds) for t in trials if t.fits and t.seconds])
            cost, left = (1 + warmup) * (growth.seconds(n) if growth else 0.0), deadline.left_s()
            if cost > left:
                why = (f"N={n:,}'s step would take ~{duration(cost)}, past the {deadline.minutes:g}-minute "
                       f"budget ({duration(max(left, 0.0))} left)")  # fmt: skip
        return session.broadcast(why)

    return over


def _fixed_from_pilots(
    measurer: Measurer, todo: list[Shape], timed: Shape, result: PointResult, settings: PointSettings
) -> float:
    """The part of the peak that does not grow with N (`fixed_part`), which places the probe's predicted
    edge: from the timed step's peak and one more step's at the next largest point, when the plan has
    one and the run a memory cap. From the timed step alone the plan scaled all of its peak by N^2,
    and put fold_small's edge near 177 where it was 215, so that it counted the probe short."""
    s = measurer.session
    smaller = sorted({shape.n_tokens: shape for shape in todo if shape.n_tokens < timed.n_tokens}.items())
    if s.cap is None or not smaller or result.peak_mem_gib is None:
        return 0.0
    shape = smaller[-1][1]
    pilot = measurer.model.step(shape, settings.with_steps(warmup=1, repeats=1).fixed())
    if pilot.status != "ok" or pilot.peak_mem_gib is None:
        return 0.0
    baseline = _baseline(s)
    peaks = [
        (shape.n_tokens, pilot.peak_mem_gib - baseline),
        (timed.n_tokens, result.peak_mem_gib - baseline),
    ]
    return s.broadcast(fixed_part(peaks))


def _minutes(session: RankSession) -> float | None:
    """This run's budget on its device (`budget_minutes`); on CUDA with none, one line says so."""
    budget = session.settings.budget
    minutes = budget_minutes(budget.minutes, budget.cuda_minutes, session.ctx.device.type)
    if session.lead and minutes is None and budget.minutes is not None:
        LOG.info("budget: none on CUDA (budget.cuda_minutes=null; budget.minutes=%g is the CPU budget)",
                 budget.minutes)  # fmt: skip
    return minutes


def _first_planned_at(session: RankSession) -> float | None:
    """When the run's first plan timed its step (rank 0's record, on every rank); None: not recorded."""
    planned = run_record.read(session.folder).time_budget if session.lead else None
    return session.broadcast(planned.planned_at if planned is not None else None)


def _baseline(session: RankSession) -> float:
    return session.cap.baseline_gib if session.cap else 0.0


def _record_plan(
    session: RankSession,
    work: PlannedWork,
    step: PilotStep,
    verdict: BudgetVerdict,
    minutes: float,
    clock: BudgetClock,
    restart: int,
) -> None:
    """The plan as set and what it cut into run.json: a restart's as one more line of the run's plan."""
    line = BudgetVerdict(work, *estimate(work, step)).summary(minutes, step)  # the plan as set
    if restart:
        line = f"restart {restart}, {minutes:g} min of the budget left: {line}"
    LOG.info("%s", line)
    cuts = list(verdict.cuts) if restart or not verdict.refusal else []  # refused: nothing runs
    for cut in cuts:
        LOG.warning("budget: cut %s", cut)
    if cuts:
        line += f"; trimmed to {verdict.summary(minutes, step).removeprefix('plan: ')}"
        LOG.info("trimmed %s", verdict.summary(minutes, step))
    if restart and verdict.refusal:
        line += "; over it even so: it runs as trimmed"
        LOG.warning("budget: what is left is over the budget left even trimmed; it runs as trimmed")
    record = run_record.read(session.folder)
    planned = record.time_budget
    if restart and planned is not None:
        planned = replace(planned, cuts=planned.cuts + tuple(cuts), restarts=(*planned.restarts, line))
    else:
        planned = TimeBudget(
            line, tuple(cuts), verdict.refusal, planned_at=clock.planned_at, estimate_s=verdict.seconds
        )
    run_record.update(
        session.folder, what_changed=record.what_changed + tuple(budget_rows(cuts)), time_budget=planned
    )


def fit_probe(
    measurer: Measurer, work: TrimmedPlan, prediction: Prediction | None,
    largest: tuple[Shape, PointResult] | None,
) -> ProbeConfig:  # fmt: skip
    """Before the probe, its estimate again from the largest point measured (its step and peak are
    nearer the probe's N than the first step's; the points' peaks tell the fixed part of the peak from
    the part that grows) against the budget left: a coarser granularity when
    that fits it; else a warning, and the probe runs as trimmed (the points are measured)."""
    s = measurer.session
    if work.clock is None or largest is None:
        return work.probe
    ps = work.point_settings.timing
    shape, result = largest
    left = _minutes(s) * 60 - (time.time() - work.clock.planned_at)
    clock = work.clock
    baseline = _baseline(s)
    seeds = probe_seeds(s, [])  # the points measured, all of them
    peaks = [(t.n, t.peak_gib - baseline) for t in seeds if t.fits and t.peak_gib]
    seconds, fixed = result.walltime_ms / 1e3, fixed_part(peaks)
    # Two N or more: the steps' own growth prices the probe's (the N^2 of one step misses the cubic term)
    steps = [(t.n, t.seconds) for t in seeds if t.fits and t.seconds]
    growth = StepGrowth.fit(steps) if len({n for n, _ in steps}) > 1 else None
    step = PilotStep(
        shape.n_tokens, seconds, result.peak_mem_gib, baseline, clock.overhead_s, clock.count_s, fixed, growth
    )
    search = search_for(s, work.probe, prediction)
    trial = PlannedWork((), ps.warmup, ps.repeats, search, work.probe.measure_at_max, tuple(seeds))
    verdict = s.broadcast(fit_budget(trial, step, max(left, 1.0) / 60, ps.repeats) if s.lead else None)
    probe = verdict.work.probe.config
    if not s.lead:
        return probe
    fitted_at = ", ".join(str(n) for n in sorted({n for n, _ in steps}))
    priced = (f"a + b N^2 + c N^3 fitted to the steps at N={fitted_at}" if growth
              else f"x (N/{step.n})^2 from N={step.n}: {step.seconds:.2g} s a step")  # fmt: skip
    line = (
        f"before the probe: ~{verdict.probe_steps} step(s) and its measurement at the largest fit "
        f"= ~{duration(verdict.seconds)} ({priced}"
        f"{f'; {step.fixed_gib * 1024:.0f} MiB of its peak fixed' if step.fixed_gib else ''}), "
        f"{duration(max(left, 0.0))} of the budget left"
    )
    LOG.info("budget: %s", line)
    for cut in verdict.cuts:
        LOG.warning("budget: cut %s", cut)
    if verdict.refusal:
        line += "; over it even so: the probe runs as trimmed"
        LOG.warning("budget: the probe's estimate is over the budget left; it runs as trimmed")
    record = run_record.read(s.folder)
    planned = record.time_budget
    run_record.update(
        s.folder,
        what_changed=record.what_changed + tuple(budget_rows(verdict.cuts)),
        time_budget=replace(planned, probe_line=line, cuts=planned.cuts + tuple(verdict.cuts)),
    )
    return probe
