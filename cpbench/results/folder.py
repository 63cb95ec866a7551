"""The run folder's one owner: every path a run writes, and their atomic reads and writes.

Launchers, the rank loop, the probe and the report reach the folder through `RunFolder`; no other
module names a file in it. The point in flight (`PointInFlight`) lives here too: it is what lets a run
that died leave a row behind, and what a requeue abandons so the point is measured again."""

from __future__ import annotations

import datetime as dt
import fcntl
import json
import os
import socket
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pandas as pd

from cpbench.core import ConfigError
from cpbench.results.flight import Flight
from cpbench.results.row import BASELINE, COLUMNS, CRASH, row_key
from cpbench.results.store import append_rows, read_results, write_atomically


class FolderLocked(ConfigError):
    """Another run holds the folder."""


class RunFolder:
    RESULTS = "results.csv"
    COMM_OPS = "comm_ops.csv"  # per measured point and op label: calls, bytes and seconds per step
    STATE = "state.json"  # the point in flight
    PROBE_STATE = "probe_state.json"  # every N the probe tried, and the N in flight
    PROBE_CSV = "probe.csv"
    PREDICTION = "prediction.json"  # probe.predict: the fake-tensor estimate at each traced N
    CALIBRATION = "calibration.yaml"  # python -m cpbench.calibrate: the machine's figures (docs/predict.md)
    FORECAST = "forecast.md"  # python -m cpbench.forecast: the predicted times and the planning table
    RUN = "run.json"  # the run's metadata
    FAILURE = "failure.json"  # how a run that did not finish ended
    REPORT = "cp_benchmark.md"
    LOGS = "logs"
    CONVERGENCE = "convergence.csv"  # workflow=convergence: loss and gradient norm per step
    CONVERGENCE_PLOT = "convergence.png"
    MAX_N_PLOT = "cp_benchmark_max_n.png"  # the report's plots (a sweep folder's merged report too)
    WALLTIME_PLOT = "cp_benchmark_walltime.png"
    MFU_PLOT = "cp_benchmark_mfu.png"
    BASELINE = "baseline"  # the cp=1 baseline's run folders, one per configuration: baseline/<key>/
    CHECKPOINTS = "checkpoints"  # one torch.distributed.checkpoint folder per saved step
    MLLOG = "mllog.txt"  # the run in MLPerf's logging format
    SLURM = "slurm"  # submitit's pickles and every task's logs, one folder per job
    EXPERIMENTS = "experiments"  # a plan's sub-runs, one run folder each (experiments/<name>/)
    EXPERIMENTS_CSV = "experiments.csv"  # a plan's verdicts
    EXPERIMENTS_MD = "experiments.md"
    EXPERIMENTS_PNG = "experiments_walltime.png"
    LOCK = ".cpbench.lock"  # held by the process that runs the folder's run; names it
    REPEATS = "repeat_check"  # repeat_check: the second and later runs, run2, run3, ...
    # Files only a run folder holds; a sweep folder holds run folders (its own results.csv is a merge).
    MARKERS = (RESULTS, RUN, FAILURE, STATE, CONVERGENCE)

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
    def prediction(self) -> Path:
        return self.root / self.PREDICTION

    @property
    def calibration(self) -> Path:
        return self.root / self.CALIBRATION

    @property
    def forecast(self) -> Path:
        return self.root / self.FORECAST

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

    @property
    def convergence(self) -> Path:
        return self.root / self.CONVERGENCE

    @property
    def convergence_plot(self) -> Path:
        return self.root / self.CONVERGENCE_PLOT

    @property
    def max_n_plot(self) -> Path:
        return self.root / self.MAX_N_PLOT

    @property
    def walltime_plot(self) -> Path:
        return self.root / self.WALLTIME_PLOT

    @property
    def mfu_plot(self) -> Path:
        return self.root / self.MFU_PLOT

    def baseline_run(self, key: str) -> RunFolder:
        """The cp=1 baseline's run folder for the configuration hashed to `key`."""
        return RunFolder(self.root / self.BASELINE / key)

    @property
    def checkpoints(self) -> Path:
        return self.root / self.CHECKPOINTS

    def checkpoint(self, step: int) -> Path:
        """The checkpoint taken after `step` steps."""
        return self.checkpoints / f"step_{step:06d}"

    @property
    def mllog(self) -> Path:
        return self.root / self.MLLOG

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

    def repeat_run(self, number: int) -> RunFolder:
        """The `number`th run of a repeat check (this folder's own run is the first)."""
        return RunFolder(self.root / self.REPEATS / f"run{number}")

    def experiment_run(self, name: str) -> RunFolder:
        """The run folder of one run of a plan: an experiment, or a measurement of its reference."""
        return RunFolder(self.root / self.EXPERIMENTS / name)

    @property
    def experiments_csv(self) -> Path:
        return self.root / self.EXPERIMENTS_CSV

    @property
    def experiments_md(self) -> Path:
        return self.root / self.EXPERIMENTS_MD

    @property
    def experiments_png(self) -> Path:
        return self.root / self.EXPERIMENTS_PNG

    def check_writable(self) -> None:
        """Fail before anything starts when the folder cannot hold a run (a file, no permission)."""
        if self.root.exists() and not self.root.is_dir():
            raise ConfigError(f"output_dir={self.root}: is a file; give a folder")
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            with open(self.root / f".cpbench-write-test-{os.getpid()}", "w") as probe:
                os.unlink(probe.name)
        except OSError as err:
            raise ConfigError(f"output_dir={self.root}: cannot be written ({err.strerror})") from None

    @property
    def lock_file(self) -> Path:
        return self.root / self.LOCK

    @contextmanager
    def lock(self) -> Iterator[None]:
        """One run per folder: two runs appending to one results.csv lose rows. The lock is an flock,
        so the kernel drops it when its holder dies, and a later run takes a stale lock file over."""
        self.root.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.lock_file, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 200).decode(errors="replace").strip() or "another process"
            os.close(fd)
            raise FolderLocked(
                f"output_dir={self.root}: another run writes there ({holder}); "
                "wait for it to end, or give this run another output_dir"
            ) from None
        try:
            os.ftruncate(fd, 0)
            os.write(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode())
            yield
        finally:
            self.lock_file.unlink(missing_ok=True)  # still held: a run that opens it now finds it locked
            os.close(fd)  # releases the lock

    @contextmanager
    def turn(self) -> Iterator[None]:
        """Wait for the folder's turn lock, then hold it: jobs of a sweep sharing one machine run one
        after another, not timing each other."""
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.root / ".cpbench-turn.lock", "w") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            yield

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
                f"N={row['N_tokens']} {error} (launch.max_restarts={max_restarts}); "
                f"recorded as crashed: see {self.folder.logs}"
            )
        return row

    def abandon(self) -> None:
        """Forget the point in flight."""
        self._save(Flight())

    def _save(self, flight: Flight) -> None:
        self.folder.write_json(self.folder.state, flight.as_json())


def _key(row: Mapping[str, Any]) -> str:
    return row_key(row)
