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
