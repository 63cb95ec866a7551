"""The probe phase: the largest N that fits (a max-fit row), then its full walltime measurement; if
that runs out of memory the N does not fit after all and the search goes on below it. With
probe.predict, the estimate is calibrated by the largest step that fits so far and its proposal
moves with it (docs/probe.md)."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import pandas as pd

from cpbench.core import Shape
from cpbench.measure.cap import bound_peak_gib
from cpbench.measure.point import PointResult, PointSettings
from cpbench.probe.predict import Prediction
from cpbench.probe.runner import max_fit_row, run_probe, search_config
from cpbench.probe.search import SearchConfig, Trial, answered, bounds
from cpbench.probe.state import ProbeState
from cpbench.rank.points import Measurer, predicted_gib
from cpbench.rank.session import RankSession
from cpbench.rank.spec import RunSpec
from cpbench.results.row import BASELINE, KERNEL, samples_of, shape_key
from cpbench.runtime.logs import LOG
from cpbench.settings.schema import ProbeConfig
from cpbench.sweep import run_shape


def probe_shape(session: RankSession, n_tokens: int) -> Shape:
    return run_shape(session.settings, n_tokens)


def search_for(session: RankSession, probe: ProbeConfig, prediction: Prediction | None) -> SearchConfig:
    """The probe's search. Peaks are absolute (the CPU baseline included): its limit is the cap a probe
    step is held to (`Cap.for_one_step`)."""
    cap = session.cap.for_one_step() if session.cap else None
    limit = session.broadcast(cap.gib + cap.baseline_gib) if cap else None
    proposal = prediction.proposal if prediction else None
    return search_config(probe, session.ctx.topology, limit, proposal)


def probe_step_to_time(session: RankSession, search: SearchConfig) -> tuple[Shape | None, bool]:
    """For the time budget, with no point left to measure: the step to time, and whether it is the
    probe's N in flight while it runs. Before the probe has an answer of its own: its start, in flight,
    so that running out of memory there, even on one rank alone, is the probe's answer (not in flight,
    an out-of-memory alone in it restarted the ranks into the same step forever). After (a restart
    mid-probe): the largest N known to fit, not in flight, as the probe's N in flight stays its own.
    None: the start is known not to fit, or no N is known to fit."""
    trials = None
    if session.lead:
        trials = [*point_trials(session), *ProbeState(session.folder, session.config_hash).trials]
    trials = session.broadcast(trials)
    if not any(not t.point for t in trials):
        start = probe_shape(session, search.config.start)
        if not any(t.n == start.n_tokens and not t.fits for t in trials):
            return start, True
    elif (best := bounds(trials)[0]) is not None:
        return probe_shape(session, best.n), False
    if session.lead:
        LOG.info("budget: no step to time (the probe's start, or every N it tried, does not fit): no "
                 "estimate, the plan runs as set until the budget is spent")  # fmt: skip
    return None, False


def pilot_probe_step(measurer: Measurer, shape: Shape, settings: PointSettings) -> PointResult:
    """The time budget's step at the probe's start, taken as the probe's N in flight: a step that does
    not fit is the probe's answer there; one that fits answers nothing (the probe steps that N again
    under its own cap) and leaves nothing in flight."""
    s = measurer.session
    state = ProbeState(s.folder, s.config_hash) if s.lead else None
    if state is not None:
        state.start(shape.n_tokens)
    result = measurer.model.step(shape, settings)
    if state is not None and result.status == "ok":
        state.clear_in_flight()
    elif state is not None:
        state.finish(Trial(shape.n_tokens, fits=False, status=result.status, peak_gib=result.peak_mem_gib,
                           peak_min_gib=result.peak_mem_min_gib))  # fmt: skip
    return result


def probe_seeds(session: RankSession, todo: list[Shape]) -> tuple[Trial, ...]:
    """The probe's first trials, for the time budget's estimate of its steps: the walltime points at
    its shape, measured already or still to be (peak unknown)."""
    measured = point_trials(session) if session.lead else []
    tried = {t.n for t in measured}
    to_measure = [
        Trial(shape.n_tokens, fits=True, status="ok", point=True)
        for shape in todo
        if shape == probe_shape(session, shape.n_tokens) and shape.n_tokens not in tried
    ]
    return (*measured, *to_measure)


def run_probe_phase(
    measurer: Measurer, probe: ProbeConfig, settings: PointSettings, spec: RunSpec, done: frozenset[str],
    step_over: Callable[[int, list[Trial]], str | None] = lambda n, trials: None,
) -> None:  # fmt: skip
    """The probe with `probe`'s settings (the budget may have made its granularity coarser); `settings`
    are how the full measurement at its answer is taken, unless `done` (the row keys measured) has it.
    `spec` gives the estimate made before launch and the launcher's restarts; `step_over`, asked before
    each step, why it would overrun the time budget: the probe stops there, its largest fit a bound."""
    s, prediction = measurer.session, spec.prediction
    state = ProbeState(s.folder, s.config_hash) if s.lead else None
    if state is not None and (n := state.resume_in_flight(spec.max_restarts)) is not None:
        LOG.warning("probe: N=%d was in flight when the last run stopped: trying it again", n)
    # The walltime points at the probe's own shapes are trials it need not step again: their fits and
    # peaks start the ramp and the memory model. A kernel fault at one (the full measurement at the
    # probe's answer among them) is that N's answer whatever the probe found there: it bounds the search.
    if state is not None:
        tried = {t.n for t in state.trials}
        state.add_points([t for t in point_trials(s) if t.n not in tried or t.failure == KERNEL])
    trials = list(s.broadcast(state.trials if state else None))
    # Each N's peak in the figure the cap binds on (a GPU's reserved one), which calibrates the estimate:
    # the walltime points' from results.csv, the probe's steps' as they are taken; alike on every rank.
    bound = dict(s.broadcast(point_bound_peaks(s) if s.lead else None))
    estimate = prediction

    def search() -> SearchConfig:  # before each step: the estimate calibrated by the largest fit so far
        nonlocal estimate
        estimate = _calibrated(s, estimate, trials, bound)
        return search_for(s, probe, estimate)

    one_step, steps = settings.single_step(), itertools.count(len(trials) + 1)

    def step_at(shape: Shape) -> PointResult:
        s.heartbeat.now(f"probe step {next(steps)}: N={shape.n_tokens}")
        result = measurer.model.step(shape, one_step)
        bound[shape.n_tokens] = bound_peak_gib(s.cap, result.peak_mem_gib, result.peak_reserved_gib)
        return result

    def warm_at(shape: Shape) -> PointResult | None:
        """probe.warmup steps at this N as a measurement of their own, so that the probe step after
        them starts from a reset peak (and in training from the seed's weights again); their outcome
        when they did not fit, else None."""
        if not probe.warmup:
            return None
        s.heartbeat.now(f"probe: {probe.warmup} warm-up step(s) at N={shape.n_tokens}")
        last = probe.warmup - 1  # the measurement's one repeat is the last warm-up step
        warm = measurer.model.step(shape, one_step.with_steps(warmup=last, warmup_max=last))
        return warm if warm.status != "ok" else None

    def shape_at(n: int) -> Shape:
        return probe_shape(s, n)

    def predicted_at(n: int) -> float | None:
        return predicted_gib(estimate, n, s)

    def stop_before(n: int) -> str | None:
        return step_over(n, trials)

    while True:
        steps_to = (shape_at, step_at, predicted_at, warm_at, stop_before)
        best, fail, stopped = run_probe(search, state, trials, *steps_to)
        if best is None and fail is None:  # stopped before its first step: no N known either way
            return
        shape = shape_at(best.n if best else fail.n)
        if stopped and best and probe.measure_at_max:
            LOG.warning("probe: no full measurement at N=%d: the time budget is spent", best.n)
        if not (best and probe.measure_at_max) or stopped:
            break
        measured = shape_key("point", shape) in done
        result = None if measured else measurer.measure(shape, settings, estimate)
        if result is None or result.status != "oom":
            break
        LOG.warning("probe: the full measurement at N=%d ran out of memory: searching below it", best.n)
        trial = Trial(n=best.n, fits=False, status="oom", peak_gib=result.peak_mem_gib,
                      peak_min_gib=result.peak_mem_min_gib)  # fmt: skip
        trials[:] = answered(trials, trial)
        if state is not None:
            state.finish(trial)
    if shape_key("max-fit", shape) not in done:
        row = measurer.row(shape, "max-fit", settings.timing.repeats, estimate)
        measurer.recorder.max_fit(max_fit_row(row, best, fail, stopped))


def _calibrated(
    session: RankSession, prediction: Prediction | None, trials: list[Trial], bound: dict[int, float | None]
) -> Prediction | None:
    """probe.predict: the largest step that fit at the probe's shape (a walltime point or a probe step)
    measured what the trace cannot see (the process, workspaces; on a GPU, where the cap binds on the
    allocator's reserved segments, what it caches and fragments too: `bound`, each N's peak in that
    figure); every estimate adds it, again whenever a larger step fits. A step the figure was not
    recorded for (a probe step before a restart, on a GPU) calibrates nothing."""
    fits = [t for t in trials if t.fits and bound.get(t.n, _resident(session, t)) is not None]
    if prediction is None or not fits:
        return prediction
    top = max(fits, key=lambda t: t.n)
    if top.n == prediction.calibrated_at:
        return prediction
    baseline = session.cap.bound_baseline_gib if session.cap else 0.0
    # rank 0's baseline, as the rows count it
    measured = session.broadcast(bound.get(top.n, _resident(session, top)) - baseline)
    calibrated = prediction.calibrated(top.n, measured, session.ctx.topology.tiling.multiple)
    if session.lead:
        session.folder.write_json(session.folder.prediction, calibrated.as_json())
        LOG.info(
            "probe.predict: at N=%d the real peak was %+.1f MiB beside the estimate (memory the trace "
            "does not see); every estimate adds it: proposal N=%s (was %s)",
            top.n, calibrated.missed_gib * 1024, calibrated.proposal, prediction.proposal,
        )  # fmt: skip
    return calibrated


def _resident(session: RankSession, trial: Trial) -> float | None:
    """A trial's peak where the cap binds on the figure trials record (CPU), else None."""
    return bound_peak_gib(session.cap, trial.peak_gib, None)


def point_bound_peaks(session: RankSession) -> dict[int, float | None]:
    """This configuration's walltime points that fit at the probe's shapes: N -> the peak in the figure
    the cap binds on (max over ranks; None where the row lacks it)."""
    frame = session.folder.read_results()
    if frame.empty:
        return {}
    points = frame[(frame["config_hash"] == session.config_hash) & (frame["kind"] == "point")
                   & (frame["status"] == "ok")]  # fmt: skip
    if "source" in points.columns:
        points = points[points["source"] != BASELINE]
    found = {}
    for r in points.itertuples():
        n, samples = int(r.N_tokens), samples_of(getattr(r, "diffusion_samples", None))
        if probe_shape(session, n) == Shape(n, int(r.N_atoms), int(r.MSA_depth), samples):
            peak, reserved = (None if pd.isna(v) else float(v)
                              for v in (r.peak_mem_gib, getattr(r, "peak_reserved_gib", None)))  # fmt: skip
            found[n] = bound_peak_gib(session.cap, peak, reserved)
    return found


def point_trials(session: RankSession) -> list[Trial]:
    """This configuration's walltime points that fit, ran out of memory or met a kernel fault, at the
    probe's shapes."""
    frame = session.folder.read_results()
    if frame.empty:
        return []
    points = frame[(frame["config_hash"] == session.config_hash) & (frame["kind"] == "point")]
    if "source" in points.columns:
        points = points[points["source"] != BASELINE]
    kernel = points["failure"] == KERNEL if "failure" in points.columns else False
    trials = {}
    for r in points[points["status"].isin(["ok", "oom"]) | kernel].itertuples():
        n = int(r.N_tokens)
        samples = samples_of(getattr(r, "diffusion_samples", None))
        if probe_shape(session, n) == Shape(n, int(r.N_atoms), int(r.MSA_depth), samples):
            peak, least = (None if pd.isna(v) else float(v) for v in (r.peak_mem_gib, r.peak_mem_min_gib))
            failure = "" if pd.isna(f := getattr(r, "failure", "")) else f
            step = getattr(r, "walltime_ms", None)  # its median step, which prices the probe's (the budget)
            trials[n] = Trial(n=n, fits=r.status == "ok", status=r.status, peak_gib=peak, peak_min_gib=least,
                              seconds=None if step is None or pd.isna(step) else float(step) / 1e3,
                              point=True, failure=failure)  # fmt: skip
    return sorted(trials.values(), key=lambda t: t.n)
