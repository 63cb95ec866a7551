#!/usr/bin/env bash
# What only a GPU can show, as one prepared script sized to end inside a device lease: 5.5 minutes on one
# H100 by the forecast below (most of it the CPU's work: start-ups, FLOP counts), so that a rerun fits 15
# minutes of device time. Each step is one `python -m cpbench` run with its own time limit, started from
# an empty work folder; a failed or timed-out step does not stop the next. One GPU:
#   a. a forked local launch: a Hydra multirun's cp=1 job forks its rank from cpbench's rank server
#      (the launching process must never have initialised CUDA);
#   b. workload=fold, bf16 inference (n_cycles=1, 2 sampling steps), the probe led by the fake-tensor
#      estimate under a cap that puts the edge near N=1,000 (probe.max_tokens=1024), measured peaks
#      beside the predicted;
#   c. a real CUDA out-of-memory error under a smaller cap, recorded as `oom`;
#   d. walltime points at N=256, 512 and 1,024, with MFU against the datasheet peak;
#   e. one training point.
# Two or more GPUs: f. 1d cp=2 (NCCL, grouped send/receive); g. a lone out-of-memory error on rank 1
# (the fault injection's real failing allocation) that the ranks agree on and go on from. Four or
# more: h. the 2x2 grid (the NCCL ring). NCCL_DEBUG=WARN (unless set) keeps NCCL's warnings in the log.
#
# A step past its time limit (3x the forecast's time for it: `limits` below) is stopped with Ctrl-C,
# which cpbench answers by closing its run from the rows so far, and is reported as "timed out" with
# what it had measured; those rows join the merged results. Only a step that exits with an error, or
# whose rows say the check did not hold, is FAILED.
#
# $OUT (default gpu_check_out) gets 4 files: summary.txt (one line per step, the probes' steps, the
# merged table), gpu_check.log (every step's output, NCCL's warnings included), results.csv and
# cp_benchmark.md (all runs merged). Exit 0: every step passed; 3: some timed out, none failed;
# 1: a step failed; 2: bad arguments.
#
#   bash benchmarks/gpu_check.sh                     # cpbench installed where $PYTHON (python3) finds it
#   bash benchmarks/gpu_check.sh --wheelhouse DIR    # a machine holding torch, with no network: every
#       wheel in DIR (benchmarks/wheelhouse.sh, docs/install.md) but a torch is installed with
#       `pip install --no-index --no-deps --target` into the work folder, put first on PYTHONPATH;
#       nothing is resolved, so pip never looks for a torch and the machine's own stays
#   bash benchmarks/gpu_check.sh --cpu-dry-run [--wheelhouse DIR]  # the same steps on CPU at fold_small
#       sizes (gloo ranks; "GPUs" are 4 CPU ranks): checks the script itself, end to end
#   bash benchmarks/gpu_check.sh [--wheelhouse DIR] --check-install  # the install and `python -m cpbench`
#       starting, as every step starts it, and nothing else
#   nvidia-smi -L | bash benchmarks/gpu_check.sh --count-gpus      # the GPUs CUDA will see, the first's index
set -uo pipefail
py=${PYTHON:-python3}
case $py in */*) py=$(cd "$(dirname "$py")" && pwd)/${py##*/} ;; esac  # the checks run from another folder
wheelhouse="" dry=0 only_install=0

# The GPUs CUDA will number, from `nvidia-smi -L` on stdin (not its line count: MIG slices are lines too,
# and CUDA_VISIBLE_DEVICES hides GPUs). Prints the count and the first one's nvidia-smi index.
read -r -d '' COUNT_GPUS <<'PY'
import os
import re
import sys

gpus, slices = [], []  # (uuid, index); (uuid, its GPU's index)
for line in sys.stdin:
    if m := re.match(r"GPU (\d+): .*\(UUID: (GPU-[^)\s]+)\)", line):
        gpus.append((m[2], int(m[1])))
    elif (m := re.match(r"\s+MIG .*\(UUID: (MIG-[^)\s]+)\)", line)) and gpus:
        slices.append((m[1], gpus[-1][1]))
in_mig_mode = {index for _, index in slices}


