"""The package's layout by what users do (plug/, observe/, plan/, plot/, cli/) under the
names users and the docs know: each public name is the very module of its new home, found
only when named, so that `import vramkit` still imports no framework.
"""

import importlib
import subprocess
import sys

import pytest

import vramkit

# The public name, and the home that the package's alias table gives it.
PUBLIC_NAMES = {
    "vramkit.torch": "vramkit.plug.torch",
    "vramkit.cupy": "vramkit.plug.cupy",
    "vramkit.numba": "vramkit.plug.numba",
    "vramkit.dask": "vramkit.plug.dask",
    "vramkit.integrations": "vramkit.plug.integrations",
    "vramkit.integrations.hf": "vramkit.plug.integrations.hf",
    "vramkit.integrations.lightning": "vramkit.plug.integrations.lightning",
    "vramkit.history": "vramkit.observe.history",
    "vramkit.leaks": "vramkit.observe.leaks",
    "vramkit.logger": "vramkit.observe.logger",
    "vramkit.records": "vramkit.observe.records",
    "vramkit.top": "vramkit.observe.top",
    "vramkit.export": "vramkit.observe.export",
    "vramkit.prometheus": "vramkit.observe.prometheus",
    "vramkit.distributed": "vramkit.observe.distributed",
    "vramkit.estimator": "vramkit.plan.estimator",
    "vramkit.estimator.workspace_table": "vramkit.plan.estimator.workspace_table",
    "vramkit.doctor": "vramkit.plan.doctor",
    "vramkit.cli": "vramkit.cli",
    "vramkit.plot": "vramkit.plot",
}
# Those that import an optional framework when imported.
NEEDS = {"vramkit.torch": "torch", "vramkit.cupy": "cupy", "vramkit.numba": "numba",
         "vramkit.dask": "distributed",
         "vramkit.integrations.hf": "transformers",
         "vramkit.integrations.lightning": "lightning"}


def _fresh(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)


@pytest.mark.parametrize("public", sorted(PUBLIC_NAMES))
def test_public_name_is_its_home(public):
    """Imported by its public name in a fresh interpreter, a module is the same object as its
    home, named (__name__, __spec__) by its home, and reachable as an attribute."""
    home = PUBLIC_NAMES[public]
    if public in NEEDS:
        pytest.importorskip(NEEDS[public])
    result = _fresh(
        f"import importlib, sys\n"
        f"import {public} as by_public\n"
        f"import {home} as by_home\n"
        f"assert by_public is by_home, (by_public, by_home)\n"
        f"assert by_public.__name__ == {home!r}, by_public.__name__\n"
        f"assert by_public.__spec__.name == {home!r}, by_public.__spec__.name\n"
        f"assert sys.modules[{public!r}] is by_home\n"
        f"parent, _, leaf = {public!r}.rpartition('.')\n"
        f"assert getattr(importlib.import_module(parent), leaf) is by_home\n")
    assert result.returncode == 0, result.stderr


def test_from_imports_of_public_names():
    from vramkit.doctor import diagnose
    from vramkit.estimator import estimate
    from vramkit.history import snapshot
    from vramkit.plan.doctor import diagnose as home_diagnose
    from vramkit.plan.estimator import estimate as home_estimate

    assert estimate is home_estimate and diagnose is home_diagnose
    assert vramkit.estimate is estimate and vramkit.snapshot is snapshot


def test_import_vramkit_imports_no_framework():
    result = _fresh("import sys, vramkit\n"
                    "print(sorted(m for m in ('torch', 'cupy', 'numba', 'transformers', "
                    "'lightning', 'prometheus_client') if m in sys.modules))\n"
                    "print(sorted(m for m in sys.modules if m.startswith('vramkit.')))")
    assert result.returncode == 0, result.stderr
    frameworks, loaded = result.stdout.splitlines()
    assert frameworks == "[]"
    assert "vramkit.plug.torch" not in loaded and "vramkit.observe.history" not in loaded


def test_unknown_names_stay_unknown():
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("vramkit.no_such_module")
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("vramkit.history.no_such_module")


def test_run_by_public_name():
    """`python -m vramkit.NAME` (as the docs write it) runs the home as __main__."""
    result = subprocess.run([sys.executable, "-m", "vramkit.estimator.workspace_table", "--help"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: python -m vramkit.estimator.workspace_table")
    result = subprocess.run([sys.executable, "-m", "vramkit.torch", "--help"],
                            capture_output=True, text=True, timeout=120)
    if "needs PyTorch" not in result.stderr:
        assert result.stdout.startswith("usage: python -m vramkit.torch build"), result.stderr


LIBRARY_PACKAGES = ("plug", "observe", "plan", "plot")


@pytest.mark.parametrize("package", [*LIBRARY_PACKAGES, "cli", "plan.estimator",
                                     "plug.integrations"])
def test_each_subpackage_imports_alone(package):
    """No import circle: each subpackage imports first in a fresh interpreter."""
    result = _fresh(f"import vramkit.{package}")
    assert result.returncode == 0, result.stderr


def _imported_modules(path, package: str):
    """The absolute names of the modules a source file imports (relative ones resolved)."""
    import ast

    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                anchor = ".".join(parts[:len(parts) - node.level + 1])
                base = f"{anchor}.{base}" if base else anchor
            yield base
            yield from (f"{base}.{alias.name}" for alias in node.names)


def test_the_library_never_imports_the_command_line():
    """plug/, observe/, plan/ and plot/ are what the command line calls; none of them calls
    back into vramkit.cli, so that the command line sits on top and no circle forms."""
    import pathlib

    root = pathlib.Path(vramkit.__file__).parent
    checked = 0
    for top in LIBRARY_PACKAGES:
        for path in sorted((root / top).rglob("*.py")):
            relative = path.relative_to(root.parent).with_suffix("")
            parts = relative.parts[:-1] if relative.name == "__init__" else relative.parts
            package = ".".join(parts if relative.name == "__init__" else parts[:-1])
            names = set(_imported_modules(path, package))
            assert not any(n == "vramkit.cli" or n.startswith("vramkit.cli.") for n in names), \
                (path, sorted(n for n in names if "cli" in n))
            checked += 1
    assert checked > 40
