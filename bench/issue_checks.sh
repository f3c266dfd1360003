#!/usr/bin/env bash
# bench/issue_checks.sh - the GPU halves of the open issues' checks in one device call, after
# bench/device_run.sh (which runs bench/gpu_bench.sh, the reference figures) in another.
#
# The machine has no network, so the call carries .gpu/ (ignored by git) with
# .gpu/dask-wheels/ (bench/dask_wheels.sh download) for the Dask comparison. Each check runs
# under its own timeout, so that a slow one costs its own figures, and writes to $OUT
# (default .gpu/out-issues):
#   neighbours.json   issue 39: two trainers sharing the card, four arms (neighbours_check.py)
#   dask.json         issue 39: dask.array on CuPy under vramkit.dask beside rmm_pool_size
#   estimate/         issues 38 and 37: every workload estimated, then run under vramkit,
#                     PyTorch's allocator and expandable segments (estimate_check.py)
#   tests_gpu.txt     tests/gpu, the package's checks through PyTorch, CuPy, Numba and Dask
# and steps.txt, one line per check: its name, exit status and seconds. The package is
# installed from the tree first (scikit-build-core is on the machine).
#
#   bash bench/issue_checks.sh                    # all of them, about 9 minutes
#   ISSUE_CHECKS="neighbours dask" bash bench/issue_checks.sh
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-.gpu/out-issues}
CHECKS=${ISSUE_CHECKS:-neighbours dask estimate tests}
mkdir -p "$OUT"
: > "$OUT/steps.txt"

wants() { [[ " $CHECKS " == *" $1 "* ]]; }

# check NAME TIMEOUT_S COMMAND...: stdout and stderr to $OUT/NAME.log, status to steps.txt.
check() {
  local name=$1 limit=$2 start=$SECONDS
  shift 2
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  echo "$name rc=$rc seconds=$((SECONDS - start))" >> "$OUT/steps.txt"
  return $rc
}

check install 240 env PIP_BREAK_SYSTEM_PACKAGES=1 \
  python3 -m pip install --no-index --no-deps --no-build-isolation . || {
  cat "$OUT/steps.txt"
  exit 1
}
if wants neighbours; then
  check neighbours 150 sh -c 'python3 bench/neighbours_check.py --json > "$0"' \
    "$OUT/neighbours.json"
fi
if wants dask; then
  check dask_install 60 bash bench/dask_wheels.sh install &&
    check dask 150 python3 bench/dask_bench.py --json "$OUT/dask.json"
fi
if wants estimate; then
  check estimate 240 python3 bench/estimate_check.py --out "$OUT/estimate"
fi
if wants tests; then
  check tests_gpu 300 python3 -m pytest -q tests/gpu
fi
cat "$OUT/steps.txt"
