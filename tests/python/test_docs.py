"""The Python examples of docs/python.md and of the README run as written, each in a fresh
interpreter on sim.

Blocks after a `<!-- skip: ... -->` line need a GPU and a framework; the GPU check
(tests/python/gpu_check.py) covers those paths.
"""

import pathlib
import re

import pytest

from helpers import run_python

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOCS = (ROOT / "docs" / "python.md", ROOT / "README.md")
BLOCK = re.compile(r"(?P<skip><!-- skip[^>]*-->\s*\n)?```python\n(?P<code>.*?)```", re.S)


def _blocks(doc=None):
    out = []
    for path in (doc,) if doc else DOCS:
        text = path.read_text()
        for m in BLOCK.finditer(text):
            line = text.count("\n", 0, m.start("code")) + 1
            marks = [pytest.mark.skip(reason="needs a GPU")] if m.group("skip") else []
            out.append(pytest.param(m.group("code"), id=f"{path.name}:{line}", marks=marks))
    return out


def test_doc_has_examples():
    assert len(_blocks(DOCS[0])) >= 6
    assert len(_blocks(DOCS[1])) >= 2


@pytest.mark.parametrize("code", _blocks())
def test_doc_example(code, tmp_path):
    # In a directory of its own: examples write files (snapshots, logs) where they run.
    run_python(code, env={"VRAMKIT_SIM_CAPACITY": "2G"}, cwd=tmp_path)
