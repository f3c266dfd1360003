"""vramkit.plug._torch_build: build, once, the libraries through which PyTorch allocates.

Two C++ libraries must be compiled against the PyTorch in use, whose C++ ABI and c10
library a wheel built for no particular torch cannot know:
- the complete backend (torch_backend.cpp), a subclass of c10's CUDAAllocator that
  vramkit.torch.install() makes PyTorch's allocator; it needs torch's headers and
  libraries and the CUDA runtime's headers (torch's wheel or a CUDA toolkit);
- the fallback's alloc function (torch_oom.cpp) for CUDAPluggableAllocator, which does not
  check what an alloc function returns: only a c10 exception becomes a Python exception.
The first install() compiles what it uses (seconds, one C++ compiler run) and keeps the
result in a cache keyed by everything the build depends on; later runs, other ranks and
other processes find it there.

Where it goes: $VRAMKIT_CACHE_DIR, else $XDG_CACHE_HOME/vramkit, else ~/.cache/vramkit.
Which compiler: $CXX, else c++, g++ or clang++ from the PATH. Without one, install()
refuses with BuildError, and PyTorch keeps its own allocator: vramkit never falls back to
an alloc function that could hand PyTorch a NULL pointer. Libraries built elsewhere (say,
in a container image that has a compiler, by ``python -m vramkit.torch build``) are used
as they are when $VRAMKIT_TORCH_BACKEND_LIB (the backend) or $VRAMKIT_TORCH_HOOKS (the
fallback) names them.
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
    """The vramkit package's folder, where the build installs the C hooks and the header."""
    return os.path.dirname(source_dir())


def source_dir() -> str:
    """plug/, where the C++ sources compiled here travel, beside this module."""
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
    compiler = _require_compiler(compiler)
    source = os.path.join(source_dir(), _SOURCE_NAME)
    hooks_dir = os.path.dirname(c_hooks_path())
    command = lambda output: build_command(compiler, source, output, include_dir, lib_dir, abi,
                                           hooks_dir)
    return _compile_cached(source, "libvramkit_torch_oom",
                           [_BUILD_RECIPE, compiler, include_dir, lib_dir, str(abi), hooks_dir],
                           command, directory)


def _require_compiler(compiler: str | None) -> str:
    compiler = compiler or find_compiler()
    if compiler is None:
        raise BuildError(
            "vramkit needs a C++ compiler once, to build the library through which PyTorch "
            "allocates (it raises torch.OutOfMemoryError when memory runs out); none was "
            f"found (CXX={os.environ.get('CXX', '')!r}, else c++, g++, clang++ on the PATH). "
            "Install one (Debian/Ubuntu: apt-get install "
            "g++), or set VRAMKIT_TORCH_BACKEND_LIB (the backend) or VRAMKIT_TORCH_HOOKS (the "
            "fallback) to the libraries `python -m vramkit.torch build` builds where a "
            "compiler exists.")
    return compiler


def _compile_cached(source: str, prefix: str, key_parts: list[str], command_for,
                    directory: str | None) -> str:
    """Run command_for(output) once per key into the cache and return the library's path."""
    key = _cache_key(key_parts, source)
    directory = directory or cache_dir()
    target = os.path.join(directory, f"{prefix}-{key}.so")
    if os.path.exists(target):
        return target
    os.makedirs(directory, exist_ok=True)
    # Build beside the target and rename: ranks of one job may build at the same moment,
    # and none may load a half-written file.
    fd, partial = tempfile.mkstemp(prefix=".build-", suffix=".so", dir=directory)
    os.close(fd)
    command = command_for(partial)
    try:
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            raise BuildError(
                f"vramkit could not build its PyTorch library {prefix} (exit "
                f"{done.returncode}):\n$ {' '.join(command)}\n{done.stderr.strip()[-4000:]}")
        os.replace(partial, target)
    finally:
        if os.path.exists(partial):
            os.unlink(partial)
    return target


# ---- the complete backend (torch_backend.cpp) -------------------------------------------

_BACKEND_SOURCE_NAME = "torch_backend.cpp"
# Files torch_backend.cpp includes from the package: part of what a cached build depends on.
_BACKEND_PARTS = ("torch_backend_stats.hpp", "torch_backend_pools.hpp",
                  "torch_backend_history.hpp", "torch_backend_ipc.hpp", "torch_backend_oom.hpp",
                  "torch_backend_streams.hpp", "torch_backend_watchers.hpp")
_BACKEND_RECIPE = "2"


