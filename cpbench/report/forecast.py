"""forecast.md's tables and the calibration's check, drawn from the time model's predictions
(cpbench/steptime/): the predicted steps, each measured row beside its prediction, and the planning
table of the smallest CP size that fits each target N. It reads steptime's `Forecast` and
`SmallestFit` by their fields, importing nothing that counts or measures (the report's rule)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pandas as pd

from cpbench.report.cells import duration, table


def forecast_table(forecasts: Sequence[Any]) -> list[str]:
    """Each predicted step: its compute and communication, their shares, and who holds each."""
    body = []
    for fc in forecasts:
        s = fc.seconds
        held, comm_held = s.dominant("compute"), s.dominant("comm")
        body.append(
            (
                f"{fc.topology.kind} cp={fc.topology.cp}",
                fc.n_tokens,
                duration(s.total),
                duration(s.total - s.comm_total),
                duration(s.comm_total),
                f"{s.comm_total / s.total:.0%}",
                held[0],
                comm_held[0] if comm_held[1] else "",
                duration(fc.job_s),
                f"{fc.shared:g}",
            )
        )
    return table(
        [
            "topology",
            "N_tokens",
            "step",
            "compute",
            "comm",
            "comm share",
            "compute held by",
            "comm held by",
            "real job's step",
            "ranks per device",
        ],
        body,
    )


def against_table(measured: Sequence[tuple[Any, Any]]) -> list[str]:
    """Each measured row (a pooled results row) beside its prediction, and the error there."""
    body = []
    for r, predicted in measured:
        s, step = predicted.seconds, r.walltime_ms / 1e3
        comm = "" if pd.isna(r.comm_ms) else duration(r.comm_ms / 1e3)
        runs = f"{r.runs} ({r.walltime_spread:.0%})" if r.runs > 1 else "1"
        body.append(
            (
                f"{r.topology} cp={r.cp}",
                r.N_tokens,
                duration(step),
                comm,
                duration(s.total),
                duration(s.comm_total),
                f"{s.total / step - 1:+.1%}",
                f"{predicted.shared:g}",
                runs,
            )
        )
    return table(
        [
            "topology",
            "N_tokens",
            "measured step",
            "measured comm",
            "predicted step",
            "predicted comm",
            "error",
            "ranks per device",
            "runs (spread)",
        ],
        body,
    )


def planning_table(fits: Sequence[Any]) -> list[str]:
    """For each target N and topology kind, the smallest CP size that fits and its predicted step."""
    body = []
    for p in fits:
        if p.forecast is None:
            body.append((p.n_tokens, p.kind, "none fits", "", "", "", ""))
            continue
        fc = p.forecast
        s, at = fc.seconds, f"cp={fc.topology.cp} ({fc.topology.label})"
        body.append(
            (
                fc.n_tokens,
                p.kind,
                at,
                f"{p.peak_gib:.1f}",
                duration(s.total),
                duration(fc.job_s),
                f"{s.comm_total / s.total:.0%}",
            )
        )
    return table(
        [
            "N_tokens",
            "topology",
            "smallest CP size that fits",
            "peak GiB a rank",
            "step",
            "real job's step",
            "comm share",
        ],
        body,
    )
