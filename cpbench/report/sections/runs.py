"""The merged report's `## Runs`: every run merged, how it ended, the rows left out as another
configuration's, and the runs that failed with their error."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from cpbench.record.run_record import RunMetadata
from cpbench.report.cells import table


@dataclass(frozen=True)
class RunOutcome:
    """One merged run as the report shows it."""

    name: str
    topology: str
    cp: int | None
    rows: int
    ok_rows: int
    error: str  # empty: it finished
    stale: int  # rows of an earlier configuration in the same folder, left out
    metadata: RunMetadata


def lines(runs: Sequence[RunOutcome]) -> list[str]:
    out = ["## Runs", ""] + table(
        ["run", "topology", "cp", "rows", "ok rows", "outcome"],
        [(r.name, r.topology, r.cp, r.rows, r.ok_rows, r.error or "ok") for r in runs],
    )
    stale = [r for r in runs if r.stale]
    if stale:
        out += [
            "",
            "Left out, as measured under other settings in the same folder (another config hash): "
            + ", ".join(f"{r.stale} row(s) of `{r.name}`" for r in stale)
            + ".",
        ]
    failed = [r for r in runs if r.error]
    if failed:
        out += ["", "### Failed runs", ""]
        out += [f"- `{r.name}` (cp={r.cp}): {r.error}" for r in failed]
    return out
