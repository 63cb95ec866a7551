"""The probe phase: the largest N that fits (a max-fit row), then its full walltime measurement; if
that runs out of memory the N does not fit after all and the search goes on below it. With
probe.predict, the estimate is calibrated by the largest step that fits so far and its proposal
moves with it (docs/probe.md)."""

from __future__ import annotations

import itertools

import pandas as pd

from cpbench.core import Shape
from cpbench.measure.point import PointResult, PointSettings
from cpbench.probe.predict import Prediction
from cpbench.probe.runner import max_fit_row, run_probe, search_config
from cpbench.probe.search import SearchConfig, Trial, answered
from cpbench.probe.state import ProbeState
from cpbench.rank.points import Measurer, predicted_gib
from cpbench.rank.session import RankSession
from cpbench.results.row import BASELINE, samples_of, shape_key
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


def run_probe_phase(
    measurer: Measurer, probe: ProbeConfig, settings: PointSettings, prediction: Prediction | None,
    done: frozenset[str],
) -> None:  # fmt: skip
    """The probe with `probe`'s settings (the budget may have made its granularity coarser); `settings`
    are how the full measurement at its answer is taken, unless `done` (the row keys measured) has it."""
    s = measurer.session
    state = ProbeState(s.folder, s.config_hash) if s.lead else None
    if state is not None and (n := state.resume_in_flight(s.settings.launch.max_restarts)) is not None:
        LOG.warning("probe: N=%d was in flight when the last run stopped: trying it again", n)
    # The walltime points at the probe's own shapes are trials it need not step again: their fits and
    # peaks start the ramp and the memory model.
    if state is not None:
        tried = {t.n for t in state.trials}
        state.add_points([t for t in point_trials(s) if t.n not in tried])
    trials = list(s.broadcast(state.trials if state else None))
    estimate = prediction

    def search() -> SearchConfig:  # before each step: the estimate calibrated by the largest fit so far
        nonlocal estimate
        estimate = _calibrated(s, estimate, trials)
        return search_for(s, probe, estimate)

    one_step, steps = settings.single_step(), itertools.count(len(trials) + 1)

    def step_at(shape: Shape) -> PointResult:
        s.heartbeat.now(f"probe step {next(steps)}: N={shape.n_tokens}")
        return measurer.model.step(shape, one_step)

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

    while True:
        best, fail = run_probe(search, state, trials, shape_at, step_at, predicted_at, warm_at)
        shape = shape_at(best.n if best else fail.n)
        if not (best and probe.measure_at_max):
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
        measurer.recorder.max_fit(max_fit_row(row, best, fail))


def _calibrated(
    session: RankSession, prediction: Prediction | None, trials: list[Trial]
) -> Prediction | None:
    """probe.predict: the largest step that fit at the probe's shape (a walltime point or a probe step)
    measured what the trace cannot see (the process, workspaces); every estimate adds it, again
    whenever a larger step fits."""
    fits = [t for t in trials if t.fits and t.peak_gib is not None]
    if prediction is None or not fits:
        return prediction
    top = max(fits, key=lambda t: t.n)
    if top.n == prediction.calibrated_at:
        return prediction
    baseline = session.cap.baseline_gib if session.cap else 0.0
    measured = session.broadcast(top.peak_gib - baseline)  # rank 0's baseline, as the rows count it
    calibrated = prediction.calibrated(top.n, measured, session.ctx.topology.tiling.multiple)
    if session.lead:
        session.folder.write_json(session.folder.prediction, calibrated.as_json())
        LOG.info(
            "probe.predict: at N=%d the real peak was %+.1f MiB beside the estimate (memory the trace "
            "does not see); every estimate adds it: proposal N=%s (was %s)",
            top.n, calibrated.missed_gib * 1024, calibrated.proposal, prediction.proposal,
        )  # fmt: skip
    return calibrated


def point_trials(session: RankSession) -> list[Trial]:
    """This configuration's walltime points that fit or ran out of memory, at the probe's shapes."""
    frame = session.folder.read_results()
    if frame.empty:
        return []
    points = frame[(frame["config_hash"] == session.config_hash) & (frame["kind"] == "point")]
    if "source" in points.columns:
        points = points[points["source"] != BASELINE]
    trials = {}
    for r in points[points["status"].isin(["ok", "oom"])].itertuples():
        n = int(r.N_tokens)
        samples = samples_of(getattr(r, "diffusion_samples", None))
        if probe_shape(session, n) == Shape(n, int(r.N_atoms), int(r.MSA_depth), samples):
            peak, least = (None if pd.isna(v) else float(v) for v in (r.peak_mem_gib, r.peak_mem_min_gib))
            trials[n] = Trial(n=n, fits=r.status == "ok", status=r.status, peak_gib=peak, peak_min_gib=least,
                              point=True)  # fmt: skip
    return sorted(trials.values(), key=lambda t: t.n)
