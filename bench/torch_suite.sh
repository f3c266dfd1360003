#!/usr/bin/env bash
# bench/torch_suite.sh - PyTorch's own allocator tests on the card, under PyTorch's caching
# allocator and under vramkit, with a pass table side by side (issue 37: under vramkit,
# PyTorch behaves as PyTorch).
#
# PyTorch's test file is not part of this project: put a copy of torch's test/test_cuda.py
# (the installed torch's tag, or a newer one whose imports the installed torch has; see
# docs/performance.md for the one measured) in .gpu/torch_tests/, named so that it ends in
# test_cuda.py, and an expecttest wheel in .whl/ (the card has no network). The selection
# (-k below) is the allocator's part: caching allocator, memory stats, OOM, record_stream,
# CUDA graphs and graph trees, MemPool, snapshots, history and plots.
#
#   bench/torch_suite.sh [native|vramkit|both] [PYTEST -k EXPRESSION]
# Each allocator runs in its own pytest under a time limit that keeps one device call
# within ten minutes; results go to .gpu/torch_suite/<allocator>.N.xml (and .log), and the
# table to stdout (bench/torch_suite_table.py).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
ROOT=$PWD
WHICH=${1:-both}
SELECT=${2:-"memory or oom or out_of_memory or record_stream or graph or mempool or MemPool or mem_pool or snapshot or history or plot or caching_allocator or allocator or empty_cache or BlockStateAbsorption or expandable or set_per_process"}
LIMIT=${VK_SUITE_LIMIT:-280}
TESTS=$(ls "$ROOT"/.gpu/torch_tests/*test_cuda.py 2>/dev/null | head -1)
[ -n "$TESTS" ] || { echo "no .gpu/torch_tests/*test_cuda.py: copy torch's test/test_cuda.py there" >&2; exit 2; }
OUT=$ROOT/.gpu/torch_suite
mkdir -p "$OUT"
export PIP_BREAK_SYSTEM_PACKAGES=1
python3 -m pip install -q --no-index --no-deps --no-build-isolation . >/tmp/pip.log 2>&1 ||
  { tail -30 /tmp/pip.log; exit 1; }
python3 -c "import expecttest" 2>/dev/null ||
  python3 -m pip install -q --no-index --no-deps "$ROOT"/.whl/expecttest-*.whl ||
  { echo "expecttest is missing and .whl/ has no wheel of it" >&2; exit 1; }
python3 -c "import psutil" 2>/dev/null || echo "warning: psutil is missing; test_cuda.py imports it"
python3 -c "import torch, vramkit; print('torch', torch.__version__, 'vramkit', vramkit.__version__)"
python3 -c "from vramkit.plug import _torch_build as b; print(b.build_backend())" || exit 1

run_one() {  # $1: native or vramkit
  # The site folder's sitecustomize installs vramkit in every interpreter of the run (the
  # tests start subprocesses too) before torch initializes CUDA; "native" leaves it out.
  # A test that kills the interpreter (an abort in PyTorch's C++) loses pytest's report:
  # the last test the verbose log names is listed in <allocator>.crashed and the run
  # starts again without it, each run's report in its own <allocator>.N.xml.
  local site="" try rc crashed select=$SELECT
  [ "$1" = vramkit ] && site=$ROOT/bench/torch_suite_site
  rm -f "$OUT/$1".*.xml "$OUT/$1".*.log "$OUT/$1.crashed"
  for try in 1 2 3 4; do
    (cd "$(dirname "$TESTS")" &&
      PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH} VK_SUITE_ALLOC=$1 PYTHONUNBUFFERED=1 \
        timeout "$LIMIT" python3 -m pytest -v -p no:cacheprovider "$(basename "$TESTS")" \
        -k "$select" --junitxml="$OUT/$1.$try.xml" -o junit_family=xunit1 \
        > "$OUT/$1.$try.log" 2>&1)
    rc=$?
    tail -1 "$OUT/$1.$try.log"
    [ -s "$OUT/$1.$try.xml" ] && break
    crashed=$(grep -o "$(basename "$TESTS")::[A-Za-z0-9_]*::[A-Za-z0-9_]*" "$OUT/$1.$try.log" | tail -1)
    [ -n "$crashed" ] || break
    echo "$1: $crashed ended the interpreter (status $rc); running again without it"
    echo "${crashed#*::}" >> "$OUT/$1.crashed"
    # Left out by name in -k: --deselect reads node ids from pytest's root, not from here.
    select="($select) and not ${crashed##*::}"
  done
}

case $WHICH in
  native|vramkit) run_one "$WHICH" ;;
  both) run_one native; run_one vramkit ;;
  *) echo "usage: bench/torch_suite.sh [native|vramkit|both] [-k expression]" >&2; exit 2 ;;
esac
python3 "$ROOT/bench/torch_suite_table.py" "$OUT"
