#!/usr/bin/env bash
# A hand-written SLURM job: one srun task per node, each running torchrun for that node's GPUs.
# cpbench's own submission (launch/slurm.sh) sizes the job from topology.cp and requeues on timeout;
# this script is for clusters where you would rather write the sbatch yourself.
#   sbatch --nodes=2 launch/sbatch_torchrun.sh topology.cp=16 output_dir=/shared/cpbench/cp16
#SBATCH --job-name=cpbench
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=8
#SBATCH --time=01:00:00
#SBATCH --output=cpbench-%j.out
set -euo pipefail
gpus=${SLURM_GPUS_ON_NODE:-8}
head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
# A fixed output_dir on shared storage: every node's ranks must agree on it, and a rerun resumes there.
srun --kill-on-bad-exit=1 torchrun --nnodes="$SLURM_JOB_NUM_NODES" --nproc-per-node="$gpus" \
  --rdzv-backend=c10d --rdzv-endpoint="$head:29500" --rdzv-id="$SLURM_JOB_ID" \
  -m cpbench "topology.cp=$((SLURM_JOB_NUM_NODES * gpus))" "$@"
