"""The convergence phase: the curve at shape.* (`cpbench.measure.convergence`), then on rank 0 its
comparison with the reference curve (published, given, or the cp=1 baseline's) and its plot."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from cpbench.checks import reference_curve
from cpbench.measure.cap import lift_cap
from cpbench.measure.convergence import ConvergenceSettings, compare, does_not_fit, run_convergence
from cpbench.measure.oom import describe, is_oom
from cpbench.measure.point import PointSettings
from cpbench.rank.points import Measurer
from cpbench.record import metadata, run_record
from cpbench.record.mllog import TRAIN_LOSS
from cpbench.record.run_record import ConvergenceSummary
from cpbench.report import plots
from cpbench.results.folder import RunFolder
from cpbench.runtime.logs import LOG
from cpbench.settings.identity import curve_key
from cpbench.sweep import run_shape


def converge(measurer: Measurer, settings: PointSettings, baseline: RunFolder | None) -> None:
    s = measurer.session
    shape, steps = run_shape(s.settings), s.settings.convergence.steps
    LOG.info(
        "%s convergence on %s cp=%d: %d step(s) at N=%d -> %s", s.workload_name, s.ctx.topology.label,
        s.ctx.topology.cp, steps, shape.n_tokens, s.folder.root,
    )  # fmt: skip
    key = curve_key(s.settings)
    how = ConvergenceSettings(
        shape=shape, steps=steps, checkpoint_every=s.settings.checkpoint.every, seed=s.settings.seed,
        fault=settings.fault, key=key, cap_gib=s.cap.gib if s.cap else None,
        baseline_gib=s.cap.baseline_gib if s.cap else 0.0,
    )  # fmt: skip

    def logged(row: dict[str, Any]) -> None:  # a convergence step into mllog.txt
        extra = {"step_num": row["step"], "grad_norm": row["grad_norm"], "step_ms": row["step_ms"]}
        s.mllog.event(TRAIN_LOSS, row["loss"], metadata=extra)

    try:
        curve = run_convergence(
            measurer.model.runner(), s.ctx, s.control, s.folder, how, s.heartbeat.step, logged
        )
    except Exception as err:  # out of memory outside a step (a checkpoint, a lazy import) too
        if not is_oom(err):
            raise
        failure = f"rank {s.ctx.rank}: {describe(err)}"
    else:
        failure = None
    if failure:  # raised outside the `except` block: its traceback holds the failed frames
        raise does_not_fit(shape, how.cap_gib, failure)
    lift_cap(s.ctx.device)  # the comparison and the plot are not measured steps
    if not s.lead:
        return
    found = reference_curve.lookup(s.settings, s.folder, baseline)
    summary = ConvergenceSummary(curve_key=key, steps=len(curve))
    curves = {f"{s.ctx.topology.label} cp={s.ctx.topology.cp}": curve}
    if found is not None:
        path, ref = found
        c = s.settings.convergence
        comparison = compare(curve, ref, c.rtol, c.atol)
        summary = replace(summary, reference=str(path), **comparison.as_dict())
        curves[f"reference ({path.name})"] = ref
        say = LOG.info if comparison.match else LOG.warning
        say("convergence vs %s: %s", path, comparison.line())
    else:
        LOG.info("convergence: no reference curve for this configuration (key %s)", key)
    plots.convergence_png(curves, s.folder.convergence_plot)
    last = curve.iloc[-1]
    LOG.info("convergence: step %d loss %.9g grad norm %.9g", last.step, last.loss, last.grad_norm)
    run_record.update(s.folder, convergence=summary, finished=metadata.now())
