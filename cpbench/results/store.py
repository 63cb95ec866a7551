"""Tables on disk: CSV rows appended atomically, label columns read back as text."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from cpbench.results.row import COLUMNS, TEXT_COLUMNS


def write_atomically(path: Path, text: str) -> None:
    """Write a sibling temporary file and rename it over `path`: readers never see half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # a plain file's mode, not mkstemp's private 0600
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_results(path: Path, columns: list[str] = COLUMNS) -> pd.DataFrame:
    if not path.exists():
        return pd.DataFrame(columns=columns)
    return pd.read_csv(path, keep_default_na=False, na_values=[""], dtype=dict.fromkeys(TEXT_COLUMNS, str))


def append_row(path: Path, row: Mapping[str, Any]) -> None:
    """Append one row, keeping every earlier row and any extra column a row brings."""
    append_rows(path, [row])


def append_rows(path: Path, rows: list[Mapping[str, Any]], contract: list[str] = COLUMNS) -> None:
    """Append rows to a CSV whose first columns are `contract` (every one, always)."""
    frame = read_results(path, contract)
    new = pd.DataFrame([dict(row) for row in rows])
    frame = new if frame.empty else pd.concat([frame, new], ignore_index=True)
    columns = contract + [c for c in frame.columns if c not in contract]
    write_atomically(path, frame.reindex(columns=columns).to_csv(index=False))