def named(entry):
    """The device an entry of CUDA_VISIBLE_DEVICES names, as (uuid, index), or None. An index is read
    as CUDA reads it (strtoul: "1gpu" is 1); a UUID may be cut short where it stays unique."""
    if entry.startswith(("GPU-", "MIG-")):
        hits = [device for device in gpus + slices if device[0].startswith(entry)]
        return hits[0] if len(hits) == 1 else None
    digits = re.match(r"\d+", entry)
    return gpus[int(digits[0])] if digits and int(digits[0]) < len(gpus) else None


# CUDA takes the entries in order up to the first that names no device; a repeated one hides them all.
visible = [*gpus, *slices] if "CUDA_VISIBLE_DEVICES" not in os.environ else []
if "CUDA_VISIBLE_DEVICES" in os.environ:
    for entry in os.environ["CUDA_VISIBLE_DEVICES"].split(","):
        device = named(entry.strip())
        if device is None:
            break
        if device in visible:
            visible = []
            break
        visible.append(device)
# A GPU in MIG mode is no CUDA device; its slices are, but CUDA shows a process one MIG slice at most.
whole = [index for uuid, index in visible if uuid.startswith("GPU-") and index not in in_mig_mode]
sliced = [index for uuid, index in visible if index in in_mig_mode]
if whole:
    print(len(whole), whole[0])
else:
    print(1 if sliced else 0, sliced[0] if sliced else "-")
PY

# cpbench as every step finds it (run from the work folder): the installed copy, the one just installed
# where a wheelhouse was given, with its config tree and each requirement at a version it accepts.
read -r -d '' CHECK_INSTALL <<'PY'
import importlib.metadata as md
import importlib.util
import sys
from pathlib import Path

from packaging.requirements import Requirement

site = sys.argv[1]
if importlib.util.find_spec("cpbench") is None:
    sys.exit(f"gpu_check.sh: {sys.executable} finds no cpbench: install it, or give --wheelhouse DIR")
where = Path(importlib.util.find_spec("cpbench").origin).resolve().parent
if site and not where.is_relative_to(Path(site).resolve()):
    sys.exit(f"gpu_check.sh: cpbench comes from {where}, not from the wheelhouse's install in {site}")
if importlib.util.find_spec("cpbench.configs") is None:
    sys.exit(f"gpu_check.sh: cpbench from {where} has no cpbench.configs: a source tree, not an install")
found, problems = [], []
for text in md.requires("cpbench") or []:
    need = Requirement(text)
    if need.marker is not None and not need.marker.evaluate({"extra": ""}):
        continue
    try:
        have = md.version(need.name)
    except md.PackageNotFoundError:
        problems.append(f"{need.name} is missing")
        continue
    found.append(f"{need.name} {have}")
    if not need.specifier.contains(have, prereleases=True):
        problems.append(f"{need.name} {have} is not {need.specifier}")
if problems:
    sys.exit(f"gpu_check.sh: cpbench from {where}: " + "; ".join(problems))
print(f"cpbench {md.version('cpbench')} from {where}, with {', '.join(found)}")
PY

while [ $# -gt 0 ]; do
    case $1 in
        --wheelhouse)
            [ -d "${2:-}" ] || { echo "gpu_check.sh: --wheelhouse needs a folder of wheels" >&2; exit 2; }
            wheelhouse=$(cd "$2" && pwd)
            shift 2 ;;
        --cpu-dry-run) dry=1; shift ;;
        --check-install) only_install=1; shift ;;
        --count-gpus) "$py" -c "$COUNT_GPUS"; exit ;;
        *) echo "gpu_check.sh: unknown option $1" >&2; exit 2 ;;
    esac
done

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir "$work/cwd"
# Every Python of the checks starts here, an empty folder: `python -m` and `python -` put the current
# folder first on sys.path, and from the repository root the source tree's cpbench/ (no cpbench.configs)
# would shadow the installed one, and Hydra would find no config.
in_work() { (cd "$work/cwd" && "$@"); }
site=""
if [ -n "$wheelhouse" ]; then
    wheels=()
    for wheel in "$wheelhouse"/*.whl; do
        case ${wheel##*/} in
            torch-*) echo "gpu_check.sh: leaving out ${wheel##*/}: the machine's own torch stays" >&2 ;;
            *) wheels+=("$wheel") ;;
        esac
    done
    [ -f "${wheels[0]:-}" ] || { echo "gpu_check.sh: no wheels in $wheelhouse" >&2; exit 2; }
    site=$work/site
    start=$SECONDS
    # Compiled as installed: a step's processes would otherwise each compile what they import (where
    # PYTHONDONTWRITEBYTECODE is set, as on the development machine, 0.5 s of CPU a process).
    in_work "$py" -m pip install -q --no-index --no-deps --target "$site" "${wheels[@]}" || exit 1
    export PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH}
    echo "gpu_check.sh: installed ${#wheels[@]} wheels from $wheelhouse in $((SECONDS - start))s"
