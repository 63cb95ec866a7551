"""A run folder's files read and written, each write atomic: results.csv, comm_ops.csv, failure.json,
the convergence curve, any JSON beside them. Launchers, the rank loop, the probe and the report reach
the folder through `RunFolder`; no other module names a file in it (paths.py names them). The point in
flight (`PointInFlight`) lives here too: it is what lets a run that died leave a row behind, and what a
requeue abandons so the point is measured again."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from cpbench.results.flight import Flight
from cpbench.results.paths import RunPaths
from cpbench.results.row import BASELINE, COLUMNS, CRASH, row_key
from cpbench.results.store import append_rows, read_results, write_atomically


class RunFolder(RunPaths):
    """The folder's paths (`RunPaths`) and their reads and writes."""

    # Atomic reads and writes.
    @staticmethod
    def read_json(path: Path) -> Any:
        """The JSON at `path`, or None when there is none (or it is unreadable: a torn file)."""
        try:
            return json.loads(path.read_text())
        except (OSError, ValueError):
            return None

    @staticmethod
    def write_json(path: Path, value: Any) -> None:
        write_atomically(path, json.dumps(value, indent=2) + "\n")

    @staticmethod
    def write_text(path: Path, text: str) -> None:
        write_atomically(path, text)

    def read_results(self) -> pd.DataFrame:
        return read_results(self.results)

    def append_results(self, rows: Sequence[Mapping[str, Any]]) -> None:
        append_rows(self.results, list(rows))

    def append_comm_ops(self, rows: Sequence[Mapping[str, Any]]) -> None:
        append_rows(self.comm_ops, list(rows), [])

    def set_baseline(self, rows: pd.DataFrame, config_hash: str) -> None:
        """Put the cp=1 baseline's rows (source=baseline) for `config_hash` in results.csv, in place of
        any it held: a rerun copies them again, never twice."""
        held = self.read_results()
        frame = held
        if not frame.empty and "source" in frame.columns:
            frame = frame[~((frame["source"] == BASELINE) & (frame["config_hash"] == config_hash))]
        parts = [f for f in (frame, rows) if not f.empty]
        if not parts and held.empty:  # a baseline of no rows (a convergence curve) and none held
            return
        self._write_results(pd.concat(parts, ignore_index=True) if parts else frame)

    def set_column(self, rows: pd.Series, column: str, value: Any) -> None:
        """Set `column` of the rows `rows` selects (a mask over `read_results()`) to `value`."""
        frame = self.read_results()
        frame.loc[rows, column] = value
        self._write_results(frame)

    def _write_results(self, frame: pd.DataFrame) -> None:
        columns = COLUMNS + [c for c in frame.columns if c not in COLUMNS]
        write_atomically(self.results, frame.reindex(columns=columns).to_csv(index=False))

    def done_keys(self, config_hash: str) -> set[str]:
        """Points of this configuration that already have a row, whatever their status (the cp=1
        baseline's rows beside them are not its points)."""
        frame = self.read_results()
        if frame.empty or "config_hash" not in frame.columns:
            return set()
        mine = frame[frame["config_hash"] == config_hash]
        if "source" in mine.columns:
            mine = mine[mine["source"] != BASELINE]
        return {row_key(r) for r in mine.to_dict("records")}

    def read_convergence(self) -> pd.DataFrame:
        """The convergence curve so far; empty when there is none."""
        return pd.read_csv(self.convergence) if self.convergence.exists() else pd.DataFrame()

    def write_convergence(self, frame: pd.DataFrame) -> None:
        write_atomically(self.convergence, frame.to_csv(index=False))

    # How a run ended.
    def record_failure(
        self, code: int, error: str, detail: str = "", first: bool = False, cp: int | None = None,
        failure: str = "",
    ) -> None:  # fmt: skip
        """Write failure.json, with the cp the run was given (a run that failed early has no run.json)
        and the failure's class (results/row.py FAILURES; blank for bad input or a signal); with
        `first`, keep a failure already recorded (its writer saw the cause)."""
        if first and self.failure.exists():
            return
        date = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
        record = {"exit_code": code, "error": error, "detail": detail, "date": date, "cp": cp}
        self.write_json(self.failure, {**record, "failure": failure})

    def clear_failure(self) -> None:
        """A rerun starts clean: an earlier failure no longer describes the folder once it runs again."""
        self.failure.unlink(missing_ok=True)

    def read_failure(self) -> dict[str, Any] | None:
        return self.read_json(self.failure)

    @property
    def point_in_flight(self) -> PointInFlight:
        return PointInFlight(self)


class RepeatedCrash(RuntimeError):
    """A point or probe N that kept crashing (killed, a dead peer) with no out-of-memory cause: an
    error to look into, never a result."""


class PointInFlight:
    """Names the point being measured, so that a run that dies mid-point can say which one, and the
    next run measures it again; how many runs died at it, and whether a signal stopped the last."""

    def __init__(self, folder: RunFolder):
        self.folder = folder

    def _flight(self) -> Flight:
        return Flight.read(self.folder.read_json(self.folder.state) or {})

    def row(self) -> dict[str, Any] | None:
        """The point in flight, unless its row was written (a run can die between the two writes)."""
        row = self._flight().item
        if row is None or row_key(row) in self.folder.done_keys(row["config_hash"]):
            return None
        return row

    def start(self, row: Mapping[str, Any]) -> None:
        flight = self._flight()
        self._save(flight.start(dict(row), flight.item is not None and row_key(flight.item) == row_key(row)))

    def finish(self, row: Mapping[str, Any]) -> None:
        """Append the point's row, then clear the in-flight mark."""
        self.folder.append_results([row])
        self.abandon()

    def close(self, status: str, error: str, failure: str = "") -> dict | None:
        """Record the point in flight with `status` (a rank raised, or ran out of memory alone) and its
        `failure` class (results/row.py FAILURES); return its row, if there was one."""
        row = self.row()
        if row is None:
            return None
        row = {**row, "status": status, "failure": failure, "error": error}
        self.finish(row)
        return row

    def interrupt(self) -> dict | None:
        """Mark the point in flight as stopped by a signal: measured again, not counted as a crash."""
        row = self.row()
        if row is not None:
            self._save(self._flight().interrupt())
        return row

    def resume(self, max_restarts: int) -> dict | None:
        """The point in flight when the last run died, which this run measures again. One that has
        crashed more than `max_restarts` times is recorded as crashed and raises RepeatedCrash."""
        row = self.row()
        if row is None:
            return None
        flight = self._flight().resume()
        self._save(flight)
        if flight.crashed_too_often(max_restarts):
            error = f"crashed {flight.crashes} time(s) with no out-of-memory cause"
            self.close("crashed", error, CRASH)
            raise RepeatedCrash(
                f"N={row['N_tokens']} {error} (the launcher restarts at most {max_restarts} time(s)); "
                f"recorded as crashed: see {self.folder.logs}"
            )
        return row

    def abandon(self) -> None:
        """Forget the point in flight."""
        self._save(Flight())

    def _save(self, flight: Flight) -> None:
        self.folder.write_json(self.folder.state, flight.as_json())
