"""`slurm.dry_run`: the sbatch script of a run, written from its typed settings without a cluster.

It is the script submitit submits for the same settings, line for line (tests/e2e/test_slurm_cluster.py
holds the two side by side on a real cluster): the `#SBATCH` options sorted by name, the job's and
each task's log files in the job's folder, `--signal=USR2@<delay>` (the warning submitit checkpoints
on), then srun running submitit's task entry on the job's pickled call."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Any

from cpbench.launch.slurm.layout import SRUN_ARGS, job_name, layout
from cpbench.settings.schema import BenchConfig

# The signal submitit's job environment checkpoints and requeues on.
WARNING_SIGNAL = "USR2"


def _memory(mem_gb: float | None) -> str | None:
    """sbatch's --mem: whole gigabytes as GB, else megabytes."""
    if mem_gb is None:
        return None
    return f"{int(mem_gb)}GB" if mem_gb == int(mem_gb) else f"{int(mem_gb * 1024)}MB"


def _option(key: str, value: Any) -> str:
    flag = key.replace("_", "-")
    return f"#SBATCH --{flag}" if value is True else f"#SBATCH --{flag}={shlex.quote(str(value))}"


def sbatch_script(cfg: BenchConfig, job_folder: Path, cp: int) -> str:
    """The script of one job of `cp` ranks whose files land in `job_folder` (a path holding `%j`)."""
    s, shape = cfg.slurm, layout(cp, cfg.slurm)
    task_out, task_err = job_folder / "%j_%t_log.out", job_folder / "%j_%t_log.err"
    options = {
        "job_name": job_name(cp),
        "time": s.time_min,
        "nodes": shape.nodes,
        "ntasks_per_node": shape.tasks_per_node,
        "gpus_per_node": shape.gpus_per_node or None,
        "cpus_per_task": s.cpus_per_task,
        "mem": _memory(s.mem_gb),
        "partition": s.partition,
        "account": s.account,
        "qos": s.qos,
        "constraint": s.constraint,
        "exclusive": s.exclusive or None,
        "wckey": "submitit",
        "signal": f"{WARNING_SIGNAL}@{s.signal_delay_s}",
        "output": str(task_out).replace("%t", "0"),  # the batch script's own output: task 0's files
        "error": str(task_err).replace("%t", "0"),
        "open-mode": "append",  # a requeued job appends to its logs
    }
    options = {k: v for k, v in options.items() if v is not None} | dict(s.additional_parameters)
    srun = ["srun", "--unbuffered", "--output", str(task_out), "--error", str(task_err), *SRUN_ARGS]
    task = f"{shlex.quote(sys.executable)} -u -m submitit.core._submit {shlex.quote(str(job_folder))}"
    lines = ["#!/bin/bash", "", "# Parameters", *(_option(k, options[k]) for k in sorted(options))]
    if s.setup:
        lines += ["", "# setup", *s.setup]
    lines += ["", "# command", "export SUBMITIT_EXECUTOR=slurm", f"{shlex.join(srun)} {task}", ""]
    return "\n".join(lines)
