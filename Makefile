# Makefile - the two commands of the README, on top of CMake.
#
#   make run     set up, build, replay the example traces beside PyTorch's figures, draw
#                one's timeline and estimate a GPT-2 step before it runs
#   make test    set up, build and pass every test: Release, a debug build with the full
#                invariant check after every operation, an ASan+UBSan build with clang,
#                and the Python tests in a virtual environment
#   make deps    the set-up alone: missing Debian packages (apt-get), and the virtual
#                environment .venv with the Python packages the tests need (pip)
#   make build   configure and build the Release tree in build/; installs nothing
#
# Only `make deps` (which `make run` and `make test` call first) installs anything, and
# only what is missing, so on a prepared machine it costs a few dpkg and import checks.
# The dependency lists below are the only place dependencies are named.

# Debian packages: compilers, CMake, pkg-config, the C test framework, zlib for the trace
# reader, what building the Python extension and its virtual environment needs, and
# chromium, the headless browser the tests open `vramkit plot`'s page in.
DEBIAN_PACKAGES := build-essential cmake pkg-config clang libcmocka-dev zlib1g-dev gzip \
                   python3 python3-dev python3-venv chromium
# Python packages of the test environment, as distribution:module (the module is what we
# try to import): the build backend (the package is built without build isolation, from
# what is installed here), the test runner, numpy for the buffer-protocol tests,
# matplotlib for the PNG of `vramkit plot` (the package's optional `plot` extra),
# prometheus_client, whose parser checks `vramkit export`'s text (the `prometheus` extra),
# and PyTorch (the version the GPU machine runs) with transformers, torchvision (its
# release for that PyTorch) and timm, whose models the estimator's tests build and train
# under fake tensors (the `estimate` extra), scipy, whose assignment the DETR-style
# matchers of transformers call on the host (the estimator answers it under fake tensors),
# atheris, libFuzzer's engine for Python, under which the snapshot readers' fuzz target runs,
# and dask with distributed, whose local cluster of worker processes runs vramkit.dask's tests.
PYTHON_PACKAGES := scikit-build-core:scikit_build_core pytest:pytest numpy:numpy \
                   torch==2.11.0:torch torchvision==0.26.0:torchvision \
                   transformers:transformers timm:timm scipy:scipy \
                   matplotlib:matplotlib prometheus_client:prometheus_client atheris:atheris \
                   dask:dask distributed:distributed

