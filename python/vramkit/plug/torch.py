"""vramkit.torch: make vramkit PyTorch's CUDA allocator.

    import vramkit.torch
    vramkit.torch.install()          # before PyTorch allocates any CUDA memory

vramkit then is PyTorch's CUDA allocator backend, in the place of PyTorch's own caching
allocator (torch_backend.cpp, c10's CUDAAllocator interface): everything PyTorch does with
its allocator reaches vramkit. CUDA graphs get private pools (torch.cuda.graph, graph trees,
torch.compile(mode="reduce-overhead"), torch.cuda.MemPool); torch.cuda.memory_stats(),
memory_allocated(), max_memory_allocated(), memory_summary() and reset_peak_memory_stats()
report vramkit's figures; torch.cuda.memory._record_memory_history() and _snapshot() record
and describe vramkit's pools in PyTorch's format; the profiler sees memory events;
empty_cache(), set_per_process_memory_fraction(), record_stream() and torch.multiprocessing's
CUDA sharing (on the "cuda" source) work. vramkit.memory_stats() sees the same default
pools.

Where the backend cannot be built (no CUDA runtime headers, say), or with
install(backend="pluggable") or VRAMKIT_TORCH_BACKEND=pluggable, install() falls back to
torch.cuda.memory.CUDAPluggableAllocator: allocation, frees, streams, empty_cache and the
memory fraction work, PyTorch's own memory tools and graph pools do not. install() returns
which path it took ("backend" or "pluggable"); backend() says it later.

An allocation that cannot be served raises torch.OutOfMemoryError, as PyTorch's own
allocator does: its message starts "CUDA out of memory." and carries vramkit's report, and
the process and its CUDA context go on (free something and allocate again). Inside
``with vramkit.torch.oom_report():`` the exception also gains a ``.report`` attribute.
The backend (and the fallback's alloc function) is C++ built against the installed torch:
install() builds it once with the C++ compiler it finds and caches it (vramkit.plug._torch_build
says where and how; ``python -m vramkit.torch build`` builds both ahead, for images without
a compiler).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import warnings

try:
    import torch
except ImportError as _exc:  # say what to install rather than "No module named torch"
    raise ImportError("vramkit.torch needs PyTorch: pip install torch "
                      "(or pip install 'vramkit[torch]')") from _exc

import vramkit

from . import _torch_build
from . import torch_settings

_hooks = None  # ctypes.CDLL of libvramkit_torch once installed
_allocator = None  # what PyTorch allocates through, kept alive for the life of the process
_backend_lib = None  # ctypes.CDLL of the complete backend, when that path was taken
_path = None  # "backend" or "pluggable"
_capture_reuse = False  # graph_capture_record_stream_reuse, as last handed to the backend
_PATHS = ("backend", "pluggable")


def library_path() -> str:
    """Path of the shared library holding the C side of the allocator hooks."""
    return _torch_build.c_hooks_path()


def _fn_addr(lib, name: str) -> int:
    return ctypes.cast(getattr(lib, name), ctypes.c_void_p).value


def installed() -> bool:
    """True once install() has made vramkit PyTorch's allocator."""
    return _allocator is not None


def capture_reuse() -> bool:
    """Whether the backend reuses, inside a CUDA graph's capture, a block freed there after
    use on other streams (graph_capture_record_stream_reuse)."""
    return _capture_reuse


def _set_capture_reuse(on: bool) -> None:
    global _capture_reuse
    _backend_lib.vramkit_torch_backend_set_capture_reuse(int(on))
    _capture_reuse = bool(on)


def _refuse_if_cuda_in_use() -> None:
    if not torch.cuda.is_initialized():
        return
    used = 0
    try:
        used = torch.cuda.memory_reserved()
    except RuntimeError:
        pass
    detail = (f"PyTorch has already reserved {used} bytes of CUDA memory"
              if used else "PyTorch's CUDA state is already initialized")
    raise RuntimeError(
        f"vramkit.torch.install() must run before PyTorch allocates CUDA memory, but "
        f"{detail}, so its caching allocator can no longer be replaced. Call it at the "
        f"start of the program, before the first tensor or module is moved to CUDA.")


