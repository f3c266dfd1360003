"""What the Python tests share: the sim environment, size units, and fresh interpreters.

A plain module the tests import by name (pytest puts tests/python on sys.path), so that
conftest.py holds only pytest's hooks and fixtures.
"""

import os
import subprocess
import sys
import textwrap

import pytest

# Every pool in the tests is a sim pool of 4 GiB unless a test says otherwise.
SIM_ENV = {"VRAMKIT_SOURCE": "sim", "VRAMKIT_SIM_CAPACITY": "4G"}
# Options a developer's shell may hold that would change the pools under the tests.
OTHER_OPTIONS = ("VRAMKIT_LIMIT", "VRAMKIT_PREALLOCATE", "VRAMKIT_RELEASE_THRESHOLD",
                 "VRAMKIT_TIGHT_THRESHOLD", "VRAMKIT_VIRTUAL_THRESHOLD", "VRAMKIT_LARGE_BLOCKS")

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30


def run_python(code: str, env: dict | None = None, check: bool = True, cwd=None):
    """Run code in a fresh interpreter (fresh default pools) on the sim source, in cwd (the
    current directory if None). Returns the CompletedProcess; with check, a non-zero exit
    fails the test and shows the output."""
    full_env = dict(os.environ)
    full_env.update(SIM_ENV)
    full_env.update(env or {})
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=full_env, capture_output=True, text=True, timeout=120, cwd=cwd,
    )
    if check and proc.returncode != 0:
        pytest.fail(f"subprocess failed ({proc.returncode}):\n--- stdout\n{proc.stdout}"
                    f"\n--- stderr\n{proc.stderr}", pytrace=False)
    return proc


def rounded_block(n: int) -> int:
    """A request's size as the allocators round it: 512-byte units, 512 at least."""
    return max(512, -(-n // 512) * 512)


class AllocatorFigures:
    """The allocator figures a measurement reads (allocated, peak, reserved, empty_cache),
    kept as counters that a test's stand-in moves: the estimator's tests measure on a CPU
    with one of these where a GPU's allocator would answer."""

    def __init__(self):
        self.level = self.top = self.held = 0
        self.emptied = 0
        self.calls = []

    def allocated(self, device):
        return self.level

    def reset_peak(self, device):
        self.top = self.level

    def peak(self, device):
        return self.top

    def reserved(self, device):
        return self.held

    def empty_cache(self, device):
        self.emptied += 1
        self.held = 0
