"""vramkit.torch: make vramkit PyTorch's CUDA allocator.

    import vramkit.torch
    vramkit.torch.install()          # before PyTorch allocates any CUDA memory

PyTorch then allocates through torch.cuda.memory.CUDAPluggableAllocator and vramkit's
hooks; torch.cuda.empty_cache(), torch.cuda.set_per_process_memory_fraction() and
Tensor.record_stream() reach vramkit. PyTorch's own memory_stats()/memory_summary() do not
work under a pluggable allocator: use vramkit.memory_stats() and vramkit.memory_summary(),
which see every PyTorch allocation (the hooks and vramkit._core share one libvramkit).

An allocation that cannot be served raises torch.OutOfMemoryError, as PyTorch's own
allocator does: its message starts "CUDA out of memory." and carries vramkit's report, and
the process and its CUDA context go on (free something and allocate again). Inside
``with vramkit.torch.oom_report():`` the exception also gains a ``.report`` attribute.
Raising needs a small C++ library built against the installed torch: install() builds it
once with the C++ compiler it finds and caches it (vramkit._torch_build says where and how;
``python -m vramkit.torch build`` builds it ahead, for images without a compiler).
"""

from __future__ import annotations

import contextlib
import ctypes

try:
    import torch
except ImportError as _exc:  # say what to install rather than "No module named torch"
    raise ImportError("vramkit.torch needs PyTorch: pip install torch "
                      "(or pip install 'vramkit[torch]')") from _exc

import vramkit

from . import _torch_build

_hooks = None  # ctypes.CDLL of libvramkit_torch once installed
_allocator = None  # the CUDAPluggableAllocator, kept alive for the life of the process


def library_path() -> str:
    """Path of the shared library holding the C side of the allocator hooks."""
    return _torch_build.c_hooks_path()


def _fn_addr(lib, name: str) -> int:
    return ctypes.cast(getattr(lib, name), ctypes.c_void_p).value


def installed() -> bool:
    """True once install() has made vramkit PyTorch's allocator."""
    return _allocator is not None


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


def install(device=None, **options) -> None:
    """Make vramkit PyTorch's CUDA allocator. Call before PyTorch allocates CUDA memory.

    options are vramkit.configure()'s (source, limit, preallocate, release_threshold,
    tight_threshold); they configure the pool of `device` (default: every visible device)
    before first use. Raises vramkit._torch_build.BuildError (a RuntimeError), leaving
    PyTorch's own allocator in place, if the hook library cannot be built.
    """
    global _hooks, _allocator
    if _allocator is not None:
        if options:
            raise RuntimeError("vramkit.torch.install(): already installed; options can no "
                               "longer change")
        return
    if not torch.cuda.is_available():
        raise RuntimeError("vramkit.torch.install(): PyTorch sees no CUDA device")
    _refuse_if_cuda_in_use()
    # Built (or found in the cache) before anything changes, so that a failure leaves
    # PyTorch exactly as it was.
    path = _torch_build.hook_library()

    if options:
        devices = ([device] if device is not None
                   else range(torch.cuda.device_count()))
        for d in devices:
            vramkit.configure(d, **options)

    lib = ctypes.CDLL(library_path())
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
    lib.vramkit_torch_last_oom_device.restype = ctypes.c_int
    lib.vramkit_torch_last_status.restype = ctypes.c_int
    lib.vramkit_torch_device_used.restype = ctypes.c_int
    lib.vramkit_torch_device_used.argtypes = [ctypes.c_int]
    _hooks, _allocator = lib, allocator


def last_status() -> int:
    """Status code of the last failure inside the hooks (0 if none)."""
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
    code that logs or inspects it apart from the message."""
    before = _oom_count()
    try:
        yield
    except torch.OutOfMemoryError as exc:
        if _oom_count() != before:
            exc.report = vramkit.last_oom_report()
        raise


def _main(argv: list[str]) -> int:
    """python -m vramkit.torch build: build the hook library for this torch and print its
    path (for container images: build where a compiler exists, then point
    VRAMKIT_TORCH_HOOKS at the file or keep the cache directory)."""
    if argv[:1] != ["build"] or len(argv) != 1:
        print("usage: python -m vramkit.torch build", flush=True)
        return 2
    try:
        print(_torch_build.build())
    except _torch_build.BuildError as exc:
        print(exc)
        return 1
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(_main(sys.argv[1:]))
