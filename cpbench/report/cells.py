"""How a value is written in cp_benchmark.md: numbers to a fixed precision, table cells without the
pipes or line breaks of an error message, and a markdown table."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pandas as pd


def fmt(value: Any, digits: int = 6) -> str:
    """A blank for a missing value; floats to `digits` significant digits (6 by default)."""
    if value is None or (isinstance(value, float) and pd.isna(value)):
        return ""
    if isinstance(value, float) and digits > 6:
        return f"{value:.{digits}g}"
    if isinstance(value, float):
        return f"{value:.6g}" if abs(value) < 1e6 else f"{value:.6e}"
    return str(value)


def cell(value: Any) -> str:
    """A table cell: no pipes or line breaks from error messages."""
    return fmt(value).replace("|", "\\|").replace("\n", " ")


def table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]


def duration(seconds: float | None) -> str:
    """A time as a person reads it, to three figures: ms below a second, s above, and 1,000 s and more
    in full ("8,040 s", not "8.04e+03 s")."""
    if seconds is None:
        return "not estimated"
    value, unit = (seconds, "s") if float(f"{seconds:.3g}") >= 1 else (seconds * 1e3, "ms")
    value = float(f"{value:.3g}")  # three figures, in fixed point whatever the size
    return f"{value:,.0f} {unit}" if value >= 100 else f"{value:g} {unit}"
