"""What a rank process receives from the process that launched it."""

from __future__ import annotations

from dataclasses import dataclass, field

from cpbench.core import Shape, Topology
from cpbench.inputs import input_point
from cpbench.probe.predict import Prediction
from cpbench.record.run_record import Change
from cpbench.settings.schema import BenchConfig
from cpbench.sweep import sweep_points


@dataclass
class RunSpec:
    """The validated settings and where to write."""

    settings: BenchConfig
    output_dir: str
    # The what-changed table (`cpbench.preview.changes`), made before launch; rank 0 records it in run.json.
    what_changed: list[Change] = field(default_factory=list)
    # The cp=1 run beside this one: mode=accuracy checks every point against it; a convergence curve
    # is compared with it when no published one is found.
    reference_dir: str | None = None
    prediction: Prediction | None = None  # probe.predict: made before the ranks started
    # How many times the launcher started this run's ranks before (a relaunch after a crash, torchrun's
    # restart, a SLURM requeue): a restart goes on with the run's time budget instead of a new one.
    restart: int = 0
    # How many times the launcher restarts the ranks after a crash (the local launcher's
    # launch.max_restarts, torchrun's --max-restarts, a SLURM job's slurm.max_requeues): a point in flight
    # through more crashes than that is recorded as crashed. Set by the launcher, which alone knows it.
    max_restarts: int = 0

    @property
    def topology(self) -> Topology:
        t = self.settings.topology
        return Topology.from_config(t.kind, t.cp, t.grid)


def walltime_points(settings: BenchConfig) -> list[Shape]:
    """The points a run measures: the feature file's one shape, else the product of the sweep lists."""
    if settings.data.path:
        return [input_point(settings.data.path, settings.seed, settings.data.msa_depth)]
    return sweep_points(settings)
