"""bench/host_model_table.py, the reserved table of issue 37 on the host models: a
recorded training loop replayed through the installed `vramkit` command and the
estimator's models of PyTorch's allocator, each row's figures checked against the replay
itself; and the last whole step found where a trace repeats."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from test_cli import installed_script

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "host_model_table.py"

pytest.importorskip("torch")  # the estimator's models of PyTorch's allocator


def _module():
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import host_model_table
    finally:
        sys.path.remove(str(SCRIPT.parent))
    return host_model_table


def test_the_last_whole_step_is_the_last_repeating_period():
    table = _module()
    setup = [("a", i, 4096 * (i + 1), 0) for i in range(5)]
    # A step of five ops that ends in an allocation (trailing frees are the teardown).
    step = [("a", 100, 1 << 20, 0), ("a", 101, 2 << 20, 0), ("f", 100, 0),
            ("f", 101, 0), ("a", 102, 3 << 20, 0)]
    one = len(step)
    # Many steps: the search ignores periods under 64 ops.
    ops = setup + step * 40
    teardown = [("f", i, 0) for i in range(5)] + [("f", 102, 0)]
    start, end = table.last_step(ops + teardown)
    assert end == len(ops) and (end - start) % one == 0 and end - start >= 64
    assert table.last_step([("a", i, 512 * (i + 1), 0) for i in range(300)]) is None


def test_a_recorded_loop_against_pytorchs_models():
    env = {k: v for k, v in os.environ.items() if not k.startswith("VRAMKIT_")}
    trace = ROOT / "data" / "recordings" / "gpt2_4l_train.trace.gz"
    done = subprocess.run([sys.executable, str(SCRIPT), "--json", "--tool",
                           str(installed_script()), str(trace)],
                          capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    (row,) = [json.loads(line) for line in done.stdout.splitlines()]
    assert row["trace"] == "gpt2_4l_train"
    replay = subprocess.run([str(installed_script()), "replay", "--json", "--repeat", "1",
                             "--source", "sim", str(trace)],
                            capture_output=True, text=True, env=env, timeout=120)
    measured = json.loads(replay.stdout.splitlines()[-1])
    assert row["peak_live"] == measured["peak_live_bytes"]
    assert row["vramkit"] == round(measured["peak_reserved_bytes"] / measured["peak_live_bytes"], 4)
    assert row["vramkit_calls"] == measured["device_calls"]
    assert row["vramkit_last_step_calls"] == 0          # a loop settled by its last step
    # Every pool holds at least what is live; PyTorch's native segments hold more here.
    assert 1.0 <= row["vramkit"] < row["pytorch"]
    assert row["expandable"] >= 1.0
