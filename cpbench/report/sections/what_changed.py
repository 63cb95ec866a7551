"""What differs from the real job (`cpbench.plan.changes`): the table, and the real job's step time
estimated from the measured one."""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from cpbench.record.run_record import Change
from cpbench.report.analysis import ok_points
from cpbench.report.cells import table


def what_changed_lines(changes: Sequence[Change]) -> list[str]:
    """The what-changed table; limitations name no setting."""
    return table(
        ["what", "benchmark", "real job", "setting", "why"],
        [(c.what, c.benchmark, c.real, c.setting or "limitation: needs an edit to the code", c.why)
         for c in changes],
    )  # fmt: skip


def _real_job_sentences(frame: pd.DataFrame, changes: Sequence[Change]) -> list[str]:
    """The real job's step time from the measured one, bounded: each loop count that differs scales
    its part of the step in proportion, so the whole grows at most by the largest ratio. cpbench times
    a step whole, not its parts (the trunk apart from the sampler), and says so."""
    scaled = [c for c in changes if c.scale]
    ok = ok_points(frame) if not frame.empty else frame
    if not scaled or ok.empty:
        return []
    top = max(1.0, *(c.scale for c in scaled))
    at = ok.sort_values("N_tokens").iloc[-1]
    ratios = ", ".join(f"{c.what} {c.scale:.3g}x" for c in scaled)
    return [
        "",
        f"Real job's step, estimated: at N_tokens={at['N_tokens']} at most {top:.3g}x the measured "
        f"{at['walltime_ms']:.4g} ms, i.e. up to {top * at['walltime_ms'] / 1e3:.4g} s ({ratios}; each "
        "loop scales its part of the step in proportion). cpbench times the step whole, not the sampler "
        "apart from the trunk, so the real job's sampling time alone is not measured.",
    ]


def lines(frame: pd.DataFrame, changes: Sequence[Change]) -> list[str]:
    if not changes:
        return []
    return [
        "",
        "## What differs from the real job",
        "",
        *what_changed_lines(changes),
        *_real_job_sentences(frame, changes),
    ]
