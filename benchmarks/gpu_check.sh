#!/usr/bin/env bash
# What only a GPU can show, sized to fit 13 minutes on one H200 (each step below has its own timeout,
# and a step that fails does not stop the next):
#   1. NCCL at cp=1 through the real entry point, and a few walltime points of the AF3-size Pairformer;
#   2. the probe under torch.cuda.set_per_process_memory_fraction (memory.budget_gib) ending in a real
#      CUDA out-of-memory error;
#   3. the AF3-size fold workload's max N at cp=1 in bf16 (inference, 2 sampling steps: the per-step
#      cost; the rest of the job is unchanged);
#   4. the same probe led by the fake-tensor estimate (probe.predict=true) under an 80 GiB budget (the
#      capacity table's cp=1 row; on CUDA the estimate needs memory.budget_gib: with it null there is no
#      budget to estimate against and the run stops; budget.minutes=null: the default 8-minute plan,
#      scaled from the step at N=256 by (N/256)^2, refused the run on CPU; this step's timeout bounds
#      it instead): it proposes the largest N, two real steps confirm
#      it, and probe.csv shows the measured peak beside the predicted one. Not yet run on a GPU (written
#      without one; its command lines ran on CPU at fold_small size, docs/fold.md says so).
# Everything lands under $OUT (default gpu_check_out); the last step merges the runs into one
# results.csv and cp_benchmark.md (with plots) under $OUT/report, ready for docs/cp_benchmark.md
# (`python -m cpbench.report $OUT/nccl_pairformer $OUT/probe_oom $OUT/fold_bf16 --publish`).
#
#   bash benchmarks/gpu_check.sh            # from the repository root, the project installed
set -uo pipefail
out=${OUT:-gpu_check_out}
py=${PYTHON:-python}
mkdir -p "$out"
status=0

step() {  # step NAME SECONDS ARGS...: one cpbench run, bounded, its log kept beside its results
    local name=$1 seconds=$2
    shift 2
    echo "== $name (at most ${seconds}s): python -m cpbench $*"
    local start=$SECONDS
    timeout --signal=INT --kill-after=20 "$seconds" "$py" -m cpbench "$@" output_dir="$out/$name" \
        >"$out/$name.log" 2>&1
    local rc=$?
    tail -n 15 "$out/$name.log"
    echo "== $name: exit $rc after $((SECONDS - start))s"
    [ "$rc" -eq 0 ] || status=1
}

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,power.limit --format=csv || true
"$py" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name())"

step nccl_pairformer 120 workload=pairformer dist.backend=nccl topology.cp=1 dtype=bfloat16 \
    'sweep.n_tokens=[256,512,1024]' probe.enabled=false timing.warmup=3 timing.repeats=5

step probe_oom 150 workload=pairformer dist.backend=nccl topology.cp=1 dtype=bfloat16 \
    'sweep.n_tokens=[256]' probe.enabled=true probe.start=512 probe.granularity=128 \
    memory.budget_gib=16 timing.warmup=1 timing.repeats=2

step fold_bf16 210 workload=fold dist.backend=nccl topology.cp=1 dtype=bfloat16 workload.sampling.steps=2 \
    'sweep.n_tokens=[256]' probe.enabled=true probe.start=512 probe.granularity=128 \
    timing.warmup=1 timing.repeats=2

step fold_predicted 300 workload=fold dist.backend=nccl topology.cp=1 dtype=bfloat16 workload.sampling.steps=2 \
    'sweep.n_tokens=[256]' probe.enabled=true probe.predict=true probe.granularity=128 memory.budget_gib=80 \
    probe.measure_at_max=false timing.warmup=1 timing.repeats=1 budget.minutes=null
echo "== fold_predicted: each probe step, measured peak beside predicted (GiB per rank):"
"$py" - "$out/fold_predicted/probe.csv" <<'PY' || status=1
import sys

import pandas as pd

trials = pd.read_csv(sys.argv[1])
print(trials[["N_tokens", "fits", "status", "max_peak_gib", "predicted_peak_gib", "guided"]].to_string(index=False))
PY

echo "== a real CUDA out-of-memory error in the probe's log:"
grep -r -m 3 -i "out of memory" "$out/probe_oom.log" "$out/probe_oom" 2>/dev/null || echo "(none found)"
"$py" -m cpbench.report "$out/nccl_pairformer" "$out/probe_oom" "$out/fold_bf16" "$out/fold_predicted" \
    --out "$out/report" || status=1
sed -n '1,200p' "$out/report/cp_benchmark.md" 2>/dev/null
exit $status
