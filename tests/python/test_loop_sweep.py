"""bench/loop_sweep.py on the host models: a training loop recorded on the card (ResNet-50,
data/recordings), repeated to 12 steps and scaled to five sizes, replayed through the
installed `vramkit` command with driver calls counted per step.

What each pool must do with it:
  - fixed segments (sim with VRAMKIT_LARGE_BLOCKS=fixed): every loop stops calling the
    driver within a few steps. The peak guard gives cached segments back before the
    high-water mark would rise, and without its memory of the sizes it gave back it did so
    in every step forever (ten calls a step on the card).
  - virtual memory (sim:vmm): no driver call from the third step, at most 1.02 over live.
  - large blocks virtual (sim, the default): as sim:vmm, and tighter than fixed segments
    on every loop.
"""

import functools
import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from test_cli import installed_script

SWEEP = Path(__file__).resolve().parents[2] / "bench" / "loop_sweep.py"
SCALES = "0.5,1.0,1.5,2.0,3.0"


@functools.lru_cache(maxsize=None)
def sweep(source: str, large_blocks: str = "fixed") -> tuple[list[dict], dict]:
    # The suite's own settings (a small sim device among them) are not this sweep's.
    env = {k: v for k, v in os.environ.items() if not k.startswith("VRAMKIT_")}
    env["VRAMKIT_LARGE_BLOCKS"] = large_blocks
    done = subprocess.run(
        [sys.executable, str(SWEEP), "--json", "--steps", "12", "--scales", SCALES,
         "--sources", source, "--tool", str(installed_script())],
        capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    return lines[:-1], lines[-1]


def test_fixed_segments_settle():
    loops, total = sweep("sim")
    assert len(loops) == 5
    for loop in loops:
        calls = loop["calls_by_step"]
        assert len(calls) == 12 and calls[0] > 0, loop
        assert loop["settled_at_step"] <= 8, loop
        assert loop["reserved_over_live"] <= 1.10, loop
    assert total["latest_settling_step"] <= 8


def test_virtual_memory_settles_by_the_third_step():
    loops, total = sweep("sim:vmm")
    for loop in loops:
        assert loop["calls_from_step_2"] == 0, loop
        assert loop["reserved_over_live"] <= 1.02, loop
    assert total["calls_from_step_2"] == 0


def test_large_blocks_virtual_fit_like_vmm():
    loops, _ = sweep("sim", "virtual")
    fixed, _ = sweep("sim")
    for loop, on_fixed in zip(loops, fixed):
        assert loop["scale"] == on_fixed["scale"]
        assert loop["calls_from_step_2"] == 0, loop
        assert loop["reserved_over_live"] <= 1.02, loop
        assert loop["reserved_over_live"] < on_fixed["reserved_over_live"], (loop, on_fixed)


def test_a_recording_that_is_not_a_loop_is_refused(tmp_path):
    broken = tmp_path / "short.trace.gz"
    with gzip.open(broken, "wt") as f:
        f.write("# vramkit-trace v1\na 0 1024 0 1\nf 0 0 2\n")
    done = subprocess.run([sys.executable, str(SWEEP), "--recording", str(broken),
                           "--tool", str(installed_script())],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "not a first step of 2016 ops" in done.stderr, done.stderr


def test_a_recording_replay_would_refuse_is_refused(tmp_path):
    # The bench reads through the library's trace reader: a NUL byte is an error, as in
    # replay, not a line cut short.
    broken = tmp_path / "nul.trace.gz"
    with gzip.open(broken, "wb") as f:
        f.write(b"# vramkit-trace v1\na 0 1024 0 1\x00 junk\nf 0 0 2\n")
    done = subprocess.run([sys.executable, str(SWEEP), "--recording", str(broken),
                           "--tool", str(installed_script())],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "nul.trace.gz:2: a NUL byte" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
