#!/usr/bin/env bash
# bench/gpu_bench.sh - every GPU figure of docs/performance.md in one run on the GPU machine.
#
# Run from the repository root (or anywhere: it changes there) on a machine with an NVIDIA
# GPU, nvcc, cmake and python3 with torch; no network is used. Before the call, copy the
# anchor instruments (the C++ programs that measure PyTorch's allocator and the CUDA
# allocators, which are not part of this project) and the traces next to the tree:
#     .gpu/anchors/  <- the anchor instruments      .gpu/traces/ <- the traces
# (without .gpu/traces the project's copies in data/traces are used).
#
# Everything lands in $OUT (default .gpu/out) as *.txt and *.jsonl, one file per step, with
# each step's stderr beside it (*.stderr.txt) and its exit status and duration in
# steps.txt; a compact table goes to stdout at the end (bench/gpu_table.py). Steps run in
# order of importance under a time budget (GPU_BENCH_BUDGET_S, default 450 s, i.e. 7.5
# minutes), each with its own timeout, so a slow step costs its own figure, not the run.
#
# Steps, in this order: build vramkit (cmake, Release, into build-gpu/) and the anchors
# (per their README, into .gpu/anchors-build/); the anchors' micro (cudaMalloc,
# cudaMallocAsync, VMM map); vramkit bench pair and random on cuda, vmm and managed;
# vramkit replay --json --min-capacity --baseline --warm on cuda, vmm, sim and sim:vmm;
# vramkit bench scale; each trace on cuda under a limit of 1.03x its peak live, with and
# on fixed segments alone (vramkit_capfit.jsonl); tight placement (VRAMKIT_TIGHT_THRESHOLD=0,
# on fixed large blocks): bench random and replay on cuda, replay on sim; large blocks in fixed
# segments of their own (VRAMKIT_LARGE_BLOCKS=fixed, the default before 2026-12-02): bench
# pair and random and replay on cuda; the C tests with VRAMKIT_TEST_GPU=1 (ctest); torch_bench native and
# expandable_segments; torch_replay through cudaMallocAsync, then PyTorch native and
# expandable_segments; rmm_replay, RAPIDS RMM's pool and arena resources: the cached pair
# (rmm_pair.jsonl) and the same traces, then RMM's pool of a fixed size beside vramkit's
# preallocation of the same size (bench/preallocate_fit.py, preallocate_fit.txt)
# (bench/rmm_replay.cpp, built by bench/rmm_build.sh from the librmm-cu13 and rapids-logger
# wheels carried in .gpu/rmm/; without them the step is recorded as skipped);
# tests/python/gpu_check.py (the package installed from a wheel
# carried in .whl/, or built from the tree if scikit-build-core is there). Failures are
# allowed everywhere: each is recorded and the run goes on.
#
# torch_replay's min-capacity bisection is the slow part. It runs one trace per call with a
# timeout; bert_infer_varlen bisects to 4 MiB instead of 1 MiB (TORCH_BISECT_MIB_BERT, our
# copy of torch_replay.cpp reads the resolution from TORCH_REPLAY_BISECT_MIB and is the
# anchor unchanged without it); a trace whose bisection times out is rerun without one, so
# its reserved/live ratio still comes, with min_capacity null.
#
# rmm_replay bisects the same way (RMM_BISECT_MIB, default 1), one trace and resource per
# call, with the same fallback on a timeout.
#
# GPU_BENCH_STEPS picks step groups, run in this order (default: all of them): micro
# vramkit ctest torch_bench torch_replay rmm gpu_check gpu_tests (gpu_tests: the pytest suite of
# tests/gpu, out of memory through PyTorch, CuPy, Numba and vramkit.empty, on the installed
# package). A step the budget cut off is listed as
# skipped in steps.txt; a second call for just its group (say GPU_BENCH_STEPS=gpu_check)
# reuses the builds of the first where the machine kept them.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
ROOT=$PWD
GPU_DIR=$ROOT/.gpu
OUT=${OUT:-$GPU_DIR/out}
BUDGET=${GPU_BENCH_BUDGET_S:-450}
BERT_MIB=${TORCH_BISECT_MIB_BERT:-4}
RMM_MIB=${RMM_BISECT_MIB:-1}
STEPS=${GPU_BENCH_STEPS:-micro vramkit ctest torch_bench torch_replay rmm gpu_check gpu_tests}
JOBS=$(nproc 2>/dev/null || echo 8)
BUILD=$ROOT/build-gpu
ANCHORS=$GPU_DIR/anchors
ANCHOR_BUILD=$GPU_DIR/anchors-build
RMM_WHEELS=$GPU_DIR/rmm
RMM_BUILD=$GPU_DIR/rmm-build
TRACES_DIR=$GPU_DIR/traces
[ -d "$TRACES_DIR" ] || TRACES_DIR=$ROOT/data/traces
mkdir -p "$OUT" "$ANCHOR_BUILD"
: > "$OUT/steps.txt"
START=$SECONDS

