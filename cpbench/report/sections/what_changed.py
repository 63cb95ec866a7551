"""What differs from the real job (`cpbench.preview.changes`): the table, and the real job's step time
estimated from the measured phases."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd

from cpbench.core.phases import COLUMNS, COUNTED_BY, SAMPLING_STEP, TRUNK
from cpbench.record.run_record import Change
from cpbench.report.analysis import ok_points
from cpbench.report.cells import duration, table


def what_changed_lines(changes: Sequence[Change]) -> list[str]:
    """The what-changed table; limitations name no setting."""
    return table(
        ["what", "benchmark", "real job", "setting", "why"],
        [(c.what, c.benchmark, c.real, c.setting or "limitation: needs an edit to the code", c.why)
         for c in changes],
    )  # fmt: skip


@dataclass(frozen=True)
class _Loop:
    """A loop of the step that the model times apart (core/phases.py): the column of one pass, the
    column counting its passes in the measured step, and the setting whose what-changed row scales it."""

    column: str
    passes: str  # what its passes are called
    count: str
    setting: str


_LOOPS = (
    _Loop(COLUMNS[TRUNK], "trunk passes", "n_cycles", COUNTED_BY[TRUNK]),
    _Loop(COLUMNS[SAMPLING_STEP], "sampling steps", "sampling_steps", COUNTED_BY[SAMPLING_STEP]),
)


def _present(value: object) -> bool:
    return value is not None and not pd.isna(value)


def _estimate(row: pd.Series, scaled: dict[str, Change], topology: bool) -> str:
    """At one point: each loop's real count times one measured pass, plus the rest of the step (input
    embedding, conditioning), which runs once whatever the counts. `topology`: name the point's."""
    where = f"cp={row['cp']}{f' {row.topology}' if topology else ''}, N_tokens={row['N_tokens']}"
    walltime = float(row["walltime_ms"])
    unestimated = f"so the real job's step is not estimated; the measured step is {walltime:.4g} ms"
    terms = []  # (real count, measured count, ms of one pass, what the passes are)
    for loop in _LOOPS:
        ms, count, change = row.get(loop.column), row.get(loop.count), scaled.get(loop.setting)
        if not _present(ms):
            if change:
                return f"- {where}: {loop.passes} were not timed apart ({loop.column} blank), {unestimated}"
            continue  # a loop the real job runs as often: its time is part of the rest
        if not _present(count) or count == 0:  # training: its denoising step is no sampling step
            if change:
                return f"- {where}: the measured step runs no {loop.passes}, {unestimated}"
            continue
        terms.append((count * change.scale if change else count, count, float(ms), loop.passes))
    # The slowest rank's medians of each phase need not add up to the step's: the rest is never negative.
    rest = max(0.0, walltime - sum(n * ms for _, n, ms, _ in terms))
    total = sum(real * ms for real, _, ms, _ in terms) + rest
    formula = " + ".join(f"{real:.4g} {what} x {duration(ms / 1e3)}" for real, _, ms, what in terms)
    measured = " and ".join(f"{n:.4g}" for _, n, _, _ in terms)
    return (
        f"- {where}: {formula} + {duration(rest / 1e3)} rest = **{duration(total / 1e3)}** "
        f"(the measured step ran {measured} of them: {walltime:.4g} ms)"
    )


def _real_job_sentences(frame: pd.DataFrame, changes: Sequence[Change]) -> list[str]:
    """The real job's step time where it runs a loop more often than the benchmark: each loop's real
    count times its pass as timed apart inside the measured steps, plus the rest of the step, at the
    largest N measured at each cp. A loop not timed apart leaves the step not estimated, said so."""
    scaled = {c.setting: c for c in changes if c.scale}
    ok = ok_points(frame) if not frame.empty else frame
    if not scaled or ok.empty:
        return []
    untimed = [c for setting, c in scaled.items() if setting not in {loop.setting for loop in _LOOPS}]
    if untimed:
        loops = ", ".join(f"{c.what} {c.scale:.3g}x" for c in untimed)
        return ["", f"Real job's step: not estimated. It runs some loops more often than the benchmark "
                f"({loops}), and cpbench does not time them apart for this workload."]  # fmt: skip
    layouts = [c for c in ("cp", "topology") if c in ok.columns]
    largest = ok.sort_values("N_tokens").groupby(layouts).tail(1).sort_values(layouts)
    topology = "topology" in ok.columns and ok["topology"].nunique() > 1
    return [
        "",
        "Real job's step, estimated at the largest N measured at each cp: the real job's count of each "
        "loop times one pass as timed apart inside the measured steps (slowest rank, median), plus the "
        "rest of the step, which runs once:",
        "",
        *(_estimate(row, scaled, topology) for _, row in largest.iterrows()),
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
