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