fi
found=$(in_work "$py" -c "$CHECK_INSTALL" "$site") || exit 1
if [ "$only_install" -eq 1 ]; then
    echo "gpu_check.sh: $found"
    # `python -m cpbench` itself, as each step starts it: Hydra composes its config from cpbench.configs.
    in_work "$py" -m cpbench --cfg job >"$work/config" 2>&1 || { cat "$work/config" >&2; exit 1; }
    echo "gpu_check.sh: python -m cpbench starts from $work/cwd: Hydra composed its config"
    exit 0
fi

out=$(mkdir -p "${OUT:-gpu_check_out}" && cd "${OUT:-gpu_check_out}" && pwd)
log=$out/gpu_check.log summary=$out/summary.txt
: >"$log"
: >"$summary"
status=0 runs=() timed_out=()

say() { echo "$*" | tee -a "$summary"; }
say "$found"

if [ "$dry" -eq 1 ]; then
    # fold_small fp32, one thread a rank (with 2, on the shared 2-core machine, a step at N=64 took 58.7 s
    # instead of 3.4), sized as the GPU's steps are: the estimate's peaks over the start-up baseline,
    # 0.0068 GiB at N=32, 0.0115 at 64, 0.0216 at 128, are the measured ones to 0.5 MiB.
    gpus=4
    model=(workload=fold_small dist.backend=gloo dtype=float32 dist.cpu_threads=1 memory.cpu_budget_gib=0.5)
    small=16 points='[16,32]' edge_cap=0.014 edge_start=32 edge_max=64 edge_granularity=16
    oom_cap=0.012 oom_n=64 oom_granularity=48
    say "device: CPU dry run ($(nproc) cores)," \
        "$(in_work "$py" -c 'import torch; print("torch", torch.__version__)')"
    # Not forecast: a step of the dry run took 18-69 s on the 2-core machine at load averages 5-8.
    declare -A limits=([a_forked]=120 [b_probe]=120 [c_oom]=120 [d_points]=120 [e_training]=120 [f_cp2]=120
                       [g_lone_oom]=120 [h_grid_2x2]=120)
