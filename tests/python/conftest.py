"""Shared set-up of the Python tests: every pool is a sim pool.

The default pools are process-wide and created on first use from VRAMKIT_* variables, so
the variables are set here, before any test imports vramkit. Tests that need fresh pools
(exact numbers, configure, preallocation) run their body in a subprocess through `run`.
"""

import os
import subprocess
import sys
import textwrap

import pytest

SIM_ENV = {"VRAMKIT_SOURCE": "sim", "VRAMKIT_SIM_CAPACITY": "4G"}
os.environ.update(SIM_ENV)
for _name in ("VRAMKIT_LIMIT", "VRAMKIT_PREALLOCATE", "VRAMKIT_RELEASE_THRESHOLD",
              "VRAMKIT_TIGHT_THRESHOLD"):
    os.environ.pop(_name, None)

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30


def run_python(code: str, env: dict | None = None, check: bool = True):
    """Run code in a fresh interpreter (fresh default pools) on the sim source. Returns the
    CompletedProcess; with check, a non-zero exit fails the test and shows the output."""
    full_env = dict(os.environ)
    full_env.update(SIM_ENV)
    full_env.update(env or {})
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=full_env, capture_output=True, text=True, timeout=120,
    )
    if check and proc.returncode != 0:
        pytest.fail(f"subprocess failed ({proc.returncode}):\n--- stdout\n{proc.stdout}"
                    f"\n--- stderr\n{proc.stderr}", pytrace=False)
    return proc


@pytest.fixture
def run():
    return run_python