wants() { [[ " $STEPS " == *" $1 "* ]]; }
note() { echo "[gpu_bench $((SECONDS - START))s] $*" >&2; }

# step NAME.EXT TIMEOUT_S COMMAND...: stdout to $OUT/NAME.EXT, stderr beside it. The
# timeout shrinks to what is left of the budget; past the budget the step is skipped.
step() {
  local file=$1 limit=$2
  shift 2
  local left=$((BUDGET - (SECONDS - START)))
  if ((left < 5)); then
    echo "${file%.*} skipped: time budget spent" >>"$OUT/steps.txt"
    note "skip ${file%.*} (budget spent)"
    return 99
  fi
  ((limit > left)) && limit=$left
  note "run ${file%.*} (timeout ${limit}s)"
  local began=$SECONDS
  timeout -k 5 "$limit" "$@" >"$OUT/$file" 2>"$OUT/${file%.*}.stderr.txt"
  local rc=$?
  local verdict="rc=$rc"
  ((rc == 124 || rc == 137)) && verdict="rc=$rc TIMEOUT after ${limit}s"
  echo "${file%.*} $verdict seconds=$((SECONDS - began))" >>"$OUT/steps.txt"
  return $rc
}

# ---- the machine ---------------------------------------------------------------------------
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
if ! command -v nvcc >/dev/null && [ -x "$CUDA_HOME/bin/nvcc" ]; then PATH=$CUDA_HOME/bin:$PATH; fi
command -v nvcc >/dev/null && CUDA_HOME=$(dirname "$(dirname "$(command -v nvcc)")")
TORCH=$(python3 -c "import torch, os; print(os.path.dirname(torch.__file__))" 2>/dev/null)
{
  echo "date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
  echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD 2>/dev/null || echo ' (+ uncommitted changes)')"
  echo "host: $(uname -srm), $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
  nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv,noheader 2>&1 | sed 's/^/gpu: /'
  echo "nvcc: $(nvcc --version 2>/dev/null | tail -n 2 | head -n 1)"
  echo "torch: $(python3 -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda)' 2>&1 | tail -n 1)"
  echo "cmake: $(cmake --version | head -n 1)"
  echo "traces: $TRACES_DIR"
} >"$OUT/env.txt" 2>&1
cat "$OUT/env.txt" >&2

# ---- builds: vramkit and the three anchors in parallel --------------------------------------
build_vramkit() {
  # The C tests need cmocka; a machine without it still gets the tool.
  cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release || {
    echo "configure with tests failed: retrying without them"
    cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DVRAMKIT_BUILD_TESTS=OFF
  } || return 1
  cmake --build "$BUILD" -j"$JOBS" || {
    echo "full build failed: building the command alone"
    cmake --build "$BUILD" -j"$JOBS" --target vramkit_cli
  }
}

