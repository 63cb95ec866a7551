"""failure.json: how a run that did not finish ended, kept beside its rows so that a merged report
can list the failed jobs of a sweep with their error, even when they measured nothing."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

from cpbench.results.store import write_atomically

FAILURE_JSON = "failure.json"


def record_failure(output_dir: Path, code: int, error: str, detail: str = "", first: bool = False) -> None:
    """Write `failure.json`; with `first`, keep a failure already recorded (its writer saw the cause)."""
    path = output_dir / FAILURE_JSON
    if first and path.exists():
        return
    failure = {
        "exit_code": code,
        "error": error,
        "detail": detail,
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
    }
    write_atomically(path, json.dumps(failure, indent=2) + "\n")


def clear_failure(output_dir: Path) -> None:
    """A rerun starts clean: an earlier failure no longer describes the folder once it runs again."""
    (output_dir / FAILURE_JSON).unlink(missing_ok=True)


def read_failure(output_dir: Path) -> dict[str, Any] | None:
    path = output_dir / FAILURE_JSON
    return json.loads(path.read_text()) if path.exists() else None
