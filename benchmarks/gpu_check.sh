#!/usr/bin/env bash
# What only a GPU can show, as one prepared script: under 5 minutes on one H100 80 GB or one H200, so
# that a rerun fits 15 minutes of device time. Each step has its own timeout, and a failed step does not
# stop the next. One GPU:
#   a. a forked local launch: a Hydra multirun's cp=1 job forks its rank from cpbench's rank server
#      (the launching process must never have initialised CUDA);
#   b. workload=fold, bf16 inference (n_cycles=1, 2 sampling steps: a step near the max costs minutes
#      at AF3's counts), the probe led by the fake-tensor estimate against the card's real memory (its
#      total less 2 GiB for the CUDA context and NCCL), measured max N and peak beside the predicted;
#   c. a real CUDA out-of-memory error under a small cap, recorded as `oom`;
#   d. walltime points from N=512 up, within the step's time, with MFU against the datasheet peak;
#   e. one training point.
# Two or more GPUs visible: 1d cp=2 (NCCL, grouped send/receive), and a lone out-of-memory error on
# rank 1 (the fault injection's real failing allocation) that the ranks agree on and go on from; four or
# more: the 2x2 grid (the NCCL ring).
# $OUT (default gpu_check_out) gets 4 files: summary.txt (one line per step, and the figures),
# gpu_check.log (every step's output), results.csv and cp_benchmark.md (all runs merged).
#
#   bash benchmarks/gpu_check.sh                     # from the repository root, cpbench installed
#   bash benchmarks/gpu_check.sh --wheelhouse DIR    # a machine holding only torch, with no network:
#       cpbench is installed first from DIR (benchmarks/wheelhouse.sh; docs/install.md) into the Python
#       that runs the checks, beside its torch, with no index
#   bash benchmarks/gpu_check.sh --cpu-dry-run       # the same steps on CPU at fold_small sizes (gloo
#       ranks; "GPUs" means CPU ranks): checks the script itself, end to end
set -uo pipefail
out=${OUT:-gpu_check_out}
py=${PYTHON:-python}
dry=0
while [ $# -gt 0 ]; do
    case $1 in
        --wheelhouse)
            [ -d "${2:-}" ] || { echo "gpu_check.sh: --wheelhouse needs a folder of wheels" >&2; exit 2; }
            "$py" -m pip install -q --no-index --find-links "$2" cpbench || exit 1
            shift 2 ;;
        --cpu-dry-run) dry=1; shift ;;
        *) echo "gpu_check.sh: unknown option $1" >&2; exit 2 ;;
    esac
done
mkdir -p "$out"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
log=$out/gpu_check.log summary=$out/summary.txt
: >"$log"
: >"$summary"
status=0 runs=()

say() { echo "$*" | tee -a "$summary"; }

trials() {  # trials NAME [oom]: a probe's steps, measured peak beside predicted; `oom`: one must be oom
    "$py" - "$work/$1/probe.csv" "$1" "${2:-}" <<'PY' | tee -a "$summary" || status=1
import sys

import pandas as pd

path, name, want_oom = sys.argv[1:]
trials = pd.read_csv(path)
print(f"{name}: the probe's steps (peaks in GiB per rank)")
columns = ["N_tokens", "fits", "status", "max_peak_gib", "predicted_peak_gib", "error"]
print(trials[[c for c in columns if c in trials.columns]].to_string(index=False))
if want_oom and not (trials["status"] == "oom").any():
    sys.exit(f"{name}: no step recorded as oom")
PY
}

step() {  # step NAME SECONDS ARGS...: one `python -m cpbench` run, bounded; its folder is $work/NAME
    local name=$1 seconds=$2 start=$SECONDS rc
    shift 2
    echo "== $name (at most ${seconds}s): python -m cpbench $*" >>"$log"
    timeout --signal=INT --kill-after=20 "$seconds" "$py" -m cpbench "$@" output_dir="$work/$name" \
        >>"$log" 2>&1
    rc=$?
    say "$name: exit $rc after $((SECONDS - start))s"
    [ "$rc" -eq 0 ] || status=1
    [ -f "$work/$name/results.csv" ] && runs+=("$work/$name")
}

