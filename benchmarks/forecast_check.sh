#!/bin/bash
# The time model's error on this machine (docs/predict.md): calibrate on fold_small at N <= 128 (cp=2
# and its cp=1 baseline), measure N=256 and 384 at cp=1 and cp=2 and N=128-384 on a 2x2 grid, then
# predict each measured row from the calibration and print the error. One command after another, so
# that no run shares the cores with another. About 20 minutes on 2 cores.
#
#   bash benchmarks/forecast_check.sh [OUT]    (OUT: where the runs go, default forecast_check)
set -euo pipefail
OUT=$(realpath -m "${1:-forecast_check}")
PY=${PYTHON:-python}
CAP=(memory.cpu_budget_gib=4 budget.minutes=null)  # room for N=384 and no trimmed plan
CAL=$OUT/cal/calibration.yaml
$PY -m cpbench.calibrate output_dir="$OUT/cal" budget.minutes=null
$PY -m cpbench output_dir="$OUT/big" 'sweep.n_tokens=[256,384]' probe.enabled=false "${CAP[@]}"
$PY -m cpbench output_dir="$OUT/grid" topology.kind=2d topology.cp=4 baseline=false \
    'sweep.n_tokens=[128,256,384]' probe.enabled=false "${CAP[@]}"
$PY -m cpbench.forecast output_dir="$OUT/f_big" forecast.hardware="$CAL" forecast.against="$OUT/big" \
    'forecast.n_tokens=[256,384]' 'forecast.cp=[1,2]' "${CAP[@]}"
# Four ranks on a node of two devices (one thread a rank on 2 cores): oversubscribed 2x.
$PY -m cpbench.forecast output_dir="$OUT/f_grid" forecast.hardware="$CAL" forecast.against="$OUT/grid" \
    forecast.ranks_per_node=4 topology.kind=2d topology.cp=4 'forecast.n_tokens=[128,256,384]' "${CAP[@]}"
