"""pytest set-up of the Python tests: every pool is a sim pool.

The default pools are process-wide and created on first use from VRAMKIT_* variables, so
the variables are set here, before any test imports vramkit. Tests that need fresh pools
(exact numbers, configure, preallocation) run their body in a subprocess through the `run`
fixture; the shared pieces live in helpers.py.
"""

import os

import pytest

from helpers import OTHER_OPTIONS, SIM_ENV, run_python

os.environ.update(SIM_ENV)
for _name in OTHER_OPTIONS:
    os.environ.pop(_name, None)


@pytest.fixture
def run():
    return run_python
