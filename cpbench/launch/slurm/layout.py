"""How a run's `topology.cp` ranks sit on SLURM nodes, and the job's resources as submitit parameters."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from cpbench.core import ConfigError
from cpbench.settings.schema import BenchConfig
from cpbench.settings.slurm import SlurmConfig

# One failing rank ends the job: its peers would otherwise wait in a collective until the timeout.
SRUN_ARGS = ["--kill-on-bad-exit=1"]


@dataclass(frozen=True)
class Layout:
    """How `cp` ranks sit on nodes: one task (and one GPU, if any) per rank."""

    nodes: int
    tasks_per_node: int
    gpus_per_node: int  # 0: CPU ranks

    def __str__(self) -> str:
        gpus = f", {self.gpus_per_node} GPU(s) per node" if self.gpus_per_node else " (CPU ranks)"
        return f"{self.nodes} node(s) x {self.tasks_per_node} rank(s){gpus}"


def layout(cp: int, slurm: SlurmConfig) -> Layout:
    """Fewest nodes that hold `cp` ranks, the same number on each node."""
    if slurm.cluster not in ("slurm", "local"):
        raise ConfigError(f"slurm.cluster={slurm.cluster}: allowed values are slurm, local")
    if slurm.gpus_per_node < 0:
        raise ConfigError(f"slurm.gpus_per_node={slurm.gpus_per_node}: must be >= 0 (0: CPU ranks)")
    if slurm.ranks_per_node is not None and slurm.ranks_per_node < 1:
        raise ConfigError(f"slurm.ranks_per_node={slurm.ranks_per_node}: must be >= 1 or null")
    per_node = slurm.ranks_per_node or slurm.gpus_per_node or cp
    if slurm.gpus_per_node and per_node > slurm.gpus_per_node:
        raise ConfigError(
            f"slurm.ranks_per_node={per_node}: more ranks than slurm.gpus_per_node={slurm.gpus_per_node}"
        )
    nodes = math.ceil(cp / per_node)
    if cp % nodes:
        raise ConfigError(
            f"topology.cp={cp}: does not split evenly over {nodes} nodes of at most {per_node} ranks "
            "(slurm.gpus_per_node / slurm.ranks_per_node)"
        )
    if slurm.cluster == "local" and nodes > 1:
        raise ConfigError(
            f"topology.cp={cp}: slurm.cluster=local runs on this one machine; {nodes} nodes were needed"
        )
    tasks = cp // nodes
    return Layout(nodes, tasks, tasks if slurm.gpus_per_node else 0)


def job_name(cp: int) -> str:
    return f"cpbench-cp{cp}"


def executor_parameters(cfg: BenchConfig, cp: int) -> dict[str, Any]:
    """The submitit AutoExecutor parameters of the job (generic ones, and `slurm_` ones for sbatch)."""
    s, shape = cfg.slurm, layout(cp, cfg.slurm)
    params: dict[str, Any] = {
        "name": job_name(cp),
        "timeout_min": s.time_min,
        "nodes": shape.nodes,
        "tasks_per_node": shape.tasks_per_node,
        "gpus_per_node": shape.gpus_per_node or None,
        "cpus_per_task": s.cpus_per_task,
        "mem_gb": s.mem_gb,
        "slurm_partition": s.partition,
        "slurm_account": s.account,
        "slurm_qos": s.qos,
        "slurm_constraint": s.constraint,
        "slurm_signal_delay_s": s.signal_delay_s,
        "slurm_exclusive": s.exclusive or None,
        "slurm_setup": list(s.setup) or None,
        "slurm_additional_parameters": dict(s.additional_parameters) or None,
        "slurm_srun_args": SRUN_ARGS,
    }
    return {k: v for k, v in params.items() if v is not None}
