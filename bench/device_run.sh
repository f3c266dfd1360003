#!/usr/bin/env bash
# bench/device_run.sh - the whole GPU run in one device call (docs/performance.md's reference run).
#
# The GPU machine has no package registry, so the call carries .gpu/ (ignored by git):
#     .gpu/anchors/ <- the anchor instruments   .gpu/traces/ <- the traces to replay
#     .gpu/debs/    <- Debian's libcmocka0 and libcmocka-dev .debs (apt-get download)
# This script unpacks cmocka where the C tests' build finds it, runs bench/gpu_bench.sh on
# GPU 0 under a time budget, then the two-GPU peer-access test (tests/gpu/peer_access.c)
# when a second GPU is there, then (with .gpu/before/ holding an earlier tree) before/after
# rounds of the host-side speed figures, and leaves everything in $OUT (default .gpu/out),
# with console.txt (the run's stderr), table.txt (bench/gpu_table.py) and all.tgz.
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
# Before/after on this host: with a copy of an earlier tree in .gpu/before (git archive),
# build its command-line tool and alternate the host-side speed figures of both builds
# (bench/ab_rounds.sh), as long as the call's time allows.
if [ -f .gpu/before/CMakeLists.txt ] && [ -x build-gpu/vramkit ] && [ "$SECONDS" -lt 330 ]; then
  { cmake -S .gpu/before -B /tmp/vramkit-before -DCMAKE_BUILD_TYPE=Release -DVRAMKIT_BUILD_TESTS=OFF &&
    cmake --build /tmp/vramkit-before -j"$(nproc)" --target vramkit_cli; } > "$OUT/build_before.txt" 2>&1 &&
    bench/ab_rounds.sh /tmp/vramkit-before/vramkit build-gpu/vramkit "${AB_ROUNDS:-4}" "$OUT" \
      .gpu/traces/*.trace.gz 2>> "$OUT/console.txt"
fi
python3 bench/gpu_table.py "$OUT" > "$OUT/table.txt"
tar czf /tmp/vramkit-gpu-all.tgz -C "$OUT" . && mv /tmp/vramkit-gpu-all.tgz "$OUT/all.tgz"
cat "$OUT/table.txt"