def backend() -> str | None:
    """Which path install() took: "backend" (the complete c10 backend), "pluggable" (the
    CUDAPluggableAllocator fallback), or None before install()."""
    return _path


def _chosen_path(requested: str | None) -> str | None:
    choice = requested or os.environ.get("VRAMKIT_TORCH_BACKEND") or None
    if choice is not None and choice not in _PATHS:
        # Blame what the user wrote: the argument, or else the variable.
        where = f"vramkit.torch.install(backend={choice!r})" if requested else \
            f"VRAMKIT_TORCH_BACKEND: {choice!r} is not a backend"
        raise ValueError(f"{where}: expected one of {', '.join(_PATHS)}")
    return choice


def install(device=None, backend: str | None = None, **options) -> str:
    """Make vramkit PyTorch's CUDA allocator. Call before PyTorch allocates CUDA memory.

    backend: "backend" (require the complete c10 backend), "pluggable" (the
    CUDAPluggableAllocator fallback), or None (default; $VRAMKIT_TORCH_BACKEND, else the
    backend where it builds, else the fallback, with a warning that says why).
    options are vramkit.configure()'s (source, limit, preallocate, release_threshold,
    tight_threshold, virtual_threshold, large_blocks); they configure the pool of `device` (default:
    every visible device) before first use. Returns the path taken. Raises vramkit.plug._torch_build.BuildError (a
    RuntimeError), leaving PyTorch's own allocator in place, if no path can be built; a
    PYTORCH_CUDA_ALLOC_CONF that PyTorch itself refuses raises PyTorch's own error first.
    """
    global _hooks, _allocator, _backend_lib, _path
    choice = _chosen_path(backend)
    if _allocator is not None:
        if options or (choice is not None and choice != _path):
            raise RuntimeError("vramkit.torch.install(): already installed "
                               f"({_path}); options can no longer change")
        return _path
    if not torch.cuda.is_available():
        raise RuntimeError("vramkit.torch.install(): PyTorch sees no CUDA device")
    _refuse_if_cuda_in_use()
    # PyTorch's own settings map onto vramkit's options, which those given here override;
    # one vramkit cannot serve at all stops here, before anything changes.
    options = {**torch_settings.from_environment(torch_settings.pytorch_parser_of(torch)),
               **options}
    fraction = options.pop(torch_settings.TORCH_FRACTION, None)
    reuse_in_capture = options.pop(torch_settings.TORCH_CAPTURE_REUSE, None)
    # Built (or found in the cache) before anything changes, so that a failure leaves
    # PyTorch exactly as it was.
    backend_path = None
    if choice != "pluggable":
        try:
            backend_path = _torch_build.backend_library()
        except _torch_build.BuildError as exc:
            if choice == "backend":
                raise
            warnings.warn(f"vramkit.torch: the complete backend could not be built, so "
                          f"PyTorch's memory tools and CUDA graph pools will not work under "
                          f"vramkit (falling back to CUDAPluggableAllocator): {exc}",
                          RuntimeWarning, stacklevel=2)
    path = None if backend_path else _torch_build.hook_library()

    if options:
        devices = ([device] if device is not None
                   else range(torch.cuda.device_count()))
        for d in devices:
            vramkit.configure(d, **options)

    lib = ctypes.CDLL(library_path())
    lib.vramkit_torch_last_oom_device.restype = ctypes.c_int
    lib.vramkit_torch_last_status.restype = ctypes.c_int
    lib.vramkit_torch_device_used.restype = ctypes.c_int
    lib.vramkit_torch_device_used.argtypes = [ctypes.c_int]
    if backend_path:
        native = ctypes.CDLL(backend_path)
        native.vramkit_torch_backend_install.restype = ctypes.c_int
        native.vramkit_torch_backend_install.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
        native.vramkit_torch_backend_last_status.restype = ctypes.c_int
        message = ctypes.create_string_buffer(4096)
        if native.vramkit_torch_backend_install(message, len(message)) != 0:
            raise RuntimeError(
                "vramkit.torch.install() must run before PyTorch allocates CUDA memory: "
                f"PyTorch refused to change its allocator ({message.value.decode()})")
        if fraction is not None:
            native.vramkit_torch_backend_set_fraction.argtypes = [ctypes.c_double]
            native.vramkit_torch_backend_set_fraction(fraction)
        native.vramkit_torch_backend_set_capture_reuse.argtypes = [ctypes.c_int]
        _hooks, _allocator, _backend_lib, _path = lib, native, native, "backend"
        if reuse_in_capture is not None:
            _set_capture_reuse(reuse_in_capture)
        _route_settings()
        return _path
    if reuse_in_capture:
        warnings.warn("vramkit.torch: graph_capture_record_stream_reuse has no effect under "
                      "the CUDAPluggableAllocator fallback, which serves no CUDA graph pools",
                      RuntimeWarning, stacklevel=2)
    allocator = torch.cuda.memory.CUDAPluggableAllocator(
        path, "vramkit_torch_malloc", "vramkit_torch_free_block")
    native = allocator.allocator()
    # Optional hooks: present in the PyTorch versions that have them, skipped elsewhere.
    for setter, fn in (("set_reset_fn", "vramkit_torch_empty_cache"),
                       ("set_memory_fraction_fn", "vramkit_torch_set_memory_fraction"),
                       ("set_record_stream_fn", "vramkit_torch_record_stream")):
        if hasattr(native, setter):
            getattr(native, setter)(_fn_addr(lib, fn))
    try:
        torch.cuda.memory.change_current_allocator(allocator)
    except RuntimeError as exc:
        raise RuntimeError(
            "vramkit.torch.install() must run before PyTorch allocates CUDA memory: "
            f"PyTorch refused to change its allocator ({exc})") from exc
    _hooks, _allocator, _path = lib, allocator, "pluggable"
    return _path


