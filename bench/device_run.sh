#!/usr/bin/env bash
# bench/device_run.sh - the whole GPU run in one device call, as bench/RESULTS.md records it.
#
# The GPU machine has no package registry, so the call carries .gpu/ (ignored by git):
#     .gpu/anchors/ <- shared/anchors   .gpu/traces/ <- shared/traces
#     .gpu/debs/    <- Debian's libcmocka0 and libcmocka-dev .debs (apt-get download)
# This script unpacks cmocka where the C tests' build finds it, runs bench/gpu_bench.sh on
# GPU 0 under a time budget, then the two-GPU peer-access test (tests/gpu/peer_access.c)
# when a second GPU is there, and leaves everything in $OUT (default .gpu/out), with
# console.txt (the run's stderr), table.txt (bench/gpu_table.py) and all.tgz.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-.gpu/out}
mkdir -p "$OUT"
CMOCKA=/tmp/vramkit-cmocka
mkdir -p "$CMOCKA"
for deb in .gpu/debs/*.deb; do [ -f "$deb" ] && dpkg -x "$deb" "$CMOCKA"; done
export CMAKE_PREFIX_PATH=$CMOCKA/usr CPATH=$CMOCKA/usr/include
export LIBRARY_PATH=$CMOCKA/usr/lib/x86_64-linux-gnu LD_LIBRARY_PATH=$CMOCKA/usr/lib/x86_64-linux-gnu

CUDA_VISIBLE_DEVICES=0 GPU_BENCH_BUDGET_S=${GPU_BENCH_BUDGET_S:-470} OUT=$OUT \
  bash bench/gpu_bench.sh > "$OUT/table_live.txt" 2> "$OUT/console.txt"

if [ -f build-gpu/libvramkit_static.a ]; then
  gcc -std=c11 -O1 -Iinclude -I/usr/local/cuda/include tests/gpu/peer_access.c \
    build-gpu/libvramkit_static.a -L/usr/local/cuda/lib64/stubs -lcuda -ldl -lpthread -lm \
    -o /tmp/peer_access > "$OUT/peer_access.txt" 2>&1 &&
    { /tmp/peer_access >> "$OUT/peer_access.txt" 2>&1; echo "exit $?" >> "$OUT/peer_access.txt"; }
fi
python3 bench/gpu_table.py "$OUT" > "$OUT/table.txt"
tar czf /tmp/vramkit-gpu-all.tgz -C "$OUT" . && mv /tmp/vramkit-gpu-all.tgz "$OUT/all.tgz"
cat "$OUT/table.txt"
