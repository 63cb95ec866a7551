"""The time budget's plan, what it took, and what it cut or refused (docs/budget.md)."""

from __future__ import annotations

from cpbench.record.run_record import TimeBudget


def lines(budget: TimeBudget | None) -> list[str]:
    if budget is None:
        return []
    restarts = f" and {len(budget.restarts)} restart(s)" if budget.restarts else ""
    took = ""
    if budget.took_s is not None:
        took = f"; it took {budget.took_s / 60:.2g} min (its timed step{restarts} included)"
        if budget.estimate_s and not (budget.refusal or budget.restarts):  # a restart's time is no plan's
            took += f": {budget.took_s:.0f} s against ~{budget.estimate_s:.0f} s estimated"
            took += f" ({budget.estimate_s / budget.took_s - 1:+.0%})"
    out = ["", "## Time budget", "", budget.line + took + "."]
    out += [f"- {line}" for line in budget.restarts]
    out += [f"- {budget.probe_line}"] if budget.probe_line else []
    out += [f"- cut: {cut}" for cut in budget.cuts]
    return out + ([f"- refused: {budget.refusal}"] if budget.refusal else [])
