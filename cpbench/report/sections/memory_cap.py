"""The per-rank memory cap in a sentence: what a point's peak must stay under to fit."""

from __future__ import annotations

from cpbench.record.run_record import MemoryCap


def lines(cap: MemoryCap | None) -> list[str]:
    if cap is None or cap.cap_gib is None:
        return []
    gib, baseline = cap.cap_gib, cap.baseline_gib or 0
    if cap.held_gib is not None:  # a GPU: the allocator's limit binds on its reserved segments
        return [
            "",
            f"Memory cap: {gib:g} GiB per rank on top of what the caching allocator reserved after "
            f"start-up ({cap.held_gib:.3f} GiB of the device was held then, the CUDA context and NCCL's "
            f"buffers included); a point fits while the allocator's reserved peak (its segments: what it "
            f"caches and fragments too) stays within it over that baseline.",
        ]
    return [
        "",
        f"Memory cap: {gib:g} GiB per rank on top of the {baseline:.3f} GiB a rank holds after "
        f"start-up; peaks are the whole process (baseline included), so a point fits while its peak "
        f"stays under {gib + baseline:.3f} GiB.",
    ]
