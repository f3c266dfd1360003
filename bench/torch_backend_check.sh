#!/usr/bin/env bash
# bench/torch_backend_check.sh - the PyTorch backend on a GPU machine, in one call: install
# this tree's package, build the backend against the installed torch, run
# tests/gpu/test_torch_backend.py under PyTorch's allocator and under vramkit (its -v
# listing is the pass table of docs/performance.md), the GPT-2 check of
# tests/python/gpu_check.py twice, and the rest of tests/gpu.
#
#   bench/torch_backend_check.sh [PYTEST -k EXPRESSION]   (only the backend suite, filtered)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
ROOT=$PWD
export PIP_BREAK_SYSTEM_PACKAGES=1
python3 -m pip install -q --no-index --no-deps --no-build-isolation . >/tmp/pip.log 2>&1 ||
  { tail -30 /tmp/pip.log; exit 1; }
cd /tmp || exit 1
python3 -c "import torch, vramkit; print('torch', torch.__version__, 'vramkit', vramkit.__version__)"
python3 -c "from vramkit.plug import _torch_build as b; print(b.cuda_runtime()); print(b.build_backend())"
if [ $# -gt 0 ]; then
  timeout 520 python3 -m pytest -v -rs -p no:cacheprovider \
    "$ROOT/tests/gpu/test_torch_backend.py" -k "$1" 2>&1 | tail -60
  exit 0
fi
timeout 300 python3 -m pytest -v -rs -p no:cacheprovider "$ROOT/tests/gpu/test_torch_backend.py" \
  2>&1 | grep -E "PASSED|FAILED|SKIPPED|ERROR|passed|failed"
for round in 1 2; do
  timeout 150 python3 "$ROOT/tests/python/gpu_check.py" train 2>&1 | grep train_compare
done
timeout 330 python3 -m pytest -q -rs -p no:cacheprovider "$ROOT/tests/gpu" \
  --deselect "$ROOT/tests/gpu/test_torch_backend.py" 2>&1 | tail -5
