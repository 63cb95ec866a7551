"""mllog.txt: the run in MLPerf's logging format (`:::MLLOG {json}` lines), written through the
mlperf-logging package's own logger so MLPerf tooling reads it: submission info, init, run start and
stop, every measured point, the probe's answer and each convergence step. Rank 0 writes; a run
that resumes appends to it (each attempt has its own run_start and run_stop)."""

from __future__ import annotations

import logging
import math
from pathlib import Path
from types import TracebackType
from typing import Any

import torch
from mlperf_logging.mllog import constants, mllog

from cpbench.record.run_record import RunMetadata

# cpbench's own keys, beside MLPerf's constants.
POINT = "cpbench_point"  # one results.csv row
MAX_FIT = "cpbench_max_fit"  # the probe's answer
TRAIN_LOSS = "train_loss"  # one convergence step: the loss, its step and gradient norm as metadata
FRAMEWORK = "submission_framework"


def _plain(value: Any) -> Any:
    """JSON without NaN: a figure not measured is null."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class RunLog:
    """The run's MLPerf log; with no path (ranks other than 0) every call does nothing."""

    def __init__(self, path: Path | None):
        self.path, self.logger, self.handler = path, None, None

    def __enter__(self) -> RunLog:
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            base = logging.getLogger(f"cpbench.mllog.{id(self)}")
            base.propagate = False
            base.setLevel(logging.INFO)
            self.handler = logging.FileHandler(self.path)
            base.addHandler(self.handler)
            self.logger = mllog.MLLogger(logger=base, default_namespace="cpbench", default_stack_offset=2)
        return self

    def __exit__(self, kind: type | None, error: BaseException | None, tb: TracebackType | None) -> None:
        status = constants.SUCCESS if error is None else constants.ABORTED
        self.end(constants.RUN_STOP, metadata={constants.STATUS: status})
        if self.handler is not None:
            self.handler.close()
            logging.getLogger(f"cpbench.mllog.{id(self)}").removeHandler(self.handler)
        self.logger = None

    def event(self, key: str, value: Any = None, metadata: dict[str, Any] | None = None) -> None:
        if self.logger is not None:
            self.logger.event(key, _plain(value), metadata=_plain(metadata))

    def start(self, key: str) -> None:
        if self.logger is not None:
            self.logger.start(key)

    def end(self, key: str, metadata: dict[str, Any] | None = None) -> None:
        if self.logger is not None:
            self.logger.end(key, metadata=metadata)

    def submission(self, meta: RunMetadata, workload: str, workflow: str, cp: int, seed: int) -> None:
        """Who and what: the platform (device model and count), the framework, the CP size."""
        self.event(constants.SUBMISSION_BENCHMARK, f"cpbench/{workload}/{workflow}")
        self.event(constants.SUBMISSION_DIVISION, constants.OPEN)
        self.event(constants.SUBMISSION_STATUS, constants.RESEARCH)
        self.event(constants.SUBMISSION_ORG, "cpbench")
        self.event(constants.SUBMISSION_PLATFORM, f"{meta.device_count}x{meta.device} ({meta.host})")
        self.event(FRAMEWORK, f"torch {torch.__version__} ({meta.backend})")
        self.event(constants.CONTEXT_PARALLELISM, cp)
        self.event(constants.SEED, seed)
