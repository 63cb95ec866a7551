"""The results rows as a table (a max-fit row names the first N that did not fit; noisy points are
marked), and the errors the rows carry, listed after it."""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from cpbench.report.analysis import noisy
from cpbench.report.cells import fmt, table

# Column -> header, in the table's order.
HEADERS = {
    "kind": "kind", "workload": "workload", "preset": "preset", "workflow": "workflow",
    "topology": "topology", "cp": "cp",
    "input": "input", "chains": "chains", "N_tokens": "N_tokens", "N_atoms": "N_atoms", "MSA_depth": "MSA",
    "diffusion_samples": "samples", "dtype": "dtype", "status": "status",
    "walltime_ms": "walltime ms (median)", "walltime_iqr_ms": "IQR ms", "tokens_per_s": "tokens/s",
    "comm_ms": "comm ms", "peak_mem_gib": "peak GiB (max rank)", "peak_mem_min_gib": "peak GiB (min rank)",
    "predicted_peak_gib": "predicted peak GiB", "checksum": "checksum", "seed": "seed",
    "config_hash": "config",
}  # fmt: skip


def table_lines(frame: pd.DataFrame, extra: Sequence[str] = ()) -> list[str]:
    cols = [c for c in extra if c in frame.columns] + [c for c in HEADERS if c in frame.columns]
    # a run without probe.predict, data.path, a diffusion batch
    for optional in ("predicted_peak_gib", "input", "chains", "diffusion_samples"):
        if optional in cols and frame[optional].replace("", None).isna().all():
            cols.remove(optional)
    if "preset" in cols and (frame["preset"].isna() | (frame["preset"] == frame["workload"])).all():
        cols.remove("preset")  # it says nothing the workload's name does not
    shown = frame.copy()
    # A max-fit row names the first N that did not fit: out of memory, or a kernel fault (no memory edge).
    for column, mark in (("oom_at", "OOM"), ("kernel_fault_at", "kernel fault")):
        if column in shown.columns:
            at = (shown["kind"] == "max-fit") & shown[column].notna()
            edge = shown.loc[at, column].astype(int).astype(str)
            shown.loc[at, "status"] = shown.loc[at, "status"].astype(str) + f", {mark}@" + edge
    shown.loc[noisy(shown), "status"] = "ok, noisy"
    # Checksums keep enough digits to tell two runs apart.
    body = [
        [fmt(v, 12 if c == "checksum" else 6) for c, v in zip(cols, row, strict=True)]
        for row in shown[cols].itertuples(index=False)
    ]
    return table([HEADERS.get(c, c) for c in cols], body)


def error_lines(frame: pd.DataFrame, with_run: bool = False) -> list[str]:
    """Each row's error, and apart from them the notes of rows that are ok (a max-fit row whose probe
    stopped short of its edge: its N a lower bound)."""
    if "error" not in frame.columns:
        return []
    said = frame[frame["error"].notna() & (frame["error"].astype(str) != "")]
    where = (lambda r: f"{r.run} cp={r.cp} ") if with_run and "run" in frame.columns else (lambda r: "")
    out = []
    for heading, rows in (
        ("Errors:", said[said["status"] != "ok"]),
        ("Notes:", said[said["status"] == "ok"]),
    ):
        if not rows.empty:
            out += ["", heading, ""] + [
                f"- {where(r)}N={r.N_tokens} ({r.status}): {r.error}" for r in rows.itertuples()
            ]
    return out
