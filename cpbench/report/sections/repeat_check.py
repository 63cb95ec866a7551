"""Same answer twice: repeat_check's spreads, per point and figure the range over the runs, and the
largest relative spread of each figure, the run's own tolerance."""

from __future__ import annotations

from cpbench.record.run_record import PointSpread, RepeatCheck
from cpbench.report.cells import fmt, table


def lines(check: RepeatCheck | None) -> list[str]:
    if check is None:
        return []
    figures = list(check.tolerance)
    tolerance = ", ".join(f"{name} {value:.3g}" for name, value in check.tolerance.items())
    tolerance = tolerance or "none (no point finished in every run)"
    out = [
        "",
        f"## Same answer twice (repeat_check={check.runs})",
        "",
        f"The configuration's points, run {check.runs} times with the same seed (the runs after the "
        "first in repeat_check/): per figure min to max, and (max - min) / abs(median). The largest "
        f"relative spread of each figure is this run's tolerance: {tolerance}.",
        "",
    ]

    def cell(point: PointSpread, name: str) -> str:
        if name not in point.figures:
            return ""
        s = point.figures[name]
        return f"{fmt(s.min, 10)} to {fmt(s.max, 10)} ({s.relative:.3g})"

    rows = [(p.n_tokens, p.n_atoms, p.msa_depth, *(cell(p, f) for f in figures)) for p in check.points]
    return out + table(["N_tokens", "N_atoms", "MSA", *figures], rows)
