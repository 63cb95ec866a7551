"""The per-rank memory cap in a sentence: what a point's peak must stay under to fit."""

from __future__ import annotations

from cpbench.record.run_record import MemoryCap


def lines(cap: MemoryCap | None) -> list[str]:
    if cap is None or cap.budget_gib is None:
        return []
    budget, baseline = cap.budget_gib, cap.baseline_gib or 0
    return [
        "",
        f"Memory cap: {budget:g} GiB per rank on top of the {baseline:.3f} GiB a rank holds after "
        f"start-up; peaks are the whole process (baseline included), so a point fits while its peak "
        f"stays under {budget + baseline:.3f} GiB.",
    ]
