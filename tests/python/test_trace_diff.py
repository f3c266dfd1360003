"""bench/trace_diff.py: two traces of one step compared by the order of their blocks."""

import gzip
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "trace_diff.py"


def _trace(path, lines):
    with gzip.open(path, "wt") as out:
        out.write("# vramkit-trace v1 test\n")
        out.writelines(line + "\n" for line in lines)
    return str(path)


def test_the_same_blocks_in_another_order_are_one_difference_each_way(tmp_path):
    # Real: an op's output, its workspace, then the next output; estimated: both outputs
    # first, the workspace after. Ids differ between the two, as between two runs.
    real = _trace(tmp_path / "real.trace.gz", [
        "a 1 4096 0 0", "a 2 65536 0 1", "f 2 0 2", "a 3 8192 0 3", "f 1 0 4", "f 3 0 5"])
    estimated = _trace(tmp_path / "est.trace.gz", [
        "a 7 4096 0 0", "a 8 8192 0 1", "a 9 65536 0 2", "f 9 0 3", "f 7 0 4", "f 8 0 5"])
    same = subprocess.run([sys.executable, str(SCRIPT), real, real, "--json"],
                          capture_output=True, text=True, check=True)
    assert '"differences": 0' in same.stdout
    done = subprocess.run([sys.executable, str(SCRIPT), real, estimated, "--show", "5"],
                          capture_output=True, text=True, check=True)
    head, *shown = done.stdout.splitlines()
    assert head.startswith("2 differences; 6 ops in")
    assert any("a 8192" in line for line in shown)
