"""The examples of docs/python.md run as written, each in a fresh interpreter on sim.

Blocks after a `<!-- skip: ... -->` line need a GPU and a framework; the GPU check
(tests/python/gpu_check.py) covers those paths.
"""

import pathlib
import re

import pytest

DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "python.md"
BLOCK = re.compile(r"(?P<skip><!-- skip[^>]*-->\s*\n)?```python\n(?P<code>.*?)```", re.S)


def _blocks():
    text = DOC.read_text()
    out = []
    for i, m in enumerate(BLOCK.finditer(text)):
        line = text.count("\n", 0, m.start("code")) + 1
        marks = [pytest.mark.skip(reason="needs a GPU")] if m.group("skip") else []
        out.append(pytest.param(m.group("code"), id=f"line{line}", marks=marks))
    return out


def test_doc_has_examples():
    assert len(_blocks()) >= 6


@pytest.mark.parametrize("code", _blocks())
def test_doc_example(code, run):
    run(code, env={"VRAMKIT_SIM_CAPACITY": "2G"})
