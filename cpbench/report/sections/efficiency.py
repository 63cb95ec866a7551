"""The readout's hardware-efficiency section, from rows already measured and the runs' run.json: model
FLOPs, achieved TFLOP/s per rank and MFU per point with the peak they divide by; the CP scaling of
walltime against cp=1 at each N measured at both; the max-N curve against the sqrt(cp) ideal; and
the comm share beside them (docs/measurement.md)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from cpbench.record.run_record import RunMetadata
from cpbench.report.analysis import max_fit, ok_points
from cpbench.report.cells import table

SIZE = ["N_tokens", "N_atoms", "MSA_depth"]


def shares_machine(metas: Sequence[RunMetadata]) -> bool:
    """Whether the ranks shared one device (CPU cores, or several ranks on one GPU): then cp ranks do
    not bring cp devices, and the walltime ratio against cp=1 is a speed-up, not an efficiency."""
    return any(str(m.devices_shared or "no").startswith("yes") or m.on_cpu for m in metas)


def peak_sentence(metas: Sequence[RunMetadata]) -> str:
    """What MFU divides by, in one line: a datasheet figure, a measured CPU GEMM rate, an override, or
    an unknown device (and so no MFU)."""
    peaks = {(m.peak.tflops, m.peak.source) for m in metas if m.peak}
    if not peaks:
        return "MFU is blank: the runs recorded no device peak (run.json has no `peak`)."
    parts = []
    for tflops, source in sorted(peaks, key=lambda p: (p[0] is None, p[0] or 0.0)):
        if tflops is None:
            parts.append(f"MFU is blank: {source}")
        else:
            parts.append(f"MFU divides by {tflops:.4g} TFLOP/s per rank ({source})")
    return "; ".join(parts) + "."


def recompute_sentence(ok: pd.DataFrame) -> list[str]:
    """Where a checkpointed forward ran again in the backward: its hardware FLOPs and HFU, beside the
    model FLOPs and MFU of the table (docs/measurement.md)."""
    if "hardware_tflop" not in ok.columns:
        return []
    again = ok[ok["hardware_tflop"] > ok["model_tflop"] * (1 + 1e-9)]
    parts = [
        f"cp={r.cp} N={r.N_tokens}: {r.hardware_tflop:.4g} TFLOP, {r.hardware_tflop / r.model_tflop:.2f}x "
        "the model's" + (f", HFU {r.hfu:.3g}" if pd.notna(r.hfu) else "")
        for r in again.itertuples()
    ]
    if not parts:
        return []
    ran = "; ".join(parts)
    return [
        "The model recomputes forward ops in its backward (activation checkpointing): the hardware ran "
        f"more FLOPs than the model FLOPs and MFU below count ({ran})."
    ]


def scaling(frame: pd.DataFrame, shared: bool) -> pd.DataFrame:
    """At each size measured at both cp and cp=1: the walltime ratio cp=1 / cp, over cp when every
    rank has its own device (strong-scaling efficiency), as it is when they share one (speed-up)."""
    ok = ok_points(frame)
    base = ok[ok["cp"] == 1].groupby(SIZE)["walltime_ms"].median().rename("cp1_ms")
    at = ok[ok["cp"] > 1].groupby([*SIZE, "topology", "cp"])["walltime_ms"].median().reset_index()
    at = at.join(base, on=SIZE, how="inner")
    ratio = at["cp1_ms"] / at["walltime_ms"]
    return at.assign(scaling=ratio if shared else ratio / at["cp"])


def _fmt(value: Any, spec: str) -> str:
    return "" if value is None or pd.isna(value) else format(value, spec)


def lines(frame: pd.DataFrame, metas: Mapping[str, RunMetadata]) -> list[str]:
    """The section's markdown lines for one like-for-like group of rows, with the run.json of each run
    by name (a merge's rows name their run); none without ok points."""
    ok = ok_points(frame)
    if ok.empty or "model_tflop" not in ok.columns:
        return []
    runs = set(frame["run"]) if "run" in frame.columns else set()
    chosen = [meta for name, meta in metas.items() if name in runs] or list(metas.values())
    shared = shares_machine(chosen)
    named = "speed-up vs cp=1 (shared cores)" if shared else "strong-scaling efficiency"
    out = ["", "### Hardware efficiency", "", peak_sentence(chosen), *recompute_sentence(ok)]
    if shared:
        out.append(
            "The ranks share this machine's cores, so cp ranks bring no more compute than one: the CP "
            "column is the walltime speed-up walltime(cp=1) / walltime(cp), not an efficiency over cp."
        )
    else:
        out.append("The CP column is the strong-scaling efficiency walltime(cp=1) / (cp x walltime(cp)).")
    per_point = ok.groupby(["topology", "cp", *SIZE], sort=True)
    figures = per_point[["model_tflop", "tflops_per_rank", "mfu", "walltime_ms", "comm_ms"]].median()
    scaled = scaling(frame, shared).set_index(["topology", "cp", *SIZE])["scaling"]
    header = ["topology", "cp", "N_tokens", "N_atoms", "MSA", "model TFLOP/step", "TFLOP/s per rank", "MFU",
              named, "comm share"]  # fmt: skip
    body = []
    for key, r in figures.iterrows():
        comm = 0.0 if key[1] == 1 and pd.isna(r["comm_ms"]) else r["comm_ms"]  # one rank: no collectives
        share = comm / r["walltime_ms"]
        body.append([*key, _fmt(r["model_tflop"], ".4g"), _fmt(r["tflops_per_rank"], ".4g"),
                     _fmt(r["mfu"], ".1%"), _fmt(scaled.get(key), ".2f"), _fmt(share, ".0%")])  # fmt: skip
    out += ["", *table(header, body)]
    fits = max_fit(frame)
    grown = fits[(fits["cp"] > 1) & fits["vs_cp1"].notna()]
    if not grown.empty:
        parts = [f"cp={r.cp} {r.topology}: {r.vs_cp1:.2f}x cp=1 against sqrt(cp) = {r.ideal:.2f}x, "
                 f"{r.vs_cp1 / r.ideal:.0%}" for r in grown.itertuples()]  # fmt: skip
        out += ["", "Memory efficiency of the max-N curve (N^2 memory: ideal N grows as sqrt(cp)): "
                  + "; ".join(parts) + "."]  # fmt: skip
    uncounted = sorted({op for ops in ok.get("flops_uncounted", pd.Series(dtype=str)).dropna()
                        for op in str(ops).split()})  # fmt: skip
    if uncounted:
        out += ["", "Ops outside aten that the FLOP counter cannot see into (counted as 0): "
                  + ", ".join(f"`{op}`" for op in uncounted) + "."]  # fmt: skip
    return out