def cuda_runtime() -> tuple[str, str]:
    """(include dir, library path) of the CUDA runtime the installed torch loaded: the
    backend calls cudaMemcpyAsync and the IPC functions itself, and must use torch's copy.
    Read from the process's own mappings once torch is imported, so it is the very file."""
    import torch  # noqa: F401  (loads libc10_cuda and, through it, libcudart)

    library = None
    with open("/proc/self/maps") as maps:
        for line in maps:
            path = line.rstrip("\n").split(" ")[-1]
            if "/libcudart.so" in path:
                library = path
                break
    if library is None:
        raise BuildError("vramkit: this torch has no CUDA runtime loaded (a CPU-only build?)")
    # The wheel's own headers first (they match the runtime), where they are complete: some
    # images ship cuda_runtime_api.h without the crt/ headers cuda_runtime.h includes.
    candidates = [os.path.join(os.path.dirname(os.path.dirname(library)), "include")]
    for env in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(env):
            candidates.append(os.path.join(os.environ[env], "include"))
    candidates.append("/usr/local/cuda/include")
    for include in candidates:
        if all(os.path.isfile(os.path.join(include, name))
               for name in ("cuda_runtime_api.h", os.path.join("crt", "host_config.h"))):
            return include, library
    raise BuildError("vramkit: no complete CUDA runtime headers (cuda_runtime_api.h and "
                     f"crt/host_config.h) in {', '.join(candidates)}; set CUDA_HOME to a "
                     "CUDA toolkit")


def vramkit_include_dir() -> str:
    """include/vramkit.h as installed inside the package."""
    return os.path.join(package_dir(), "include")


def backend_command(compiler: str, source: str, output: str, include_dir: str, lib_dir: str,
                    abi: int, cuda_include: str, cudart: str, package: str,
                    vramkit_include: str) -> list[str]:
    """The backend's compiler run: c10 and c10_cuda for the interface, torch_cuda for
    changeCurrentAllocator, torch's CUDA runtime, and vramkit's two libraries."""
    return [
        compiler, "-O2", "-std=c++17", "-fPIC", "-shared", "-fvisibility=hidden",
        f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
        "-isystem", include_dir,
        "-isystem", os.path.join(include_dir, "torch", "csrc", "api", "include"),
        "-isystem", cuda_include, "-I", vramkit_include,
        source, "-o", output,
        f"-L{lib_dir}", "-lc10", "-lc10_cuda", "-ltorch_cuda", f"-Wl,-rpath,{lib_dir}",
        cudart, f"-Wl,-rpath,{os.path.dirname(cudart)}",
        f"-L{package}", "-l:" + _C_HOOKS_NAME, "-l:libvramkit.so", f"-Wl,-rpath,{package}",
    ]


def build_backend(compiler: str | None = None, directory: str | None = None) -> str:
    """Path of the complete backend for the installed torch, compiling it (once per torch,
    compiler and vramkit build) if the cache lacks it."""
    include_dir, lib_dir, abi = torch_paths()
    cuda_include, cudart = cuda_runtime()
    compiler = _require_compiler(compiler)
    source = os.path.join(source_dir(), _BACKEND_SOURCE_NAME)
    package = package_dir()
    vk_include = vramkit_include_dir()
    header = os.path.join(vk_include, "vramkit.h")
    if not os.path.isfile(header):
        raise BuildError(f"vramkit: {header} is missing; reinstall vramkit")
    digest = hashlib.sha256()
    for path in [header] + [os.path.join(source_dir(), part) for part in _BACKEND_PARTS]:
        with open(path, "rb") as f:
            digest.update(f.read())
    header_digest = digest.hexdigest()
    command = lambda output: backend_command(compiler, source, output, include_dir, lib_dir, abi,
                                             cuda_include, cudart, package, vk_include)
    return _compile_cached(source, "libvramkit_torch_backend",
                           [_BACKEND_RECIPE, compiler, include_dir, lib_dir, str(abi), cudart,
                            package, header_digest], command, directory)


def _prebuilt_or(variable: str, build_it) -> str:
    """The file $variable names (it must exist), else build_it()."""
    prebuilt = os.environ.get(variable)
    if prebuilt:
        if not os.path.isfile(prebuilt):
            raise BuildError(f"{variable}={prebuilt!r}: no such file")
        return prebuilt
    return build_it()


def backend_library() -> str:
    """The backend install() loads: $VRAMKIT_TORCH_BACKEND_LIB if set, else the cached
    build for the installed torch."""
    return _prebuilt_or("VRAMKIT_TORCH_BACKEND_LIB", build_backend)


def hook_library() -> str:
    """The fallback's library install() gives PyTorch: $VRAMKIT_TORCH_HOOKS if set, else the
    cached build for the installed torch."""
    return _prebuilt_or("VRAMKIT_TORCH_HOOKS", build)
