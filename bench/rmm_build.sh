#!/usr/bin/env bash
# bench/rmm_build.sh - build bench/rmm_replay.cpp against RAPIDS RMM's C++ library, taken from
# its Python wheels (the GPU machine has no network and no package registry).
#
# Usage: bench/rmm_build.sh [WHEEL_DIR] [BUILD_DIR]     (run from anywhere)
#   WHEEL_DIR  holds librmm_cu13-*.whl and rapids_logger-*.whl (default .gpu/rmm), made on a
#              machine with network by
#                pip download --no-deps librmm-cu13==26.10.0 rapids-logger==0.3.0 -d .gpu/rmm
#   BUILD_DIR  where the wheels are unpacked and the binary goes (default .gpu/rmm-build)
# Prints the binary's path (BUILD_DIR/rmm_replay) on its last line of stdout.
#
# Why it builds the way it does:
# - g++, not nvcc: rmm_replay has no device code, and RMM's headers compile as host C++.
#   C++20 because RMM 26.10's headers use concepts (std::same_as); so g++ 10 or newer.
# - The wheel ships the CCCL (libcudacxx, thrust, cub) that librmm.so was built with, under
#   include/rapids/; it must come before the CUDA toolkit's include directory, because
#   RMM's interface passes CCCL types (cuda::mr::any_resource, cuda::stream_ref) across the
#   library boundary and the toolkit's own CCCL is another version. The defines are the
#   ones RMM's CMake package puts on CCCL (lib64/cmake/rmm/rmm-dependencies.cmake).
# - librmm.so carries its own static CUDA runtime (CUDA::cudart_static in its interface),
#   so the program links cudart_static as well and does not need libcudart.so at run time.
# - librapids_logger.so is linked by name (and kept with --no-as-needed): it is librmm's
#   dependency, and it also defines the newer libstdc++ pieces librmm.so uses
#   (__cxa_call_terminate, std::ios_base_library_init), which an older system libstdc++
#   lacks. The run path is $ORIGIN-relative, so BUILD_DIR can move, and a DT_RPATH
#   (--disable-new-dtags), so it also applies to librmm.so's own lookups.
# - Nothing links libcuda: rmm_replay reaches the one driver call it makes through the
#   runtime, so on a machine without a driver it starts and fails cleanly at CUDA init.
set -euo pipefail
# Arguments are relative to the caller's directory; the defaults to the repository root.
absolute() { case $1 in /*) echo "$1" ;; *) echo "$PWD/$1" ;; esac; }
WHEELS=${1:+$(absolute "$1")}
BUILD=${2:+$(absolute "$2")}
cd "$(dirname "$0")/.."
ROOT=$PWD
WHEELS=${WHEELS:-$ROOT/.gpu/rmm}
BUILD=${BUILD:-$ROOT/.gpu/rmm-build}
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
CXX=${CXX:-g++}
SOURCE=$ROOT/bench/rmm_replay.cpp

fail() { echo "rmm_build: $*" >&2; exit 1; }

shopt -s nullglob
rmm_wheels=("$WHEELS"/librmm_cu13-*.whl)
logger_wheels=("$WHEELS"/rapids_logger-*.whl)
shopt -u nullglob
((${#rmm_wheels[@]} > 0)) || fail "no librmm_cu13-*.whl in $WHEELS (on a machine with network: pip download --no-deps librmm-cu13==26.10.0 rapids-logger==0.3.0 -d $WHEELS)"
((${#logger_wheels[@]} > 0)) || fail "no rapids_logger-*.whl in $WHEELS (pip download --no-deps rapids-logger==0.3.0 -d $WHEELS)"
((${#rmm_wheels[@]} == 1)) || fail "more than one librmm_cu13 wheel in $WHEELS: ${rmm_wheels[*]}"
((${#logger_wheels[@]} == 1)) || fail "more than one rapids_logger wheel in $WHEELS: ${logger_wheels[*]}"
[ -f "$SOURCE" ] || fail "missing $SOURCE"
[ -f "$CUDA_HOME/include/cuda_runtime_api.h" ] || fail "no CUDA toolkit headers in $CUDA_HOME/include (set CUDA_HOME)"
[ -f "$CUDA_HOME/lib64/libcudart_static.a" ] || fail "no $CUDA_HOME/lib64/libcudart_static.a (set CUDA_HOME)"
command -v "$CXX" >/dev/null || fail "no C++ compiler '$CXX' (set CXX)"
command -v unzip >/dev/null || command -v python3 >/dev/null || fail "need unzip or python3 to unpack the wheels"

# A wheel is a zip. Unpack afresh, so a build dir never mixes two versions.
unpack() {
  if command -v unzip >/dev/null; then
    unzip -q -o "$1" -d "$BUILD"
  else
    python3 -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' "$1" "$BUILD"
  fi
}
mkdir -p "$BUILD"
rm -rf "$BUILD/librmm" "$BUILD/rapids_logger" "$BUILD/rmm_replay"
unpack "${rmm_wheels[0]}"
unpack "${logger_wheels[0]}"
RMM=$BUILD/librmm
LOGGER=$BUILD/rapids_logger
for f in "$RMM/include/rmm/mr/pool_memory_resource.hpp" "$RMM/include/rapids/cuda/memory_resource" \
  "$RMM/lib64/librmm.so" "$LOGGER/include/rapids_logger/logger.hpp" "$LOGGER/lib64/librapids_logger.so"; do
  [ -e "$f" ] || fail "the wheels did not unpack as expected: no $f"
done

echo "rmm_build: $("$CXX" --version | head -n 1); RMM $(cat "$RMM/VERSION" 2>/dev/null || echo '?'); CUDA $CUDA_HOME" >&2
# shellcheck disable=SC2016  # '$ORIGIN' is for the dynamic loader, not the shell
(
  set -x
  "$CXX" -O2 -std=c++20 -Wall \
    -DCUB_DISABLE_NAMESPACE_MAGIC -DCUB_IGNORE_NAMESPACE_MAGIC_ERROR \
    -DTHRUST_DISABLE_ABI_NAMESPACE -DTHRUST_IGNORE_ABI_NAMESPACE_ERROR -DCCCL_DISABLE_PDL \
    -I"$RMM/include/rapids" -I"$RMM/include" -I"$LOGGER/include" -I"$CUDA_HOME/include" \
    "$SOURCE" -o "$BUILD/rmm_replay" \
    -L"$RMM/lib64" -L"$LOGGER/lib64" -Wl,--no-as-needed -lrmm -lrapids_logger -Wl,--as-needed \
    -L"$CUDA_HOME/lib64" -lcudart_static -ldl -lrt -lpthread \
    -Wl,--disable-new-dtags -Wl,-rpath,'$ORIGIN/librmm/lib64:$ORIGIN/rapids_logger/lib64'
) || fail "compile failed (see above)"
echo "$BUILD/rmm_replay"