build_micro() {
  [ "$ANCHOR_BUILD/micro" -nt "$ANCHORS/micro.c" ] && return 0
  cd "$ANCHORS" && nvcc -O2 -x c micro.c -o "$ANCHOR_BUILD/micro" -lcuda
}

# torch_replay's bisection resolution becomes an environment variable in our copy; with
# the variable unset the program is the anchor unchanged (1 MiB).
build_torch_tool() {
  local name=$1 source=$ANCHORS/$1.cpp
  if [ "$name" = torch_replay ]; then
    source=$ANCHOR_BUILD/torch_replay_capped.cpp
    sed -e 's/while (hi - lo > (1u << 20))/while (hi - lo > bisect_resolution())/' \
      -e 's|^namespace A = c10::cuda::CUDACachingAllocator;|&\nstatic uint64_t bisect_resolution() { const char *m = getenv("TORCH_REPLAY_BISECT_MIB"); return (uint64_t)((m ? atof(m) : 1.0) * 1048576.0); }|' \
      "$ANCHORS/torch_replay.cpp" >"$source"
    grep -q 'bisect_resolution()' "$source" || cp "$ANCHORS/torch_replay.cpp" "$source"
  fi
  [ "$ANCHOR_BUILD/$name" -nt "$ANCHORS/$name.cpp" ] && return 0
  g++ -O2 -std=c++17 -I"$ANCHORS" -I"$TORCH/include" -I"$CUDA_HOME/include" "$source" \
    -o "$ANCHOR_BUILD/$name" -L"$TORCH/lib" -lc10 -lc10_cuda -L"$CUDA_HOME/lib64" -lcudart \
    -Wl,-rpath,"$TORCH/lib" -Wl,-rpath,"$CUDA_HOME/lib64"
}

# RMM's C++ library comes as Python wheels (librmm-cu13, rapids-logger) carried in .gpu/rmm/.
have_rmm_wheels() {
  compgen -G "$RMM_WHEELS/librmm_cu13-*.whl" >/dev/null && compgen -G "$RMM_WHEELS/rapids_logger-*.whl" >/dev/null
}

note "building vramkit and the anchors"
began=$SECONDS
build_vramkit >"$OUT/build_vramkit.txt" 2>&1 &
pid_vramkit=$!
build_micro >"$OUT/build_micro.txt" 2>&1 &
pid_micro=$!
build_torch_tool torch_bench >"$OUT/build_torch_bench.txt" 2>&1 &
pid_torch_bench=$!
build_torch_tool torch_replay >"$OUT/build_torch_replay.txt" 2>&1 &
pid_torch_replay=$!
build_jobs="vramkit micro torch_bench torch_replay"
if wants rmm && have_rmm_wheels; then
  bash "$ROOT/bench/rmm_build.sh" "$RMM_WHEELS" "$RMM_BUILD" >"$OUT/build_rmm.txt" 2>&1 &
  pid_rmm=$!
  build_jobs="$build_jobs rmm"
fi
for job in $build_jobs; do
  pid_var=pid_$job
  wait "${!pid_var}"
  echo "build_$job rc=$? seconds=$((SECONDS - began))" >>"$OUT/steps.txt"
