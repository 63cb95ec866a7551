"""Every path a run folder holds, by name: a run's files, its logs, its sub-runs (baseline, repeats,
experiments) and submitit's job folders. Paths only, as submitit's `JobPaths` is: reading and writing
them is `RunFolder`'s (folder.py), holding the folder is lock.py's."""

from __future__ import annotations

from pathlib import Path
from typing import TypeVar

P = TypeVar("P", bound="RunPaths")


class RunPaths:
    """The folder at `root`: a file's name as a constant, its path as a property."""

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
    TURN = ".cpbench-turn.lock"  # jobs of a sweep on one machine take turns by it
    REPEATS = "repeat_check"  # repeat_check: the second and later runs, run2, run3, ...
    # Files only a run folder holds; a sweep folder holds run folders (its own results.csv is a merge).
    MARKERS = (RESULTS, RUN, FAILURE, STATE, CONVERGENCE)

    def __init__(self, root: Path | str):
        self.root = Path(root)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self.root)!r})"

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

    def baseline_run(self: P, key: str) -> P:
        """The cp=1 baseline's run folder for the configuration hashed to `key`."""
        return type(self)(self.root / self.BASELINE / key)

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

    def repeat_run(self: P, number: int) -> P:
        """The `number`th run of a repeat check (this folder's own run is the first)."""
        return type(self)(self.root / self.REPEATS / f"run{number}")

    def experiment_run(self: P, name: str) -> P:
        """The run folder of one run of a plan: an experiment, or a measurement of its reference."""
        return type(self)(self.root / self.EXPERIMENTS / name)

    @property
    def experiments_csv(self) -> Path:
        return self.root / self.EXPERIMENTS_CSV

    @property
    def experiments_md(self) -> Path:
        return self.root / self.EXPERIMENTS_MD

    @property
    def experiments_png(self) -> Path:
        return self.root / self.EXPERIMENTS_PNG

    @property
    def lock_file(self) -> Path:
        return self.root / self.LOCK

    @property
    def turn_file(self) -> Path:
        return self.root / self.TURN

    def is_run(self) -> bool:
        return any((self.root / name).exists() for name in self.MARKERS)
