"""The Python examples of docs/python.md and of the README run as written, each in a fresh
interpreter on sim, and print what their comments say they print.

A comment of the form `print(...)  # -> TEXT` is a claim about the output: the example is
run with that print checked against TEXT, where `...` stands for any text and `<file>` for
a file's path. Other comments describe and are not checked. Blocks after a
`<!-- skip: ... -->` line need a GPU and a framework; the GPU check
(tests/python/gpu_check.py) covers those paths.
"""

import pathlib
import re

import pytest

from helpers import run_python

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOCS = (ROOT / "docs" / "python.md", ROOT / "README.md")
BLOCK = re.compile(r"(?P<skip><!-- skip[^>]*-->\s*\n)?```python\n(?P<code>.*?)```", re.S)
CLAIM = re.compile(r"^(?P<indent>\s*)print\((?P<args>.*)\)\s*# -> (?P<text>.*?)\s*$")

# Defined in each checked example: prints as print() does, then holds the text to its claim.
EXPECT = """
def __vramkit_doc_expect(line, claim, *args, **kwargs):
    import io, re
    out = io.StringIO()
    print(*args, **kwargs, file=out)
    text = out.getvalue()
    print(text, end="")
    parts = [re.escape(part).replace("<file>", "\\S+") for part in claim.split("...")]
    if not re.fullmatch(".*?".join(parts), text.rstrip("\\n"), re.S):
        raise AssertionError(f"line {line} of the example prints {text!r}, its comment says {claim!r}")
"""


def checked(code: str) -> str:
    """The example with each claimed print replaced by a print that checks its claim."""
    lines = code.split("\n")
    for number, line in enumerate(lines, 1):
        m = CLAIM.match(line)
        if m:
            lines[number - 1] = (f"{m['indent']}__vramkit_doc_expect({number}, {m['text']!r}, "
                                 f"{m['args']})")
    # The helper goes on the first line, so that the example's line numbers (which its
    # output may show, as a leak's call site) stay those of the docs.
    lines[0] = f"exec({EXPECT!r}); {lines[0]}"
    return "\n".join(lines)


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
    run_python(checked(code), env={"VRAMKIT_SIM_CAPACITY": "2G"}, cwd=tmp_path)


def test_claims_are_checked():
    # A claim that does not hold fails its example; `...` and `<file>` are the only wildcards.
    run_python(checked("print(1 + 1)  # -> 2\nprint('a/b.py:4:f x')  # -> <file>:4:f ..."))
    failed = run_python(checked("print(1 == 2)  # -> True"), check=False)
    assert failed.returncode != 0
    assert "line 1 of the example prints 'False\\n', its comment says 'True'" in failed.stderr


def test_the_readme_c_quick_start_is_the_compiled_example():
    # The README shows examples/quickstart.c, which make test compiles and runs: what a
    # reader copies compiles as shown.
    readme = (ROOT / "README.md").read_text()
    shown = re.search(r"```c\n(.*?)```", readme, re.S).group(1)
    example = (ROOT / "examples" / "quickstart.c").read_text()
    assert shown.strip() == example[example.index("#include <stdio.h>"):].strip()
