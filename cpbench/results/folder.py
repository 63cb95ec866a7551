"""The run folder's one owner: every path a run writes, and their atomic reads and writes.

Launchers, the rank loop, the probe and the report reach the folder through `RunFolder`; no other
module names a file in it. The point in flight (`InFlight`) lives here too: it is what lets a run
that died leave a row behind, and what a requeue abandons so the point is measured again."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from cpbench.results.row import point_key
from cpbench.results.store import append_rows, read_results, write_atomically


class RunFolder:
    RESULTS = "results.csv"
    COMM_OPS = "comm_ops.csv"  # per measured point and op label: calls, bytes and seconds per step
    STATE = "state.json"  # the point in flight
    OOM_ALONE = "oom_alone.json"  # a rank out of memory while its peers were stuck: what ran out
    PROBE_STATE = "probe_state.json"  # every N the probe tried, and the N in flight
    PROBE_CSV = "probe.csv"
    RUN = "run.json"  # the run's metadata
    FAILURE = "failure.json"  # how a run that did not finish ended
    REPORT = "cp_benchmark.md"
    LOGS = "logs"
    SLURM = "slurm"  # submitit's pickles and every task's logs, one folder per job
    # Files only a run folder holds; a sweep folder holds run folders (its own results.csv is a merge).
    MARKERS = (RESULTS, RUN, FAILURE, STATE)

    def __init__(self, root: Path | str):
        self.root = Path(root)

    def __repr__(self) -> str:
        return f"RunFolder({str(self.root)!r})"

    # Paths.
    @property
    def results(self) -> Path:
        return self.root / self.RESULTS

    @property
    def comm_ops(self) -> Path:
        return self.root / self.COMM_OPS

    @property
    def state(self) -> Path:
        return self.root / self.STATE

    @property
    def probe_state(self) -> Path:
        return self.root / self.PROBE_STATE

    @property
    def probe_csv(self) -> Path:
        return self.root / self.PROBE_CSV

    @property
    def run_json(self) -> Path:
        return self.root / self.RUN

    @property
    def failure(self) -> Path:
        return self.root / self.FAILURE

    @property
    def report(self) -> Path:
        return self.root / self.REPORT

    @property
    def logs(self) -> Path:
        return self.root / self.LOGS

    def rank_log(self, rank: int) -> Path:
        return self.logs / f"rank{rank}.log"

    @property
    def launch_logs(self) -> Path:
        return self.logs / "launch"

    @property
    def slurm(self) -> Path:
        return self.root / self.SLURM

    def slurm_job(self, job_id: str) -> Path:
        """A job's own folder; `%j` is the pattern submitit fills with the job id."""
        return self.slurm / job_id

    @property
    def submitted(self) -> Path:
        return self.slurm / "submitted.json"

    @property
    def sbatch_script(self) -> Path:
        return self.slurm / "cpbench.sbatch"

    def is_run(self) -> bool:
        return any((self.root / name).exists() for name in self.MARKERS)

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

    def done_keys(self, config_hash: str) -> set[str]:
        """Points of this configuration that already have a row, whatever their status."""
        frame = self.read_results()
        if frame.empty or "config_hash" not in frame.columns:
            return set()
        mine = frame[frame["config_hash"] == config_hash]
        return {point_key(r.kind, r.N_tokens, r.N_atoms, r.MSA_depth) for r in mine.itertuples()}

    def read_metadata(self) -> dict[str, Any]:
        return self.read_json(self.run_json) or {}

    def write_metadata(self, metadata: Mapping[str, Any]) -> None:
        self.write_json(self.run_json, dict(metadata))

    # How a run ended.
    def record_failure(
        self, code: int, error: str, detail: str = "", first: bool = False, cp: int | None = None
    ) -> None:
        """Write failure.json, with the cp the run was given (a run that failed early has no run.json);
        with `first`, keep a failure already recorded (its writer saw the cause)."""
        if first and self.failure.exists():
            return
        date = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
        failure = {"exit_code": code, "error": error, "detail": detail, "date": date, "cp": cp}
        self.write_json(self.failure, failure)

    def clear_failure(self) -> None:
        """A rerun starts clean: an earlier failure no longer describes the folder once it runs again."""
        self.failure.unlink(missing_ok=True)

    def read_failure(self) -> dict[str, Any] | None:
        return self.read_json(self.failure)

    @property
    def oom_alone(self) -> Path:
        return self.root / self.OOM_ALONE

    def record_oom_alone(self, kind: str, n_tokens: int, rank: int, error: str) -> None:
        """A rank out of memory alone ends the job before its peers can agree; it leaves this note so
        that the relaunched run records the N in flight as not fitting, not as a crash."""
        self.write_json(self.oom_alone, {"kind": kind, "N_tokens": n_tokens, "rank": rank, "error": error})

    def take_oom_alone(self, kind: str, n_tokens: int | None) -> str | None:
        """The error of a rank that ran out of memory alone at this in-flight N, once; else None."""
        note = self.read_json(self.oom_alone)
        if not note or note["kind"] != kind or note["N_tokens"] != n_tokens:
            return None
        self.oom_alone.unlink(missing_ok=True)
        return f"rank {note['rank']}: {note['error']}"

    @property
    def in_flight(self) -> InFlight:
        return InFlight(self)


class InFlight:
    """Names the point being measured, so a run that dies mid-point leaves a row behind."""

    def __init__(self, folder: RunFolder):
        self.folder = folder

    def row(self) -> dict[str, Any] | None:
        return (self.folder.read_json(self.folder.state) or {}).get("in_flight")

    def start(self, row: Mapping[str, Any]) -> None:
        self.folder.write_json(self.folder.state, {"in_flight": dict(row)})

    def finish(self, row: Mapping[str, Any]) -> None:
        """Append the point's row, then clear the in-flight mark."""
        self.folder.append_results([row])
        self.abandon()

    def close(self, status: str, error: str) -> dict | None:
        """Record a point left in flight by a run that died; return its row, if there was one."""
        row = self.row()
        if row is None:
            return None
        row = {**row, "status": status, "error": error}
        self.finish(row)
        return row

    def abandon(self) -> None:
        """Forget the point in flight without a row: it was interrupted, not broken, and is measured
        again by the next run."""
        self.folder.write_json(self.folder.state, {"in_flight": None})
