#!/usr/bin/env bash
# The teardown abort's repro, N times: the SLURM test that showed "terminate called without an active
# exception" (a 2-task job on the private test cluster, tests/support/slurm_cluster.py), run alone and one run
# at a time. Prints each run's outcome, then failures/N. A failed run keeps its folder under $KEEP
# (task logs, and the task's core file: core dumps are on here, Python's faulthandler too).
#
#   bash benchmarks/teardown_repeat.sh [N]        # N defaults to 100; about 12-25 s a run on 2 cores
#
# Needs SLURM and munge installed and root (the test's cluster adds lines to /etc/hosts).
set -u
cd "$(dirname "$0")/.."
n=${1:-100}
test=${TEARDOWN_TEST:-tests/e2e/test_slurm_cluster.py::test_one_job_of_two_tasks_measures_what_a_local_run_measures}
keep=${KEEP:-$(mktemp -d -t teardown_repeat.XXXXXX)}
ulimit -c unlimited
export PYTHONFAULTHANDLER=1
failures=0
start=$SECONDS
for i in $(seq 1 "$n"); do
  base="$keep/run$i"
  if timeout 300 .venv/bin/pytest -n 0 -q -p no:cacheprovider --basetemp="$base" "$test" >"$keep/out$i.txt" 2>&1; then
    rm -rf "$base" "$keep/out$i.txt"
    echo "run $i: ok"
  else
    failures=$((failures + 1))
    aborted=$(grep -l "terminate called" -r "$base" 2>/dev/null | head -1)
    echo "run $i: FAILED${aborted:+ (terminate called: $aborted)}; output: $keep/out$i.txt"
  fi
done
echo "failures: $failures/$n in $((SECONDS - start)) s (kept: $keep)"
