"""The Python readers' fuzz target (tests/fuzz/fuzz_snapshot.py, atheris) over its corpus and
a bounded number of inputs it derives: every snapshot, log or trace a user hands `vramkit
plot` or `vramkit doctor` is read or refused with the documented error. The corpus holds the
inputs that once broke a reader (repeats by reference, NaN times, values of the wrong kind,
a pickle naming a global, sizes past 2^63). The C readers' targets run under ctest."""

import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_the_snapshot_readers_survive_their_fuzz_target(tmp_path):
    pytest.importorskip("atheris")
    found = tmp_path / "found"  # libFuzzer writes what it finds new into the first folder
    found.mkdir()
    done = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "fuzz" / "fuzz_snapshot.py"), "-runs=4000",
         "-max_len=65536", "-rss_limit_mb=4096", f"-artifact_prefix={tmp_path}/crash-",
         str(found), str(ROOT / "tests" / "fuzz" / "corpus" / "snapshot")],
        capture_output=True, text=True, timeout=600)
    crashes = list(tmp_path.glob("crash-*"))
    assert done.returncode == 0 and not crashes, done.stderr[-3000:]
    shutil.rmtree(found)
