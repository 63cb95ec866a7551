"""One rank from start to end: a session (context, control group, folder, records) and the phases it
runs in turn (the time budget, the walltime points, the probe, or the convergence curve), each taking
explicit inputs and returning what the next one needs. `loop.py` reads top to bottom."""

from cpbench.rank.loop import run_rank
from cpbench.rank.spec import RunSpec, walltime_points

__all__ = ["RunSpec", "run_rank", "walltime_points"]
