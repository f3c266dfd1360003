"""bench/preallocate_fit.py on sim (the host model): the vramkit half of issue 39's RMM table.
A pool that holds S from the start and may hold no more replays a two-stream trace with no
out-of-memory at the smallest S the script reports and runs out 1 MiB below it; the other
stream borrows from the preallocation rather than failing beside it."""

import json
import os
import subprocess
import sys
from pathlib import Path

import vramkit.cli

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "preallocate_fit.py"
TRACE = ROOT / "data" / "traces" / "stream_prefetch.trace.gz"


def _replay(size: int) -> dict:
    done = subprocess.run(
        [vramkit.cli.binary_path(), "replay", "--json", "--repeat", "1", "--source", "sim",
         "--capacity", str(size), str(TRACE)],
        env=dict(os.environ, VRAMKIT_PREALLOCATE=str(size)), capture_output=True, text=True)
    return json.loads(done.stdout.splitlines()[0])


def test_smallest_preallocation_is_where_the_trace_starts_to_fit():
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--source", "sim", "--repeat", "1", "--vramkit",
         vramkit.cli.binary_path(), str(TRACE)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    row = json.loads(done.stdout.splitlines()[0])
    assert row["allocator"] == "vramkit-preallocate" and row["trace"] == "stream_prefetch"
    live, smallest = row["peak_live_bytes"], row["min_size_bytes"]
    assert row["ooms"] == 0 and row["size_bytes"] >= 2 * live
    assert live < smallest < 2 * live
    at = _replay(smallest)
    assert at["ooms"] == 0 and at["device_calls"] == 1  # the preallocation, nothing after
    assert _replay(smallest - (1 << 20))["ooms"] > 0
    assert "| stream_prefetch |" in done.stdout


def test_a_bad_over_live_is_a_command_line_error():
    done = subprocess.run([sys.executable, str(SCRIPT), "--over-live", "0.5", str(TRACE)],
                          capture_output=True, text=True)
    assert done.returncode == 2 and "--over-live" in done.stderr
