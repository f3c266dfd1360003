"""The installed package as a type checker and a packager see it: one version everywhere, a
py.typed marker, and a stub of vramkit._core that declares exactly what the extension has.
"""

import ast
import importlib.metadata
import inspect
import pathlib
import re
import subprocess
import sys

import pytest

import vramkit
from vramkit import _core

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGE = pathlib.Path(vramkit.__file__).parent


def test_one_version_everywhere():
    """include/vramkit.h is the source; the extension, the wheel and CMake read it."""
    header = (ROOT / "include" / "vramkit.h").read_text()
    source = re.search(r'#define VRAMKIT_VERSION "([^"]+)"', header).group(1)
    assert vramkit.__version__ == source
    assert importlib.metadata.version("vramkit") == source
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert re.search(r'^dynamic = \["version"\]', pyproject, re.M)
    assert not re.search(r"^version\s*=", pyproject, re.M)
    cmake = (ROOT / "CMakeLists.txt").read_text()
    assert re.search(r"project\(vramkit VERSION \$\{VRAMKIT_VERSION\}", cmake)


def test_metadata_has_license_and_extras():
    meta = importlib.metadata.metadata("vramkit")
    assert meta["License-Expression"] == "MIT"
    assert set(meta.get_all("Provides-Extra")) >= {"torch", "cupy", "numba", "test"}
    requires = importlib.metadata.requires("vramkit")
    assert 'cupy-cuda12x; extra == "cupy"' in requires


def test_package_is_typed():
    assert (PACKAGE / "py.typed").is_file()
    assert (PACKAGE / "_core.pyi").is_file()


def _stub_names() -> set[str]:
    tree = ast.parse((PACKAGE / "_core.pyi").read_text())
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return {n for n in names if not n.startswith("_")}


def test_stub_declares_every_export_and_nothing_else():
    exported = {n for n in dir(_core) if not n.startswith("_")}
    assert _stub_names() == exported


def test_stub_signatures_match_the_extension():
    """Each function's parameters in the stub are those of its docstring signature."""
    tree = ast.parse((PACKAGE / "_core.pyi").read_text())
    for node in tree.body:
        if not isinstance(node, ast.FunctionDef):
            continue
        runtime = inspect.signature(getattr(_core, node.name))
        args = node.args
        stub = [a.arg for a in args.posonlyargs + args.args]
        assert stub == list(runtime.parameters), node.name


def test_stub_passes_stubtest():
    """mypy's stubtest compares the stub with the extension it describes, type by type."""
    pytest.importorskip("mypy.stubtest")
    proc = subprocess.run([sys.executable, "-m", "mypy.stubtest", "vramkit._core"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_backend_parts_are_installed_and_keyed():
    """Every file torch_backend.cpp includes from the package is installed beside it and is
    in _BACKEND_PARTS, whose contents key the cached build: a changed part rebuilds."""
    from vramkit.plug import _torch_build

    source = (PACKAGE / "plug" / _torch_build._BACKEND_SOURCE_NAME).read_text()
    included = set(re.findall(r'^#include "(torch_backend_[a-z_]+\.hpp)"', source, re.M))
    assert included == set(_torch_build._BACKEND_PARTS)
    for part in _torch_build._BACKEND_PARTS:
        assert (PACKAGE / "plug" / part).is_file(), part
