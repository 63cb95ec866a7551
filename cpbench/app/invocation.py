"""What a command works on: the run as checked before anything starts, and, once the run's folder is
this call's, the folder, the what-changed rows and where the cp=1 baselines are cached."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from cpbench.core import Topology
from cpbench.launch.base import Launcher
from cpbench.record.run_record import Change
from cpbench.results.folder import RunFolder
from cpbench.settings.schema import BenchConfig
from cpbench.workloads.base import Workload


@dataclass(frozen=True)
class CheckedRun:
    """A run that may start: its typed settings, topology, workload, and the launcher of its ranks."""

    settings: BenchConfig
    topology: Topology
    workload: Workload
    launcher: Launcher


@dataclass(frozen=True)
class Invocation:
    """One command's call on its checked run, inside the run's folder."""

    run: CheckedRun
    folder: RunFolder
    changes: list[Change]
    baseline_root: Path
