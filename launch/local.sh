#!/usr/bin/env bash
# cpbench on this machine: cpbench launches topology.cp ranks itself (torch's elastic launch,
# rendezvous on a free localhost port). Extra arguments are Hydra overrides.
#   launch/local.sh topology.cp=4 workflow=training
#   launch/local.sh -m topology.cp=1,2,4 output_dir=sweeps/cp    # a CP-size sweep, merged at the end
set -euo pipefail
exec python -m cpbench "$@"