SHELL := /bin/bash
PYTHON ?= python3
# The Python tests run here, never in the system interpreter. A plain venv: everything the
# tests import is installed into it, so no system site-packages are needed.
VENV := .venv
VENV_PYTHON := $(VENV)/bin/python
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
# conformance_cuda, _vmm and _managed need a GPU (VRAMKIT_TEST_GPU=1, bench/gpu_bench.sh
# runs them there); without one the same suite runs against the fake driver as
# conformance_*_fake_driver, so they are left out rather than listed as skipped.
CTEST_GPU_ONLY := $(if $(VRAMKIT_TEST_GPU),,-E '^conformance_(cuda|vmm|managed)$$')
CTEST := ctest --output-on-failure -j2 $(CTEST_GPU_ONLY)
TRACES := $(wildcard data/traces/*.trace.gz)

export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: all run test test-intro deps deps-debian deps-python build build-debug build-asan \
        test-release test-debug test-asan pytest bench clean

# Prerequisites run in the order written (set-up before any build); each build runs its
# own compile jobs in parallel.
.NOTPARALLEL:

all: build

# ---- set-up ------------------------------------------------------------------------------

deps: deps-debian deps-python

deps-debian:
	@missing=""; \
	for package in $(DEBIAN_PACKAGES); do \
	  dpkg -s "$$package" >/dev/null 2>&1 || missing="$$missing $$package"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  $(SUDO) apt-get update && \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $$missing; \
	fi

deps-python: deps-debian
	@[ -x $(VENV_PYTHON) ] || { echo "creating the virtual environment $(VENV)"; \
	                            $(PYTHON) -m venv $(VENV); }
	@missing=""; \
	for entry in $(PYTHON_PACKAGES); do \
	  $(VENV_PYTHON) -c "import $${entry#*:}" >/dev/null 2>&1 || missing="$$missing $${entry%%:*}"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Python packages into $(VENV):$$missing"; \
	  $(VENV_PYTHON) -m pip install $$missing; \
	fi

# ---- builds ------------------------------------------------------------------------------
# The builds install nothing; on a machine without the tools, `make deps` first.

# The tool lands at build/vramkit.
build:
	@command -v cmake >/dev/null || { echo "cmake not found: run 'make deps' first" >&2; exit 1; }
	cmake -S . -B build -DCMAKE_BUILD_TYPE=Release
	cmake --build build -j$(JOBS)

# Level 3 runs the full invariant check (_vram_pool_is_valid) after every operation.
build-debug:
	cmake -S . -B build-debug -DCMAKE_BUILD_TYPE=Debug -DVRAMKIT_DEBUG_LEVEL=3
	cmake --build build-debug -j$(JOBS)

# AddressSanitizer and UndefinedBehaviorSanitizer, built with clang (the compiler is fixed
# when build-asan is first configured); there tests/fuzz's targets are libFuzzer binaries,
# and each fuzzes for a bounded time from its corpus.
build-asan:
	CC=clang cmake -S . -B build-asan -DCMAKE_C_COMPILER=clang -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  -DVRAMKIT_SANITIZE=ON -DVRAMKIT_DEBUG_LEVEL=3 -DVRAMKIT_FUZZ=ON
	cmake --build build-asan -j$(JOBS)

# ---- the two commands --------------------------------------------------------------------

# What vramkit is for, in four steps, each said before its output: the example traces
# replayed (with the smallest cap each fits under), beside PyTorch's allocator; the memory
# timeline page of the GPT-2 trace (build/timeline.html, which opens offline in a browser);
# and an estimate of a GPT-2 training step made before running it (no GPU needed). The build
# is quiet: its log is build/build.log, shown only when it fails.
run: deps
	@echo "building vramkit (Release, build/; the log is build/build.log)"
	@mkdir -p build
	@{ cmake -S . -B build -DCMAKE_BUILD_TYPE=Release && cmake --build build -j$(JOBS); } \
	  > build/build.log 2>&1 || { cat build/build.log; exit 1; }
	@$(VENV_PYTHON) -m pip install -q --no-build-isolation .
	@echo
	@echo "1. Three allocation traces recorded from real PyTorch runs on an H200 (BERT inference"
	@echo "   over random lengths, GPT-2 training, ResNet-18 with a prefetch stream), replayed"
	@echo "   through vramkit on sim, a host model of the card. res/live: memory held from the"
	@echo "   device at its peak over the bytes live at theirs; min cap: the smallest memory cap"
	@echo "   under which the trace still runs; ns/op: time per allocation or free."
	@build/vramkit replay --min-capacity --compare $(TRACES)
	@echo
	@echo "2. The memory timeline of the GPT-2 training trace: each large block a band, the small"
	@echo "   and short-lived ones merged into one grey band, reserved memory above them:"
	@$(VENV)/bin/vramkit plot data/traces/gpt2_train.trace.gz -o build/timeline.html
	@echo "   open build/timeline.html in a browser."
	@echo
	@echo "3. Before a run: will GPT-2 (124M) at batch 8 x 1024 in bf16 autocast fit a 24 GiB"
	@echo "   card? vramkit estimate runs one training step on fake tensors (no GPU memory) and"
	@echo "   replays what it allocates under vramkit and under a model of PyTorch's allocator:"
	@$(VENV)/bin/vramkit estimate --model gpt2 --batch 8 --seq 1024 --precision bf16-amp \
	  --device-memory 24G --trace build/gpt2_estimate.trace.gz

test: test-intro deps test-release test-debug test-asan pytest

# What `make test` runs and how long it takes, said before it starts. The time: `time make
# test` from a fresh clone on the 2-core development machine, the venv's set-up included:
# 13 min 22 s; the sanitizer build's fuzzing is a minute of it.
test-intro:
	@echo "make test: builds and runs four suites, about 10 to 15 minutes on 2 cores:"
	@echo "  1. Release build (build/): the C tests under ctest, the C quick start, the install test"
	@echo "  2. Debug build (build-debug/): the same tests, the invariant checker after every call"
	@echo "  3. clang ASan+UBSan build (build-asan/): the same tests under the sanitizers, and"
	@echo "     each fuzz target of tests/fuzz for 15 s"
	@echo "  4. pytest in $(VENV): the Python package built from this tree, and its tests on sim"
	@echo "  (conformance_cuda/vmm/managed need a GPU; here that suite runs on the fake driver)"

test-release: build
	cd build && $(CTEST)

test-debug: build-debug
	cd build-debug && $(CTEST)

test-asan: build-asan
	cd build-asan && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
	  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 $(CTEST)

# ---- the Python tests --------------------------------------------------------------------
# The package is installed from this tree into .venv (scikit-build-core builds the C core
# and the extension; --no-build-isolation builds with the backend installed there, so
# nothing is downloaded at this step) and tests/python runs from that interpreter.
pytest: deps-python
	$(VENV_PYTHON) -m pip install -q --no-build-isolation .
	$(VENV_PYTHON) -m pytest -q tests/python

# ---- extras ------------------------------------------------------------------------------

# The CPU figures of bench/README.md: fragmentation and speed on both host models.
bench: build
	build/vramkit replay --min-capacity --baseline --warm --source sim $(TRACES)
	build/vramkit replay --min-capacity --baseline --warm --source sim:vmm $(TRACES)
	build/vramkit bench random --source sim
	build/vramkit bench random --source sim:vmm
	VRAMKIT_TIGHT_THRESHOLD=0 build/vramkit replay --min-capacity --warm --source sim $(TRACES)
	VRAMKIT_TIGHT_THRESHOLD=0 build/vramkit bench random --source sim
	build/vramkit bench pair --source sim
	build/vramkit bench scale

clean:
	rm -rf build build-debug build-asan $(VENV)