done
VRAMKIT=$BUILD/vramkit
TRACES=("$TRACES_DIR"/*.trace.gz)
have() { [ -x "$1" ]; }

# ---- the anchors' micro-benchmarks ----------------------------------------------------------
wants micro && have "$ANCHOR_BUILD/micro" && step anchors_micro.txt 120 "$ANCHOR_BUILD/micro"

# ---- vramkit on the GPU sources -------------------------------------------------------------
if wants vramkit && have "$VRAMKIT"; then
  for source in cuda vmm managed; do
    step "vramkit_pair_$source.jsonl" 60 "$VRAMKIT" bench pair --source "$source" --json
    step "vramkit_random_$source.jsonl" 60 "$VRAMKIT" bench random --source "$source" --json
  done
  for source in cuda vmm; do
    step "vramkit_replay_$source.jsonl" 120 "$VRAMKIT" replay --json --min-capacity --baseline \
      --warm --source "$source" "${TRACES[@]}"
  done
  # The host models on this machine's CPU, for the fragmentation comparison and the speed
  # targets measured beside the GPU figures. Nine cold passes, each followed by a pass of
  # the yardstick: a pass on sim takes milliseconds, and with three one trace's ratio moved
  # by half between two calls.
  for source in sim sim:vmm; do
    step "vramkit_replay_${source/:/_}.jsonl" 90 "$VRAMKIT" replay --json --min-capacity \
      --baseline --warm --repeat 9 --source "$source" "${TRACES[@]}"
  done
  step vramkit_scale.jsonl 60 "$VRAMKIT" bench scale --json
  # The fit under a cap on the card: each trace replayed on the cuda source under a limit of
  # 1.03x its peak live bytes, on the default settings (large blocks in virtual ranges) and
  # on fixed segments alone (VRAMKIT_LARGE_BLOCKS=fixed VRAMKIT_VIRTUAL_THRESHOLD=1); "ooms"
  # says whether it fit.
  : >"$OUT/vramkit_capfit.jsonl"
  for trace in "${TRACES[@]}"; do
    name=$(basename "$trace" .trace.gz)
    live=$("$VRAMKIT" replay --json --repeat 1 --source sim "$trace" 2>/dev/null |
      python3 -c "import json, sys; print(json.loads(sys.stdin.read())['peak_live_bytes'])")
    [ -n "$live" ] || continue
    cap=$(python3 -c "print(int($live * 1.03))")
    for threshold in 0.5 1; do
      large=virtual; [ "$threshold" = 1 ] && large=fixed
      step "vramkit_capfit_${name}_$threshold.jsonl" 60 env VRAMKIT_VIRTUAL_THRESHOLD=$threshold \
        VRAMKIT_LARGE_BLOCKS=$large \
        "$VRAMKIT" replay --json --warm --repeat 1 --capacity "$cap" --source cuda "$trace"
      sed "s/}\$/, \"virtual_threshold\": $threshold, \"large_blocks\": \"$large\", \"cap_over_live\": 1.03}/" \
        "$OUT/vramkit_capfit_${name}_$threshold.jsonl" >>"$OUT/vramkit_capfit.jsonl"
    done
  done
  # Tight placement (VRAMKIT_TIGHT_THRESHOLD=0, which places fixed large segments): the
  # memory it saves, on the host model, and what its extra driver calls cost, on the card.
  tight=(env VRAMKIT_TIGHT_THRESHOLD=0 VRAMKIT_LARGE_BLOCKS=fixed)
  step vramkit_random_cuda_tight.jsonl 90 "${tight[@]}" "$VRAMKIT" bench random \
    --source cuda --json
  step vramkit_replay_cuda_tight.jsonl 120 "${tight[@]}" "$VRAMKIT" replay --json \
    --min-capacity --warm --source cuda "${TRACES[@]}"
  step vramkit_replay_sim_tight.jsonl 90 "${tight[@]}" "$VRAMKIT" replay --json \
    --min-capacity --baseline --warm --source sim "${TRACES[@]}"
  # Large blocks in fixed segments of their own (VRAMKIT_LARGE_BLOCKS=fixed, the default
  # before 2026-12-02): the cold pass and the cached pair beside the default's virtual ranges.
  step vramkit_pair_cuda_large_fixed.jsonl 60 env VRAMKIT_LARGE_BLOCKS=fixed "$VRAMKIT" \
    bench pair --source cuda --json
  step vramkit_random_cuda_large_fixed.jsonl 60 env VRAMKIT_LARGE_BLOCKS=fixed "$VRAMKIT" \
    bench random --source cuda --json
  step vramkit_replay_cuda_large_fixed.jsonl 120 env VRAMKIT_LARGE_BLOCKS=fixed "$VRAMKIT" \
    replay --json --min-capacity --warm --source cuda "${TRACES[@]}"
fi

# ---- the C conformance suite on the GPU sources ----------------------------------------------
if wants ctest && [ -f "$BUILD/CTestTestfile.cmake" ]; then
  step ctest_gpu.txt 150 bash -c "cd '$BUILD' && VRAMKIT_TEST_GPU=1 ctest --output-on-failure -j4"
fi

# ---- PyTorch and cudaMallocAsync on the same card ---------------------------------------------
if wants torch_bench && have "$ANCHOR_BUILD/torch_bench"; then
  step torch_bench_native.txt 90 env -u PYTORCH_CUDA_ALLOC_CONF "$ANCHOR_BUILD/torch_bench" native
  step torch_bench_expandable.txt 90 env PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True \
    "$ANCHOR_BUILD/torch_bench" expandable
fi

if wants torch_replay && have "$ANCHOR_BUILD/torch_replay"; then
  step torch_replay_async.jsonl 90 env DO_ASYNC=1 "$ANCHOR_BUILD/torch_replay" "${TRACES[@]}"
  # One trace per call, so that a slow bisection costs only its own figure.
  for mode in native expandable; do
    conf=""
    [ "$mode" = expandable ] && conf="expandable_segments:True"
    : >"$OUT/torch_replay_$mode.jsonl"
    for trace in "${TRACES[@]}"; do
      name=$(basename "$trace" .trace.gz)
      resolution=1
      [ "$name" = bert_infer_varlen ] && resolution=$BERT_MIB
      step "torch_replay_${mode}_$name.jsonl" 75 env PYTORCH_CUDA_ALLOC_CONF="$conf" \
        TORCH_REPLAY_BISECT_MIB="$resolution" "$ANCHOR_BUILD/torch_replay" "$trace"
      rc=$?
      ((rc == 99)) && continue
      if ((rc == 124 || rc == 137)); then
        # No bisection at all (a resolution larger than any range): the ratio still comes.
        step "torch_replay_${mode}_${name}_nobisect.jsonl" 40 env PYTORCH_CUDA_ALLOC_CONF="$conf" \
          TORCH_REPLAY_BISECT_MIB=1000000000 "$ANCHOR_BUILD/torch_replay" "$trace" || continue
        sed 's/"min_capacity_bytes": [0-9]*, "min_capacity_over_live": [0-9.]*/"min_capacity_bytes": null, "min_capacity_over_live": null, "bisection": "skipped (timeout)"/' \
          "$OUT/torch_replay_${mode}_${name}_nobisect.jsonl" >>"$OUT/torch_replay_$mode.jsonl"
      else
        sed "s/}\$/, \"bisection_resolution_mib\": $resolution}/" \
          "$OUT/torch_replay_${mode}_$name.jsonl" >>"$OUT/torch_replay_$mode.jsonl"
      fi
    done
  done
fi

# ---- RAPIDS RMM's pool and arena on the same traces -------------------------------------------
# One trace and one resource per call, as torch_replay: a slow bisection costs only its own
# figure, and on a timeout the call is rerun without bisection (min_capacity null).
if wants rmm; then
  if ! have_rmm_wheels; then
    echo "rmm skipped: no wheels in .gpu/rmm" >>"$OUT/steps.txt"
  elif ! have "$RMM_BUILD/rmm_replay"; then
    echo "rmm skipped: build failed (build_rmm.txt)" >>"$OUT/steps.txt"
  else
    # The cached alloc+free pair, for the pair table (rmm_replay --pair).
    step rmm_pair.jsonl 60 "$RMM_BUILD/rmm_replay" --pair
    : >"$OUT/rmm_replay.jsonl"
    for trace in "${TRACES[@]}"; do
      name=$(basename "$trace" .trace.gz)
      for allocator in rmm-pool rmm-arena; do
        file="rmm_replay_${allocator#rmm-}_$name.jsonl"
        step "$file" 60 env RMM_REPLAY_ALLOCATORS=$allocator RMM_REPLAY_BISECT_MIB="$RMM_MIB" \
          "$RMM_BUILD/rmm_replay" "$trace"
        rc=$?
        ((rc == 99)) && continue
        if ((rc == 124 || rc == 137)); then
          step "${file%.jsonl}_nobisect.jsonl" 30 env RMM_REPLAY_ALLOCATORS=$allocator \
            RMM_REPLAY_BISECT_MIB=1000000000 "$RMM_BUILD/rmm_replay" "$trace" || continue
          sed -e 's/"min_capacity_bytes": [0-9]*, "min_capacity_over_live": [0-9.]*/"min_capacity_bytes": null, "min_capacity_over_live": null/' \
            -e 's/"bisection": "[^"]*"/"bisection": "skipped (timeout)"/' \
            "$OUT/${file%.jsonl}_nobisect.jsonl" >>"$OUT/rmm_replay.jsonl"
        else
          sed "s/}\$/, \"bisection_resolution_mib\": $RMM_MIB}/" "$OUT/$file" >>"$OUT/rmm_replay.jsonl"
        fi
      done
    done
    # Like for like: a pool of S taken at the start and never grown, vramkit's
    # VRAMKIT_PREALLOCATE=S under a limit of S against RMM's pool with initial = maximum = S:
    # time per op at S = 2 x peak live, and the smallest S each fits in.
    step preallocate_fit.txt 120 python3 "$ROOT/bench/preallocate_fit.py" --source cuda \
      --vramkit "$BUILD/vramkit" --rmm "$RMM_BUILD/rmm_replay" "${TRACES[@]}"
  fi
fi

# ---- the Python package's GPU checks (the longest step, so the last) -------------------------
# gpu_check.py needs the package installed: from a wheel carried in .whl/ if there is
# one, else built from the tree where scikit-build-core is present (no network either way).
install_python_package() {
  python3 -c "import vramkit._core" 2>/dev/null && { echo "vramkit already importable"; return 0; }
  local wheel
  wheel=$(ls "$ROOT"/.whl/vramkit-*.whl 2>/dev/null | head -n 1)
  if [ -n "$wheel" ]; then
    PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install --no-index --no-deps --force-reinstall "$wheel"
  elif python3 -c "import scikit_build_core" 2>/dev/null; then
    PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install --no-index --no-deps --no-build-isolation "$ROOT"
  else
    echo "no wheel in .whl/ and no scikit-build-core: cannot install vramkit"
    return 1
  fi
}
if { wants gpu_check || wants gpu_tests; } && [ -f "$ROOT/tests/python/gpu_check.py" ]; then
  step install_python.txt 120 bash -c "$(declare -f install_python_package); ROOT='$ROOT'; install_python_package"
  # Run from outside the tree so that the installed package, not python/vramkit, is found.
  wants gpu_check && step gpu_check.txt 150 bash -c "cd /tmp && python3 '$ROOT/tests/python/gpu_check.py'"
  # The suite takes most of a device call by itself (docs/performance.md has its time):
  # GPU_BENCH_STEPS=gpu_tests with a budget of its own runs it whole.
  wants gpu_tests && step gpu_tests.txt 590 bash -c \
    "cd /tmp && python3 -m pytest -v -rs -p no:cacheprovider '$ROOT/tests/gpu'"
fi

# ---- the table --------------------------------------------------------------------------------
note "done in $((SECONDS - START))s"
echo "total seconds=$((SECONDS - START))" >>"$OUT/steps.txt"
python3 "$ROOT/bench/gpu_table.py" "$OUT" | tee "$OUT/table.txt"
