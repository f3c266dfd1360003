"""The GPU tests' child scripts compile. tests/gpu runs each test's code in a fresh
interpreter on the card (conftest.py's gpu_run: every part dedented on its own, then
joined), and runs only where a GPU is: a script that does not compile would first fail
there, costing a device call. Every gpu_run call whose parts are string literals (f-strings
and module-level names of literals too) is joined as gpu_run joins it and compiled here."""

from __future__ import annotations

import ast
import pathlib
import textwrap

import pytest

GPU_TESTS = sorted((pathlib.Path(__file__).resolve().parent.parent / "gpu").glob("test_*.py"))


def _text(arg, constants: dict):
    """A part's code: a string literal, an f-string (each replacement field stands in as a
    name, which compiles wherever a value or a word inside quotes does), or a module-level
    name bound to a literal, each maybe with .replace() calls filling placeholders (the
    placeholders are names, so the literal compiles as it is); None else."""
    while (isinstance(arg, ast.Call) and isinstance(arg.func, ast.Attribute)
           and arg.func.attr == "replace"):
        arg = arg.func.value
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return arg.value
    if isinstance(arg, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "field"
                       for v in arg.values)
    if isinstance(arg, ast.Name):
        return constants.get(arg.id)
    return None


def _scripts(path: pathlib.Path):
    tree = ast.parse(path.read_text(), str(path))
    constants = {target.id: node.value.value for node in tree.body
                 if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
                 and isinstance(node.value.value, str)
                 for target in node.targets if isinstance(target, ast.Name)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "gpu_run":
            parts = [_text(arg, constants) for arg in node.args]
            if parts and None not in parts:
                yield node.lineno, "\n".join(textwrap.dedent(p) for p in parts)


@pytest.mark.parametrize("path", GPU_TESTS, ids=lambda p: p.name)
def test_every_gpu_script_compiles(path):
    scripts = list(_scripts(path))
    assert scripts, f"{path.name}: no gpu_run call with literal code found"
    for line, code in scripts:
        try:
            compile(code, f"{path.name}:{line}", "exec")
        except SyntaxError as error:
            pytest.fail(f"{path.name}, the gpu_run call at line {line}: {error}")
