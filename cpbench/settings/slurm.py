"""`slurm.*`: run one cpbench job on SLURM through submitit, its ranks sized from `topology.cp`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class SlurmConfig:
    """Submit the run as one SLURM job through submitit, sized from `topology.cp` (docs/cluster.md)."""

    enabled: bool = False  # submit this run to SLURM (one job, one task per rank) instead of running here
    # submitit executor: "slurm", or "local" (submitit's local executor: the same job on this machine)
    cluster: str = "slurm"
    partition: str | None = None  # sbatch --partition
    account: str | None = None  # sbatch --account
    qos: str | None = None  # sbatch --qos
    constraint: str | None = None  # sbatch --constraint
    time_min: int = 60  # the job's time limit; on timeout or preemption it requeues and resumes
    gpus_per_node: int = 8  # GPUs on one node; 0: CPU ranks (gloo)
    ranks_per_node: int | None = None  # most ranks on one node; null: gpus_per_node (CPU: all on one)
    cpus_per_task: int | None = None  # sbatch --cpus-per-task
    mem_gb: float | None = None  # sbatch --mem: memory per node, in GB
    exclusive: bool = True  # the job has its nodes to itself: jobs sharing a node would time each other
    # Requeues after a timeout (preemptions requeue without limit), and the crashes a point in flight may
    # go through before it is recorded as crashed (launch.max_restarts is the local launcher's).
    max_requeues: int = 3
    signal_delay_s: int = 120  # the warning signal comes this long before the time limit
    setup: list[str] = field(default_factory=list)  # shell lines run in the job before the ranks start
    additional_parameters: dict[str, Any] = field(default_factory=dict)  # any other #SBATCH option
    wait: bool = True  # wait for the job and report; false: print the job id and return
    dry_run: bool = False  # write and print the sbatch script only; submit nothing
