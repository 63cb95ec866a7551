"""mode=accuracy: each point's checked quantities against the run of the same configuration at cp=1.

Deterministic algorithms make a run repeat itself bit for bit at one layout. Across layouts the
reductions run in another order (a sum split over ranks, then summed over them), so the values agree
only to the dtype's rounding. Hence the rule: bit-exact against a reference of the same layout (a cp=1
run), otherwise within a relative tolerance (`accuracy.rtol`, by default by dtype)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from cpbench.results.folder import RunFolder
from cpbench.results.row import row_key
from cpbench.settings.schema import BenchConfig

CHECKED = ("checksum", "loss", "grad_norm")
# Relative, against the larger magnitude. float32: the built-in workloads' cp>1 checksums differ from
# cp=1 by about 1e-7 relative (docs/measurement.md), the loss and gradient norm after a few AdamW
# steps by more; the fault.kind=perturb knob moves them by about 1e-3.
RTOL = {"float32": 1e-5, "bfloat16": 1e-2, "float16": 1e-2}
MISMATCH = "mismatch"


def tolerance(settings: BenchConfig) -> float:
    """0 (bit-exact) when this run is itself at cp=1, else accuracy.rtol or the dtype's default."""
    if settings.topology.cp == 1:
        return 0.0
    rtol = settings.accuracy.rtol
    return rtol if rtol is not None else RTOL[settings.dtype.value]


def _value(row: Mapping[str, Any], name: str) -> float | None:
    value = row.get(name)
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else float(value)


def _show(value: float | None) -> str:
    return "none" if value is None else f"{value:.17g}"  # every digit: a bit-level difference shows


def disagreements(row: Mapping[str, Any], reference: Mapping[str, Any], rtol: float) -> list[str]:
    """One message per checked quantity that differs from the reference's by more than `rtol` of the
    larger magnitude (rtol 0: any difference), with both values."""
    found = []
    for name in CHECKED:
        here, there = _value(row, name), _value(reference, name)
        if here is None and there is None:
            continue
        if here is None or there is None or abs(here - there) > rtol * max(abs(here), abs(there)):
            rule = "bit-exact" if rtol == 0 else f"rtol {rtol:g}"
            found.append(f"{name} {_show(here)} here vs {_show(there)} at cp=1 ({rule})")
    return found


def check_point(row: Mapping[str, Any], reference: Mapping[str, Any] | None, rtol: float) -> tuple[str, str]:
    """The (status, error) of a point measured ok: `mismatch` with both values when it disagrees."""
    if reference is None:
        return "ok", "accuracy: not checked, the cp=1 run has no row for this point"
    if reference.get("status") != "ok":
        return "ok", f"accuracy: not checked, the cp=1 run's point is {reference.get('status')}"
    found = disagreements(row, reference, rtol)
    return (MISMATCH, "accuracy: " + "; ".join(found)) if found else ("ok", "")


def reference_rows(folder: RunFolder, config_hash: str) -> dict[str, dict[str, Any]]:
    """The cp=1 run's point rows of its config, by point key."""
    frame = folder.read_results()
    if frame.empty:
        return {}
    rows = frame[(frame["kind"] == "point") & (frame["config_hash"] == config_hash)]
    return {row_key(r): r for r in rows.astype(object).where(rows.notna(), None).to_dict("records")}
