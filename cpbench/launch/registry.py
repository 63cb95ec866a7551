"""Which launcher runs a run: the first in `LAUNCHERS` that says it is chosen. A new launcher is its
module and one line here."""

from __future__ import annotations

from cpbench.launch.base import Launcher
from cpbench.launch.local import LocalLauncher
from cpbench.launch.slurm import JobTasksLauncher, SlurmLauncher
from cpbench.launch.torchrun import TorchrunLauncher, leads_here
from cpbench.settings.schema import BenchConfig

# In order: asked for in the settings first, then what this process finds itself in, then the default.
LAUNCHERS: tuple[type[Launcher], ...] = (SlurmLauncher, TorchrunLauncher, JobTasksLauncher, LocalLauncher)

__all__ = ["LAUNCHERS", "launcher_for", "leads_here"]


def launcher_for(settings: BenchConfig, in_sweep: bool = False) -> Launcher:
    """The launcher of a run of the validated `settings` (`in_sweep`: a job of a multirun)."""
    chosen = next(launcher for launcher in LAUNCHERS if launcher.chosen(settings))
    return chosen.from_settings(settings, in_sweep)
