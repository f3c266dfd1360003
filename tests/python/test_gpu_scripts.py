"""The GPU tests' child scripts compile. tests/gpu runs each test's code in a fresh
interpreter on the card (conftest.py's gpu_run: every part dedented on its own, then
joined), and runs only where a GPU is: a script that does not compile would first fail
there, costing a device call. Every gpu_run call whose parts are string literals (f-strings
and module-level names of literals too, conftest.py's among them) is joined as gpu_run joins
it and compiled here, and so is every body given to conftest.py's `run` fixture, after the
prelude it runs first."""

from __future__ import annotations

import ast
import pathlib
import textwrap

import pytest

GPU_DIR = pathlib.Path(__file__).resolve().parent.parent / "gpu"
GPU_TESTS = sorted(GPU_DIR.glob("test_*.py"))


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


def _constants(tree) -> dict:
    """The module-level names bound to string literals."""
    return {target.id: node.value.value for node in tree.body
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
            for target in node.targets if isinstance(target, ast.Name)}


def _scripts(path: pathlib.Path):
    tree = ast.parse(path.read_text(), str(path))
    shared = _constants(ast.parse((GPU_DIR / "conftest.py").read_text()))
    constants = dict(shared)
    for node in tree.body:  # from conftest import NAME [as ALIAS]
        if isinstance(node, ast.ImportFrom) and node.module == "conftest":
            for alias in node.names:
                if alias.name in shared:
                    constants[alias.asname or alias.name] = shared[alias.name]
    constants.update(_constants(tree))
    for node in ast.walk(tree):
        called = getattr(node.func, "id", None) if isinstance(node, ast.Call) else None
        if called == "gpu_run":
            parts = [_text(arg, constants) for arg in node.args]
        elif called == "run" and node.args:  # the fixture: its prelude, then the body
            parts = [shared.get("TORCH_PRELUDE"), _text(node.args[0], constants)]
        else:
            continue
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
