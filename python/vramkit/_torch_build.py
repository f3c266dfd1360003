"""vramkit._torch_build: build, once, the library through which PyTorch allocates.

PyTorch's CUDAPluggableAllocator takes any alloc function, but it does not check what the
function returns: only a C++ exception of c10's own types becomes a Python exception. The
function that throws one (torch_oom.cpp) must be compiled against the PyTorch in use, whose
C++ ABI and c10 library a wheel built for no particular torch cannot know. So the first
vramkit.torch.install() compiles it (a few seconds, one C++ compiler run) and keeps the
result in a cache keyed by everything the build depends on; later runs, other ranks and
other processes find it there.

Where it goes: $VRAMKIT_CACHE_DIR, else $XDG_CACHE_HOME/vramkit, else ~/.cache/vramkit.
Which compiler: $CXX, else c++, g++ or clang++ from the PATH. Without one, install()
refuses with BuildError, and PyTorch keeps its own allocator: vramkit never falls back to
an alloc function that could hand PyTorch a NULL pointer. A library built elsewhere (say,
in a container image that has a compiler, by ``python -m vramkit.torch build``) is used
as it is when $VRAMKIT_TORCH_HOOKS names it.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile

_SOURCE_NAME = "torch_oom.cpp"
_C_HOOKS_NAME = "libvramkit_torch.so"
# Bump when the build command changes in a way the key below would not notice.
_BUILD_RECIPE = "1"


class BuildError(RuntimeError):
    """The PyTorch hook library could not be built (no compiler, or the compile failed)."""


def package_dir() -> str:
    return os.path.dirname(os.path.abspath(__file__))


def c_hooks_path() -> str:
    """libvramkit_torch.so: the C side of the hooks, built with the package."""
    return os.path.join(package_dir(), _C_HOOKS_NAME)


def cache_dir() -> str:
    explicit = os.environ.get("VRAMKIT_CACHE_DIR")
    if explicit:
        return explicit
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "vramkit")


def find_compiler() -> str | None:
    """The C++ compiler to use: $CXX, else the first of c++, g++, clang++ on the PATH."""
    explicit = os.environ.get("CXX")
    if explicit:
        return shutil.which(explicit)
    for name in ("c++", "g++", "clang++"):
        found = shutil.which(name)
        if found:
            return found
    return None


def torch_paths() -> tuple[str, str, int]:
    """(include dir, library dir, _GLIBCXX_USE_CXX11_ABI) of the installed torch. Read from
    the package itself rather than torch.utils.cpp_extension, whose import costs seconds."""
    import torch

    root = os.path.dirname(os.path.abspath(torch.__file__))
    abi = int(bool(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", True)))
    return os.path.join(root, "include"), os.path.join(root, "lib"), abi


def build_command(compiler: str, source: str, output: str, include_dir: str, lib_dir: str,
                  abi: int, c_hooks_dir: str) -> list[str]:
    """The one compiler run: a shared library exporting vramkit_torch_malloc and
    vramkit_torch_free_block, linked to c10 and to libvramkit_torch, both found again at
    load time through their absolute paths (rpath)."""
    return [
        compiler, "-O2", "-std=c++17", "-fPIC", "-shared", "-fvisibility=hidden",
        f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
        "-isystem", include_dir,
        source, "-o", output,
        f"-L{lib_dir}", "-lc10", f"-Wl,-rpath,{lib_dir}",
        f"-L{c_hooks_dir}", "-l:" + _C_HOOKS_NAME, f"-Wl,-rpath,{c_hooks_dir}",
    ]


def _cache_key(parts: list[str], source: str) -> str:
    digest = hashlib.sha256()
    with open(source, "rb") as f:
        digest.update(f.read())
    for part in parts:
        digest.update(b"\0" + part.encode())
    return digest.hexdigest()[:20]


def build(include_dir: str | None = None, lib_dir: str | None = None, abi: int | None = None,
          compiler: str | None = None, directory: str | None = None) -> str:
    """Path of the hook library for this torch, compiling it first if the cache lacks it.
    The arguments default to the installed torch, the compiler found and the cache dir."""
    if include_dir is None or lib_dir is None or abi is None:
        t_include, t_lib, t_abi = torch_paths()
        include_dir = t_include if include_dir is None else include_dir
        lib_dir = t_lib if lib_dir is None else lib_dir
        abi = t_abi if abi is None else abi
    compiler = compiler or find_compiler()
    if compiler is None:
        raise BuildError(
            "vramkit needs a C++ compiler once, to build the library through which PyTorch "
            "allocates (it raises torch.OutOfMemoryError when memory runs out); none was "
            f"found (CXX={os.environ.get('CXX', '')!r}, else c++, g++, clang++ on the PATH). "
            "Install one (Debian/Ubuntu: apt-get install "
            "g++), or set VRAMKIT_TORCH_HOOKS to a library built by `python -m vramkit.torch "
            "build` where a compiler exists.")
    source = os.path.join(package_dir(), _SOURCE_NAME)
    hooks_dir = os.path.dirname(c_hooks_path())
    key = _cache_key([_BUILD_RECIPE, compiler, include_dir, lib_dir, str(abi), hooks_dir], source)
    directory = directory or cache_dir()
    target = os.path.join(directory, f"libvramkit_torch_oom-{key}.so")
    if os.path.exists(target):
        return target
    os.makedirs(directory, exist_ok=True)
    # Build beside the target and rename: ranks of one job may build at the same moment,
    # and none may load a half-written file.
    fd, partial = tempfile.mkstemp(prefix=".build-", suffix=".so", dir=directory)
    os.close(fd)
    command = build_command(compiler, source, partial, include_dir, lib_dir, abi, hooks_dir)
    try:
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            raise BuildError(
                f"vramkit could not build its PyTorch hook library (exit {done.returncode}):"
                f"\n$ {' '.join(command)}\n{done.stderr.strip()[-4000:]}")
        os.replace(partial, target)
    finally:
        if os.path.exists(partial):
            os.unlink(partial)
    return target


def hook_library() -> str:
    """The library install() gives PyTorch: $VRAMKIT_TORCH_HOOKS if set, else the cached
    build for the installed torch."""
    prebuilt = os.environ.get("VRAMKIT_TORCH_HOOKS")
    if prebuilt:
        if not os.path.isfile(prebuilt):
            raise BuildError(f"VRAMKIT_TORCH_HOOKS={prebuilt!r}: no such file")
        return prebuilt
    return build()