def _route_settings() -> None:
    """Later changes of PyTorch's allocator settings pass through torch_settings, which
    says what each does under vramkit."""
    c = torch._C
    if hasattr(c, "_accelerator_setAllocatorSettings"):
        c._accelerator_setAllocatorSettings = torch_settings.settings_hook(
            c._accelerator_setAllocatorSettings, _set_capture_reuse)
    if hasattr(c, "_cuda_cudaCachingAllocator_set_allocator_settings"):
        c._cuda_cudaCachingAllocator_set_allocator_settings = torch_settings.settings_hook(
            c._cuda_cudaCachingAllocator_set_allocator_settings, _set_capture_reuse)


def last_status() -> int:
    """Status code of the last failure inside the hooks or the backend's deleters (0 if
    none): frees cannot raise, so a refused one is kept here."""
    if _backend_lib is not None and _backend_lib.vramkit_torch_backend_last_status():
        return _backend_lib.vramkit_torch_backend_last_status()
    return _hooks.vramkit_torch_last_status() if _hooks is not None else 0


def _oom_count() -> int:
    hooks = _hooks
    if hooks is None:
        return 0
    return sum(vramkit.memory_stats(d)["num_ooms"] for d in range(torch.cuda.device_count())
               if hooks.vramkit_torch_device_used(d))


@contextlib.contextmanager
def oom_report():
    """Within this block, a torch.OutOfMemoryError raised by an allocation through vramkit
    gains ``exc.report``: vramkit's report (the text its message already ends with), for
    code that logs or inspects it apart from the message, and ``exc.oom_info``, its figures
    (vramkit.last_oom_info)."""
    before = _oom_count()
    try:
        yield
    except torch.OutOfMemoryError as exc:
        if _oom_count() != before:
            exc.report = vramkit.last_oom_report()
            exc.oom_info = vramkit.last_oom_info()
        raise


def _main(argv: list[str]) -> int:
    """python -m vramkit.torch build: build the fallback's hook library and the backend for
    this torch and print their paths (for container images: build where a compiler exists,
    then point VRAMKIT_TORCH_HOOKS and VRAMKIT_TORCH_BACKEND_LIB at the files or keep the
    cache directory)."""
    if argv[:1] != ["build"] or len(argv) != 1:
        print("usage: python -m vramkit.torch build", flush=True)
        return 2
    try:
        print(_torch_build.build())
        print(_torch_build.backend_library())
    except _torch_build.BuildError as exc:
        print(exc)
        return 1
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(_main(sys.argv[1:]))