else
    # Memory: the fake-tensor estimate of fold bf16 at n_cycles=1 and 2 sampling steps, cp=1, weights
    # included (`python -m cpbench.predict workload=fold dtype=bfloat16 workload.n_cycles=1
    # workload.sampling.steps=2`): 1.52 GiB at N=256, 1.85 at 512, 3.19 at 1,024, 4.00 at 1,234. b's cap
    # of 3.2 GiB puts the estimate's edge at its probe.max_tokens, 1,024, and the real edge (a real step
    # also holds what the estimate ignores) just below; c's 1.75 GiB lies between N=256 and 512.
    export NCCL_DEBUG=${NCCL_DEBUG:-WARN}  # NCCL's warnings into gpu_check.log, through the ranks' stdout
    read -r gpus first < <(nvidia-smi -L | "$py" -c "$COUNT_GPUS")
    model=(workload=fold dist.backend=nccl dtype=bfloat16 workload.n_cycles=1 workload.sampling.steps=2)
    small=256 points='[256,512,1024]' edge_cap=3.2 edge_start=512 edge_max=1024 edge_granularity=64
    oom_cap=1.75 oom_n=512 oom_granularity=256
    visible="CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES-unset}"
    [ "$gpus" -gt 0 ] || { say "gpu_check: no GPU visible ($visible)"; exit 1; }
    read -r seen versions < <(in_work "$py" -c 'import torch; print(torch.cuda.device_count(), "torch",
        torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version())')
    card=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader -i "$first")
    say "device: $card x $gpus ($visible), NCCL_DEBUG=$NCCL_DEBUG; $versions"
    if [ "${seen:-0}" -ne "$gpus" ]; then  # a case the parsing above does not know: the fewer is safe
        say "gpu_check: nvidia-smi -L gives $gpus GPUs, torch sees ${seen:-none}: taking the fewer"
        gpus=$(( ${seen:-0} < gpus ? ${seen:-0} : gpus ))
        [ "$gpus" -gt 0 ] || { say "gpu_check: FAILED"; exit 1; }
    fi
    # Each step's limit: 3x the forecast's time for it, rounded up to 5 s. Its time is
    #   S + the fake-tensor traces (T each) and FLOP counts (C each) it makes + its model steps' t(N),
    # t(N) from `python -m cpbench.forecast workload=fold dtype=bfloat16 forecast.hardware=h100_sxm
    # workload.n_cycles=1 workload.sampling.steps=2` at each step's topology (docs/predict.md; datasheet
    # peaks, so a floor): inference cp=1 0.175 s at N=256, 1.02 s at 512, 6.78 s at 1,024; 1d cp=2
    # 0.127 s at 256, 0.692 s at 512; the 2x2 grid 0.077 s at 256; training cp=1 0.461 s at 256. What the
    # forecast does not price, the CPU's work, priced from the project's 2-core machine: S = 30 s to
    # start and close a run (imports, Hydra, CUDA's context, the model built, the report; the dry run's
    # one-point steps took 18-31 s there); C = 35 s, one FLOP count of fold (a forecast counting 3
    # shapes took 118 s of CPU there); T = 5 s, one trace (docs/probe.md: 4.0 s of CPU at N=2,048).
    #   a  S + 3 t(256)                                                  30.5 s
    #   b  S + 3 T (the estimate) + 3 t(1024) (probe steps near the edge) + T (who holds the peak)  70.3 s
    #   c  S + t(512) (out of memory on its way) + t(256) + T            36.2 s
    #   d  S + 3 C + 3 (t(256) + t(512) + t(1024)) (1 warm-up, 2 timed) 158.9 s
    #   e  S + 3 t_training(256)                                         31.4 s
    #   f  S + 3 t_cp2(256)                                              30.4 s
    #   g  S + 3 t_cp2(256) + t_cp2(512) + S (the ranks restart after the lone oom) + T  66.1 s
    #   h  S + 3 t_2x2(256)                                              30.2 s
    # One GPU (a-e): 327 s by this forecast.
    declare -A limits=([a_forked]=95 [b_probe]=215 [c_oom]=110 [d_points]=480 [e_training]=95 [f_cp2]=95
                       [g_lone_oom]=200 [h_grid_2x2]=95)
fi
# Fixed step counts (1 warm-up, 2 timed); no time budget (the limits bound each step); the FLOP count
# (a fake-tensor pass per shape, tens of seconds of CPU at fold's sizes) only where MFU is checked (d).
fixed=(budget.minutes=null log.progress=false timing.warmup=1 timing.repeats=2 timing.warmup_max=1
       timing.repeats_max=2 measure.count_flops=false baseline=false)

readout() {  # readout NAME OUTCOME [oom]: a probe's steps, a timed-out step's rows so far; checks them
    in_work "$py" - "$work/$1" "$1" "$2" "${3:-}" <<'PY' | tee -a "$summary" || status=1
import sys
from pathlib import Path

import pandas as pd

folder, name, outcome, want_oom = Path(sys.argv[1]), *sys.argv[2:]
found = sorted(folder.rglob("results.csv"))  # a multirun's jobs and their merge: the same rows twice
rows = pd.concat([pd.read_csv(path) for path in found]).drop_duplicates() if found else pd.DataFrame()
if (folder / "probe.csv").is_file():
    trials = pd.read_csv(folder / "probe.csv")
    print(f"{name}: the probe's steps (peaks in GiB per rank)")
    columns = ["N_tokens", "fits", "status", "max_peak_gib", "predicted_peak_gib", "error"]
    print(trials[[c for c in columns if c in trials.columns]].to_string(index=False))
    if want_oom and outcome == "ok" and not (trials["status"] == "oom").any():
        sys.exit(f"{name}: no step recorded as oom")
if outcome == "timed out":
    columns = ["N_tokens", "status", "kind", "peak_mem_gib", "walltime_ms"]
    table = rows[[c for c in columns if c in rows.columns]].to_string(index=False) if len(rows) else "none"
    print(f"{name}: rows measured before its limit:\n{table}")
elif outcome == "ok" and len(rows):
    failed = rows[(rows["kind"] == "point") & (rows["status"] != "ok")]
    if len(failed):  # a walltime point is sized to fit: one that did not is a failure of the check
        points = zip(failed["N_tokens"], failed["status"], strict=True)
        sys.exit(f"{name}: points not ok: " + ", ".join(f"N={n} {status}" for n, status in points))
PY
}

