# Makefile - the two commands of the README, on top of CMake.
#
#   make run    set up, build, replay the example traces and print the summary and a
#               fragmentation table
#   make test   set up, build and pass every test: Release, a debug build with the full
#               invariant check after every operation, an ASan+UBSan build with clang,
#               and the Python tests
#
# Set-up (`make deps`) installs only what is missing, so on a prepared machine it costs a
# few dpkg queries. The dependency lists below are the only place dependencies are named.

# Debian packages: compilers, CMake, the C test framework, zlib for the trace reader, and
# what building and testing the Python package needs.
DEBIAN_PACKAGES := build-essential cmake pkg-config clang libcmocka-dev zlib1g-dev gzip \
                   python3 python3-dev python3-pip
# Python packages as distribution:module (the module is what we try to import).
PYTHON_PACKAGES := scikit-build-core:scikit_build_core pytest:pytest numpy:numpy

SHELL := /bin/bash
PYTHON ?= python3
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
CTEST := ctest --output-on-failure -j2
TRACES := $(wildcard data/traces/*.trace.gz)

# Debian's Python is "externally managed" (PEP 668): without this pip refuses to install
# next to apt's packages. It is harmless where pip does not know the setting.
export PIP_BREAK_SYSTEM_PACKAGES := 1
export PIP_ROOT_USER_ACTION := ignore
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: all run test deps deps-debian deps-python build build-debug build-asan \
        test-release test-debug test-asan pytest bench clean

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
	@missing=""; \
	for entry in $(PYTHON_PACKAGES); do \
	  $(PYTHON) -c "import $${entry#*:}" >/dev/null 2>&1 || missing="$$missing $${entry%%:*}"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Python packages:$$missing"; \
	  $(PYTHON) -m pip install $$missing; \
	fi

# ---- builds ------------------------------------------------------------------------------

# The tool lands at build/vramkit.
build: deps
	cmake -S . -B build -DCMAKE_BUILD_TYPE=Release
	cmake --build build -j$(JOBS)

# Level 3 runs the full invariant check (_vram_pool_is_valid) after every operation.
build-debug: deps
	cmake -S . -B build-debug -DCMAKE_BUILD_TYPE=Debug -DVRAMKIT_DEBUG_LEVEL=3
	cmake --build build-debug -j$(JOBS)

# AddressSanitizer and UndefinedBehaviorSanitizer, built with clang (the compiler is fixed
# when build-asan is first configured).
build-asan: deps
	CC=clang cmake -S . -B build-asan -DCMAKE_C_COMPILER=clang -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  -DVRAMKIT_SANITIZE=ON -DVRAMKIT_DEBUG_LEVEL=3
	cmake --build build-asan -j$(JOBS)

# ---- the two commands --------------------------------------------------------------------

run: build
	build/vramkit replay --summary $(TRACES)

test: test-release test-debug test-asan pytest

test-release: build
	cd build && $(CTEST)

test-debug: build-debug
	cd build-debug && $(CTEST)

test-asan: build-asan
	cd build-asan && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
	  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 $(CTEST)

# ---- the Python part ---------------------------------------------------------------------
# PYTHON PART: owned with the Python package; its engineer gives the exact commands. It
# installs the package from this tree (scikit-build-core builds the C core and the
# extension) and runs tests/python. Skipped while there is no pyproject.toml.
pytest: deps
	@if [ -f pyproject.toml ]; then \
	  set -x; \
	  $(PYTHON) -m pip install --no-build-isolation . && \
	  $(PYTHON) -m pytest -q tests/python; \
	else \
	  echo "no pyproject.toml: skipping the Python tests"; \
	fi

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
	rm -rf build build-debug build-asan
