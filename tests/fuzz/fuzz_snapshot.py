"""fuzz_snapshot.py - the readers `vramkit plot` and `vramkit doctor` feed files to, under
atheris (coverage-guided, libFuzzer's engine for Python): whatever the bytes, a snapshot
pickle, a JSON snapshot, a MemoryLogger log or a trace is read or refused with the
documented PlotInputError, never another exception, and a pickle never names a global.

    python tests/fuzz/fuzz_snapshot.py -runs=N CORPUS_DIR...   (libFuzzer's flags)

tests/python/test_fuzz.py runs it for a bounded number of inputs over corpus/snapshot/.
"""

import os
import sys
import tempfile

import atheris

with atheris.instrument_imports():
    from vramkit.plot import _read, load

# Small enough that a compressed bomb in the corpus costs little: refusing is the point.
MAX_OPS = 20_000

_FOLDER = tempfile.mkdtemp(prefix="vramkit-fuzz-snapshot-")
_PATH = os.path.join(_FOLDER, "input")


def one_input(data: bytes) -> None:
    with open(_PATH, "wb") as f:
        f.write(data)
    try:
        load(_PATH, None, MAX_OPS)
    except _read.PlotInputError as error:
        if _PATH not in str(error):
            raise AssertionError(f"a refusal that does not name the file: {error}") from None


if __name__ == "__main__":
    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()
