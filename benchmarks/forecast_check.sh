#!/bin/bash
# The time model's error on this machine (docs/predict.md). ROUNDS times in turn (default 3): a
# calibration run of fold_small at N <= 128 (cp=2 and its cp=1 baseline), then N=256 and 384 measured
# at cp=1 and cp=2, and N=128-384 on a 2x2 grid. The last round's `python -m cpbench.calibrate` pools
# every round's calibration run (each point's step, the median over the rounds); each measured point,
# its median over the rounds, is then set beside its prediction. Taken in turn, the calibration and the
# measurements see the same drift of this machine's speed (one run's point moved 25 % between runs two
# hours apart); one command at a time, so that no run shares the cores with another. About 11 minutes
# a round on 2 cores.
#
#   bash benchmarks/forecast_check.sh [OUT]    (OUT: where the runs go, default forecast_check)
set -euo pipefail
OUT=$(realpath -m "${1:-forecast_check}")
ROUNDS=${ROUNDS:-3}
PY=${PYTHON:-python}
CAP=(memory.cpu_budget_gib=4 budget.minutes=null)  # room for N=384 and no trimmed plan
CAL=('sweep.n_tokens=[32,64,96,128]' probe.enabled=false "${CAP[@]}")  # python -m cpbench.calibrate's
for r in $(seq "$ROUNDS"); do
    if [ "$r" -lt "$ROUNDS" ]; then
        $PY -m cpbench output_dir="$OUT/cal$r" "${CAL[@]}"
    else
        $PY -m cpbench.calibrate output_dir="$OUT/cal$r" "${CAL[@]}" forecast.pool="$OUT/cal*"
    fi
    $PY -m cpbench output_dir="$OUT/big$r" 'sweep.n_tokens=[256,384]' probe.enabled=false "${CAP[@]}"
    $PY -m cpbench output_dir="$OUT/grid$r" topology.kind=2d topology.cp=4 baseline=false \
        'sweep.n_tokens=[128,256,384]' probe.enabled=false "${CAP[@]}"
done
HW=forecast.hardware="$OUT/cal$ROUNDS/calibration.yaml"
$PY -m cpbench.forecast output_dir="$OUT/f_big" "$HW" forecast.against="$OUT/big*" \
    'forecast.n_tokens=[256,384]' 'forecast.cp=[1,2]' "${CAP[@]}"
# Four ranks on a node of two devices (one thread a rank on 2 cores): oversubscribed 2x.
$PY -m cpbench.forecast output_dir="$OUT/f_grid" "$HW" forecast.against="$OUT/grid*" \
    forecast.ranks_per_node=4 topology.kind=2d topology.cp=4 'forecast.n_tokens=[128,256,384]' "${CAP[@]}"