step() {  # step NAME [oom] -- ARGS...: one `python -m cpbench` run within its limit; its folder $work/NAME
    local name=$1 want_oom="" seconds rc start=$SECONDS outcome
    shift
    [ "$1" = oom ] && { want_oom=oom; shift; }
    shift  # --
    seconds=${limits[$name]}
    echo "== $name (limit ${seconds}s): python -m cpbench $*" >>"$log"
    in_work timeout --signal=INT --kill-after=20 "$seconds" "$py" -m cpbench "$@" output_dir="$work/$name" \
        >>"$log" 2>&1
    rc=$?
    case $rc in
        0) outcome=ok ;;
        124 | 137) outcome="timed out"; timed_out+=("$name") ;;
        *) outcome=FAILED; status=1 ;;
    esac
    [ "$outcome" = FAILED ] && outcome="FAILED, exit $rc,"
    say "$name: $outcome after $((SECONDS - start))s (limit ${seconds}s)"
    readout "$name" "$outcome" "$want_oom"
    if [ -f "$work/$name/results.csv" ]; then
        runs+=("$work/$name")
    else  # a multirun stopped before its merge: its jobs' folders
        while read -r job; do
            runs+=("${job%/results.csv}")
        done < <(find "$work/$name" -name results.csv 2>/dev/null)
    fi
}

one=("${model[@]}" "${fixed[@]}" topology.cp=1)
step a_forked -- -m "${one[@]}" "sweep.n_tokens=[$small]" probe.enabled=false
step b_probe -- "${one[@]}" 'sweep.n_tokens=[]' probe.enabled=true probe.predict=true \
    "probe.start=$edge_start" "probe.max_tokens=$edge_max" "probe.granularity=$edge_granularity" \
    probe.measure_at_max=false "memory.budget_gib=$edge_cap"
step c_oom oom -- "${one[@]}" 'sweep.n_tokens=[]' probe.enabled=true "probe.start=$oom_n" \
    "probe.max_tokens=$oom_n" "probe.granularity=$oom_granularity" probe.measure_at_max=false \
    "memory.budget_gib=$oom_cap"
step d_points -- "${one[@]}" "sweep.n_tokens=$points" probe.enabled=false measure.count_flops=true
step e_training -- "${one[@]}" workflow=training "sweep.n_tokens=[$small]" probe.enabled=false
if [ "$gpus" -ge 2 ]; then
    two=("${model[@]}" "${fixed[@]}" topology.cp=2 "sweep.n_tokens=[$small]")
    step f_cp2 -- "${two[@]}" probe.enabled=false
    step g_lone_oom oom -- "${two[@]}" probe.enabled=true "probe.start=$oom_n" "probe.max_tokens=$oom_n" \
        "probe.granularity=$oom_granularity" probe.measure_at_max=false fault.rank=1 "fault.at_n=$oom_n" \
        fault.kind=oom
fi
if [ "$gpus" -ge 4 ]; then
    step h_grid_2x2 -- "${model[@]}" "${fixed[@]}" topology.kind=2d topology.cp=4 "sweep.n_tokens=[$small]" \
        probe.enabled=false
fi

if [ "${#runs[@]}" -gt 0 ]; then
    in_work "$py" -m cpbench.report "${runs[@]}" --out "$work/report" >>"$log" 2>&1 || status=1
    cp "$work/report/results.csv" "$work/report/cp_benchmark.md" "$out/" 2>/dev/null || status=1
    in_work "$py" - "$out/results.csv" <<'PY' | tee -a "$summary"
import sys

import pandas as pd

rows = pd.read_csv(sys.argv[1])
columns = ["topology", "cp", "workflow", "N_tokens", "status", "kind", "peak_mem_gib", "walltime_ms", "mfu"]
print(rows[[c for c in columns if c in rows.columns]].to_string(index=False))
PY
fi
if [ "$status" -ne 0 ]; then
    say "gpu_check: FAILED"
elif [ "${#timed_out[@]}" -gt 0 ]; then
    say "gpu_check: timed out in ${timed_out[*]} (what they measured is above); no step failed"
    status=3
else
    say "gpu_check: passed"
fi
exit $status