if [ "$dry" -eq 1 ]; then
    gpus=4 budget=0.15 small=0.08
    model=(workload=fold_small dist.backend=gloo dtype=float32)
    start=64 points='[32,64]' train_n='[32]' oom_at=64
    say "device: CPU dry run ($(nproc) cores), $("$py" -c 'import torch; print("torch", torch.__version__)')"
else
    gpus=$(nvidia-smi -L | wc -l)
    total_mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits -i 0)
    budget=$(( total_mib / 1024 - 2 )) small=8
    model=(workload=fold dist.backend=nccl dtype=bfloat16 workload.n_cycles=1 workload.sampling.steps=2)
    start=1024 points='[512,1024,2048,3072]' train_n='[512]' oom_at=1024
    say "device: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader -i 0) x $gpus"
    say "$("$py" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda,
        "nccl", ".".join(map(str, torch.cuda.nccl.version())))')"
fi
fixed=(budget.minutes=null log.progress=false timing.warmup=1 timing.repeats=2 timing.warmup_max=1
       timing.repeats_max=2)

# a. a forked local launch (a multirun's cp=1 job)
step a_forked 60 -m "${model[@]}" "${fixed[@]}" topology.cp=1 baseline=false "sweep.n_tokens=$train_n" \
    probe.enabled=false
# b. the probe led by the estimate, against the card's memory
step b_probe 120 "${model[@]}" "${fixed[@]}" topology.cp=1 baseline=false 'sweep.n_tokens=[]' \
    probe.enabled=true probe.predict=true probe.granularity=64 probe.measure_at_max=false \
    "memory.budget_gib=$budget"
trials b_probe
# c. a real out-of-memory error under a small cap
step c_oom 60 "${model[@]}" "${fixed[@]}" topology.cp=1 baseline=false 'sweep.n_tokens=[]' \
    probe.enabled=true "probe.start=$start" probe.granularity=64 probe.measure_at_max=false \
    "memory.budget_gib=$small"
trials c_oom oom
# d. walltime points, MFU against the datasheet peak
step d_points 90 "${model[@]}" "${fixed[@]}" topology.cp=1 baseline=false "sweep.n_tokens=$points" \
    probe.enabled=false
# e. one training point
step e_training 60 "${model[@]}" "${fixed[@]}" workflow=training topology.cp=1 baseline=false \
    "sweep.n_tokens=$train_n" probe.enabled=false

if [ "$gpus" -ge 2 ]; then
    step f_cp2 60 "${model[@]}" "${fixed[@]}" topology.cp=2 baseline=false "sweep.n_tokens=$train_n" \
        probe.enabled=false
    step g_lone_oom 90 "${model[@]}" "${fixed[@]}" topology.cp=2 baseline=false \
        "sweep.n_tokens=$train_n" probe.enabled=true "probe.start=$start" probe.granularity=64 \
        probe.measure_at_max=false fault.rank=1 "fault.at_n=$oom_at" fault.kind=oom
    trials g_lone_oom oom
fi
if [ "$gpus" -ge 4 ]; then
    step h_grid_2x2 60 "${model[@]}" "${fixed[@]}" topology.kind=2d topology.cp=4 baseline=false \
        "sweep.n_tokens=$train_n" probe.enabled=false
fi

if [ "${#runs[@]}" -gt 0 ]; then
    "$py" -m cpbench.report "${runs[@]}" --out "$work/report" >>"$log" 2>&1 || status=1
    cp "$work/report/results.csv" "$work/report/cp_benchmark.md" "$out/" 2>/dev/null || status=1
    "$py" - "$out/results.csv" <<'PY' | tee -a "$summary"
import sys

import pandas as pd

rows = pd.read_csv(sys.argv[1])
columns = ["topology", "cp", "workflow", "N_tokens", "status", "kind", "peak_mem_gib", "walltime_ms", "mfu"]
print(rows[[c for c in columns if c in rows.columns]].to_string(index=False))
PY
fi
say "gpu_check: $([ "$status" -eq 0 ] && echo passed || echo FAILED)"
exit $status
