#!/usr/bin/env bash
# bench/dask_wheels.sh - the wheels bench/dask_bench.py needs on the GPU machine, which has no
# network: Dask, distributed, dask-cuda, RMM's Python package and what they import.
#
# Usage:
#   bench/dask_wheels.sh [download] [DIR]   here, with network: fill DIR (default .gpu/dask-wheels)
#   bench/dask_wheels.sh install [DIR]      on the GPU machine: install what it lacks from DIR
#
# download resolves dask-cuda and rmm-cu13 for the GPU machine's interpreter (CPython 3.12,
# x86-64 manylinux, wheels only) with every dependency, then drops the wheels that machine
# has already or that the benchmark never imports:
# - numpy: installed there with CuPy, Numba and PyTorch; replacing it could break them;
# - bokeh and what only it needs (pillow, contourpy, narwhals, xyzservices): the dashboard,
#   asked for by rapids-dask-dependency's pins; the benchmark runs without a dashboard, and
#   they would take a third of the 64 MiB a device call may carry.
# The versions follow bench/rmm_build.sh's RMM (26.10; its C++ wheels librmm-cu13 and
# rapids-logger come along as rmm-cu13's dependencies), whose dask-cuda pins dask and
# distributed through rapids-dask-dependency.
#
# install puts in each wheel whose distribution is not installed yet, one by one and without
# resolving (--no-deps --no-index), so nothing the machine has is replaced and bokeh's
# absence does not stop pip; it prints what it installed and what it left.
set -euo pipefail
MODE=download
case ${1:-} in download | install) MODE=$1; shift ;; esac
absolute() { case $1 in /*) echo "$1" ;; *) echo "$PWD/$1" ;; esac; }
DIR=${1:+$(absolute "$1")}
cd "$(dirname "$0")/.."
DIR=${DIR:-$PWD/.gpu/dask-wheels}
RAPIDS_VERSION=${RAPIDS_VERSION:-26.10}
# Distributions, as pip names them in wheel files (lower case, '_' for '-').
SKIPPED=${DASK_WHEELS_SKIP:-"numpy bokeh pillow contourpy narwhals xyzservices"}
fail() { echo "dask_wheels: $*" >&2; exit 1; }

# The interpreter: the project's virtual environment where there is one (this machine's
# system Python may have no pip), else python3.
PYTHON=${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}

distribution() {  # a wheel file's distribution name, normalised: dask_cuda, rmm_cu13, ...
  basename "$1" | cut -d- -f1 | tr '[:upper:]' '[:lower:]'
}

download() {
  mkdir -p "$DIR"
  "$PYTHON" -m pip download --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d "$DIR" \
    "dask-cuda==$RAPIDS_VERSION.*" "rmm-cu13==$RAPIDS_VERSION.*" >&2 ||
    fail "pip download failed (this needs network and $PYTHON with pip)"
  local wheel name
  for wheel in "$DIR"/*.whl; do
    name=$(distribution "$wheel")
    case " $SKIPPED " in *" $name "*) rm -f "$wheel" ;; esac
  done
  ls -1 "$DIR"
  echo "dask_wheels: $(find "$DIR" -name '*.whl' | wc -l) wheels, $(du -sh "$DIR" | cut -f1) in $DIR" >&2
}

install() {
  [ -d "$DIR" ] || fail "no $DIR: run bench/dask_wheels.sh download on a machine with network"
  local wheel name
  for wheel in "$DIR"/*.whl; do
    name=$(distribution "$wheel")
    if "$PYTHON" -c "import importlib.metadata as m, sys; m.distribution(sys.argv[1])" \
        "$name" 2>/dev/null; then
      echo "dask_wheels: $name is installed already, left as it is" >&2
      continue
    fi
    PIP_BREAK_SYSTEM_PACKAGES=1 "$PYTHON" -m pip install -q --no-index --no-deps "$wheel" ||
      fail "could not install $wheel"
    echo "dask_wheels: installed $(basename "$wheel")" >&2
  done
}

"$MODE"
