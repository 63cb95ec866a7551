#!/usr/bin/env bash
# cpbench on SLURM through submitit: one job of topology.cp tasks (one rank each), sized from cp and
# slurm.gpus_per_node; its submitit files and logs land under output_dir/slurm/<job id>/; on timeout or
# preemption it requeues and resumes. Extra arguments are Hydra overrides. Run from a login node.
#   launch/slurm.sh topology.cp=16 slurm.partition=gpu output_dir=/shared/cpbench/cp16
#   launch/slurm.sh topology.cp=16 slurm.dry_run=true        # print the sbatch script, submit nothing
#   launch/slurm.sh -m topology.cp=1,2,4,8,16 output_dir=/shared/cpbench/sweep
#       (a sweep: every job sized by its own cp, all queued at once, merged when the last one ends)
# Hydra's own SLURM launcher works too, one task per job launching its cp ranks on one node:
#   python -m cpbench -m hydra/launcher=cpbench_slurm hydra.launcher.partition=gpu topology.cp=1,2,4,8
set -euo pipefail
exec python -m cpbench slurm.enabled=true "$@"
