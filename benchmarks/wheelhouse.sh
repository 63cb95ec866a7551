#!/usr/bin/env bash
# A wheelhouse for installing cpbench where there is no network (docs/install.md): run it on a machine
# with network, carry DIR to the air-gapped one, then there `pip install --no-index --find-links DIR
# cpbench` beside the torch it already holds, or, where nothing may be resolved (a machine's Python that
# cannot be changed), `benchmarks/gpu_check.sh --wheelhouse DIR`: every wheel in DIR with --no-deps.
#
#   bash benchmarks/wheelhouse.sh DIR [--python-version 3.12] [--platform TAG ...] [--have "NAME ..."]
#
# DIR gets cpbench's own wheel, a wheel of antlr4-python3-runtime 4.9.3 (Hydra's parser runtime, which
# PyPI has only as an sdist, built here once: pure Python, so it suits any target), and binary wheels of
# every other requirement of cpbench and of theirs, never torch: the target keeps its own build.
#   --python-version, --platform  the target's, when it differs from this machine (for example 3.12 and
#                                 manylinux_2_28_x86_64; pip then takes wheels only)
#   --have "NAME ..."             packages the target already holds (pandas, numpy, scipy, ...): their
#                                 wheels are left out, so that the wheelhouse stays small
set -euo pipefail
[ $# -ge 1 ] || { sed -n '2,17p' "$0"; exit 2; }
dir=$1
shift
target=() have=""
while [ $# -gt 0 ]; do
    case $1 in
        --python-version) target+=(--python-version "$2" --implementation cp); shift 2 ;;
        --platform) target+=(--platform "$2"); shift 2 ;;
        --have) have=$2; shift 2 ;;
        *) echo "wheelhouse.sh: unknown option $1" >&2; exit 2 ;;
    esac
done
py=${PYTHON:-python3}
root=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$dir"
staging=$(mktemp -d)
trap 'rm -rf "$staging"' EXIT

# cpbench's wheel from a copy of what it is made of (pyproject.toml's packages: cpbench/ and configs/):
# built in the tree, setuptools would leave build/ there, and a later build would pack its stale files.
mkdir "$staging/tree"
cp -r "$root/pyproject.toml" "$root/README.md" "$root/cpbench" "$root/configs" "$staging/tree"/
find "$staging/tree" -name __pycache__ -prune -exec rm -rf {} +
"$py" -m pip wheel -q --no-deps -w "$dir" "$staging/tree"
"$py" -m pip wheel -q --no-deps -w "$dir" antlr4-python3-runtime==4.9.3

# cpbench's requirements as its wheel declares them, less torch and the extras', resolved with their own.
mapfile -t wanted < <(unzip -p "$dir"/cpbench-*.whl '*/METADATA' | sed -n 's/^Requires-Dist: //p' |
    grep -v 'extra ==' | grep -viE '^torch([ <>=!~;]|$)')
"$py" -m pip download -q -d "$staging/wheels" --find-links "$dir" --only-binary=:all: "${target[@]}" "${wanted[@]}"

# Wheels are named NAME-VERSION-...; names compare as pip normalises them (case, '_', '.' and '-' alike).
normal() { tr '[:upper:]_.' '[:lower:]--'; }
skip=$(printf '%s\n' $have | normal)
for wheel in "$staging"/wheels/*.whl; do
    name=$(basename "$wheel" | cut -d- -f1 | normal)
    grep -qxF "$name" <<<"$skip" || mv -n "$wheel" "$dir"/
done
# Two versions of one package (a DIR used before) would stop an install of every wheel in DIR.
twice=$(for wheel in "$dir"/*.whl; do basename "$wheel" | cut -d- -f1 | normal; done | sort | uniq -d)
if [ -n "$twice" ]; then
    echo "wheelhouse.sh: two versions of $twice in $dir: start from an empty DIR" >&2
    exit 1
fi
echo "wheelhouse: $(ls "$dir" | wc -l) wheels, $(du -sh "$dir" | cut -f1) in $dir"
