#!/usr/bin/env bash
# cpbench under torchrun: torchrun starts the ranks, each process is one cpbench rank
# (WORLD_SIZE must equal topology.cp).
#   One node:       launch/torchrun.sh 8 topology.cp=8
#   Several nodes:  run on every node with the same RDZV_ENDPOINT (host:port of one of them), e.g.
#                   NNODES=2 RDZV_ENDPOINT=node0:29500 launch/torchrun.sh 8 topology.cp=16 output_dir=/shared/cp16
# Give a fixed output_dir on several nodes: rank 0 decides where rows go, and it must be shared storage.
set -euo pipefail
nproc=${1:?usage: launch/torchrun.sh NPROC_PER_NODE [hydra overrides...]}
shift
if [[ -n "${RDZV_ENDPOINT:-}" ]]; then
  exec torchrun --nnodes="${NNODES:-1}" --nproc-per-node="$nproc" --rdzv-backend=c10d \
    --rdzv-endpoint="$RDZV_ENDPOINT" --rdzv-id="${RDZV_ID:-cpbench}" -m cpbench "$@"
fi
exec torchrun --standalone --nproc-per-node="$nproc" -m cpbench "$@"
