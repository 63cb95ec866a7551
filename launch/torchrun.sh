#!/usr/bin/env bash
# cpbench under torchrun: torchrun starts the ranks, each process is one cpbench rank
# (WORLD_SIZE must equal topology.cp).
#   One node:       launch/torchrun.sh 8 topology.cp=8
#   Several nodes:  run on every node with the same RDZV_ENDPOINT (host:port of one of them), e.g.
#                   NNODES=2 RDZV_ENDPOINT=node0:29500 launch/torchrun.sh 8 topology.cp=16 output_dir=/shared/cp16
# Give a fixed output_dir on several nodes: rank 0 decides where rows go, and it must be shared storage.
# Restarts (MAX_RESTARTS, default 3): a rank that runs out of memory alone, or crashes, ends the ranks and
# torchrun starts them again; the run resumes from its folder. Each restart reads a rendezvous store of
# its own (TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1): with the store shared across restarts, 3 restarts of 7
# failed here with "Gloo connectFullMesh failed", the new ranks reading the killed attempt's addresses
# (pytorch/pytorch#135712).
set -euo pipefail
nproc=${1:?usage: launch/torchrun.sh NPROC_PER_NODE [hydra overrides...]}
shift
export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1
restarts=--max-restarts="${MAX_RESTARTS:-3}"
if [[ -n "${RDZV_ENDPOINT:-}" ]]; then
  exec torchrun --nnodes="${NNODES:-1}" --nproc-per-node="$nproc" "$restarts" --rdzv-backend=c10d \
    --rdzv-endpoint="$RDZV_ENDPOINT" --rdzv-id="${RDZV_ID:-cpbench}" -m cpbench "$@"
fi
exec torchrun --standalone --nproc-per-node="$nproc" "$restarts" -m cpbench "$@"
