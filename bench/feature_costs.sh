#!/usr/bin/env bash
# bench/feature_costs.sh - what memory history, publishing and the logger cost, and the
# history checks that need PyTorch, on the installed package (run after bench/gpu_bench.sh
# has installed it, or anywhere vramkit is installed). Prints its findings; $OUT/extra.txt
# keeps them when OUT is set. docs/performance.md quotes its output.
#
#   bench/feature_costs.sh [ROUNDS]      (default 3 rounds of the alternated pair figures)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
ROOT=$PWD
ROUNDS=${1:-3}
pair() { python3 -m vramkit bench pair --source sim --sizes 512,2M --json "$@" | tr '\n' ' '; }
{
  echo "== history through torch (tests/python/test_history.py -k torch, tests/python/test_leaks.py)"
  (cd /tmp && timeout 240 python3 -m pytest -v -rs -p no:cacheprovider \
     "$ROOT/tests/python/test_history.py" -k torch "$ROOT/tests/python/test_leaks.py" 2>&1 |
     grep -E "PASSED|FAILED|SKIPPED|passed|failed")
  echo "== export and top beside two vramkit processes and a plain one"
  (cd /tmp && timeout 200 python3 -m pytest -s -q -p no:cacheprovider \
     "$ROOT/tests/gpu/test_callbacks.py" -k export 2>&1 |
     grep -E "NVML processes|nvml_used_bytes|passed|failed" | head -12)
  echo "== alloc+free pair (sim, this host): history off, history on, publishing off; $ROUNDS rounds"
  for _ in $(seq "$ROUNDS"); do
    echo "$(pair) off"
    echo "$(pair --history) history"
    echo "$(VRAMKIT_PUBLISH=0 pair) nopublish"
  done
  echo "== history cost from Python (sim)"
  VRAMKIT_SOURCE=sim timeout 120 python3 "$ROOT/bench/history_cost.py" --pairs 100000 --rounds 3 2>&1 | tail -8
  echo "== logger cost (cuda where there is a GPU, else sim)"
  timeout 120 python3 "$ROOT/bench/logger_cost.py" 2>&1 | tail -10
  echo "== records left in /dev/shm/vramkit-$(id -u)"
  ls "/dev/shm/vramkit-$(id -u)/" 2>/dev/null | wc -l
} | tee "${OUT:-/tmp}/extra.txt"
